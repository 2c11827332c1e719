"""Which files of a watched directory (or object-store prefix) are complete and not yet read.

A dump file is listed as every reader lists it (``rcdiag.io.paths.directory_files``: dump suffixes, natural order,
names starting with ``.`` or ``_`` never read), so DumpWriter's hidden temporary part is never seen: its final
name appears only once the part is whole (written, fsync'd, renamed). Any other writer may still be writing a file
under its final name; such a file is read once it has *settled*: its size and modification time unchanged over
``settle`` seconds (across polls, or by an mtime that old when first seen). Object-store uploads appear whole.

A file already read is never read again; when its stamp changes (rewritten, another inode under its name) or it
goes, ``poll`` says so (``FileChange``): the watch's counts then hold a version the directory no longer has.

The rank files of one rollout (``{rollout_id}_{rank}.pt``: Miles' ``--dump-details``, ``rcdiag.io.rank_files``)
are one unit: any of them reads the whole rollout, so the unit is read once, through its lowest rank, when every
rank file of it is complete and the rollout is whole (``whole``). A rank file that appears after its
rollout was read is a ``FileChange`` too (read ``None``): it is never read on its own, which would count the
rollout twice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rcdiag.io import storage
from rcdiag.io.dump_writer import PART
from rcdiag.io.paths import directory_files
from rcdiag.io.rank_files import rollout_files, unit_of
from rcdiag.io.storage import FilePath, RemotePath

DEFAULT_SETTLE = 2.0
"""Seconds a file written by another writer than DumpWriter must stay unchanged before it is read."""


@dataclass(frozen=True)
class FileStamp:
    """What a file is: its name below the watched root, size and modification time, and device and inode (local)."""

    name: str
    size: int
    mtime_ns: int
    inode: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "mtime_ns": self.mtime_ns, "inode": self.inode}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileStamp:
        inode = data.get("inode")
        return cls(str(data["name"]), int(data["size"]), int(data["mtime_ns"]), tuple(inode) if inode else None)


def root_of(location: str) -> FilePath:
    """The watched directory or prefix as a path the listing takes."""
    text = storage.local_path(location)
    return storage.parse(text) if storage.is_remote(text) else Path(text)


def stamp(root: FilePath, file: FilePath) -> FileStamp | None:
    """The file's stamp now; ``None`` when it has gone."""
    if isinstance(file, RemotePath):
        found = storage.file_info(file)
        if found.size is None:
            return None
        name = "/".join(file.parts[len(root.parts) :])
        return FileStamp(name, int(found.size), int(found.mtime_ns or 0))
    try:
        info = os.stat(file)
    except OSError:
        return None
    name = Path(file).relative_to(str(root)).as_posix()
    return FileStamp(name, info.st_size, info.st_mtime_ns, (info.st_dev, info.st_ino))


@dataclass(frozen=True)
class FileChange:
    """A file read earlier that is no longer what was read: ``now`` its stamp, ``None`` when it was deleted;
    ``read`` is ``None`` for a rank file that appeared after the watch read its rollout."""

    read: FileStamp | None
    now: FileStamp | None

    @property
    def name(self) -> str:
        stamp = self.read or self.now
        assert stamp is not None
        return stamp.name

    @property
    def what(self) -> str:
        """What differs, in words."""
        if self.read is None:
            return "appeared after its rollout was read"
        if self.now is None:
            return "deleted"
        said = []
        if self.read.inode is not None and self.now.inode is not None and self.read.inode != self.now.inode:
            said.append("another file under its name")
        if self.read.size != self.now.size:
            said.append(f"{self.read.size:,} -> {self.now.size:,} bytes")
        if self.read.mtime_ns != self.now.mtime_ns:
            said.append("modified")
        return ", ".join(said)


@dataclass(frozen=True)
class Ready:
    """A unit to read: ``file``, the one to open, and the stamps of every file it reads (``file``'s first): one
    file, or a rollout's rank files opened through the lowest rank."""

    file: FilePath
    stamps: tuple[FileStamp, ...]


class Member(NamedTuple):
    """A listed, unread rank file: its position in the listing, rank, path, stamp, and whether it is complete."""

    position: int
    rank: int
    file: FilePath
    stamp: FileStamp
    complete: bool


class Follower:
    """Lists the root at each ``poll`` and returns the complete units not yet consumed, in natural order."""

    def __init__(self, location: str, settle: float = DEFAULT_SETTLE) -> None:
        self.location = location
        self.root = root_of(location)
        self.settle = settle
        self.seen: dict[str, tuple[FileStamp, float]] = {}
        """Files waiting to settle: their stamp and when it was first seen unchanged (monotonic seconds)."""

    def listing(self) -> list[FilePath]:
        if isinstance(self.root, Path) and not self.root.is_dir():
            return []
        if isinstance(self.root, RemotePath) and not storage.is_dir(self.root):
            return []
        return directory_files(self.root)

    def poll(self, consumed: dict[str, FileStamp], final: bool = False) -> tuple[list[Ready], int, list[FileChange]]:
        """The units now complete and not in ``consumed`` (by name), how many files are still waiting (to settle,
        or for their rollout to be whole), and the consumed files whose stamp differs now or that are gone, with
        the rank files that appeared after their rollout was read (the caller says each once). ``final``: the
        directory is taken as it stands (``--once``), so a rollout is read once its rank files are complete."""
        ready: list[tuple[int, Ready]] = []
        changed: list[FileChange] = []
        listed: set[str] = set()
        rollouts: dict[tuple[str, int], list[Member]] = {}
        newest: dict[str, int] = {}
        waiting = 0
        now = time.monotonic()
        for position, file in enumerate(self.listing()):
            current = stamp(self.root, file)
            if current is None:
                continue
            listed.add(current.name)
            unit = unit_of(current.name)
            if unit is not None:
                newest[unit[0]] = max(newest.get(unit[0], unit[1]), unit[1])
            if current.name in consumed:
                if current != consumed[current.name]:
                    changed.append(FileChange(consumed[current.name], current))
                continue
            complete = self._complete(file, current, now)
            if unit is not None:
                rollouts.setdefault(unit[:2], []).append(Member(position, unit[2], file, current, complete))
            elif complete:
                ready.append((position, Ready(file, (current,))))
                self.seen.pop(current.name, None)
            else:
                waiting += 1
        changed += [FileChange(read, None) for name, read in consumed.items() if name not in listed]
        if rollouts:
            read = read_rollouts(consumed)
            for key, members in rollouts.items():
                if key in read:  # never read alone: it would count its rollout twice
                    changed += [FileChange(None, m.stamp) for m in members]
                elif all(m.complete for m in members) and (final or whole(key, members, read, newest)):
                    members.sort(key=lambda m: m.rank)
                    for m in members:
                        self.seen.pop(m.stamp.name, None)
                    first = min(m.position for m in members)
                    ready.append((first, Ready(members[0].file, tuple(m.stamp for m in members))))
                else:
                    waiting += len(members)
        return [unit for _, unit in sorted(ready, key=lambda r: r[0])], waiting, changed

    def unchanged(self, unit: Ready) -> bool:
        """Whether the files ``unit`` read (checked after the read) are still those it was listed with: for a
        rollout, the same rank files (one that appeared meanwhile was read too); local files, the same stamps."""
        files: list[FilePath] = [unit.file]
        if unit_of(unit.stamps[0].name) is not None:
            files = [root_of(name) for name in rollout_files(unit.file)]
            if len(files) != len(unit.stamps):
                return False
        if isinstance(unit.file, RemotePath):
            return True  # uploads appear whole
        now = {each.name: each for file in files if (each := stamp(self.root, file)) is not None}
        return now == {each.name: each for each in unit.stamps}

    def _complete(self, file: FilePath, current: FileStamp, now: float) -> bool:
        if isinstance(file, RemotePath) or self.settle <= 0 or PART.match(file.name):
            return True  # an upload, or DumpWriter's rename: whole when visible
        age = time.time() - current.mtime_ns / 1e9
        if age >= self.settle:
            return True
        before = self.seen.get(current.name)
        if before is None or before[0] != current:
            self.seen[current.name] = (current, now)
            return False
        return now - before[1] >= self.settle


def read_rollouts(consumed: dict[str, FileStamp]) -> dict[tuple[str, int], set[int]]:
    """The rollouts read (by directory and rollout id), with their ranks."""
    out: dict[tuple[str, int], set[int]] = {}
    for name in consumed:
        unit = unit_of(name)
        if unit is not None:
            out.setdefault(unit[:2], set()).add(unit[2])
    return out


def whole(
    key: tuple[str, int], members: list[Member], read: dict[tuple[str, int], set[int]], newest: dict[str, int]
) -> bool:
    """Whether every rank file of a live rollout is there: a later rollout's file is listed in its directory
    (each rank saves its file after the rollout's training step and before the next, whose collectives need every
    rank: ``miles/backends/megatron_utils/actor.py:587`` at Miles 31f1ca96), or it holds every rank the latest
    rollout read in its directory held (the ranks of a run do not change)."""
    directory, rollout_id = key
    if newest.get(directory, rollout_id) > rollout_id:
        return True
    earlier = [r for d, r in read if d == directory]
    return bool(earlier) and {m.rank for m in members} >= read[(directory, max(earlier))]
