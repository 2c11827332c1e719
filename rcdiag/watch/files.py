"""Which files of a watched directory (or object-store prefix) are complete and not yet read.

A dump file is listed as every reader lists it (``rcdiag.io.paths.directory_files``: dump suffixes, natural order,
names starting with ``.`` or ``_`` never read), so DumpWriter's hidden temporary part is never seen: its final
name appears only once the part is whole (written, fsync'd, renamed). Any other writer may still be writing a file
under its final name; such a file is read once it has *settled*: its size and modification time unchanged over
``settle`` seconds (across polls, or by an mtime that old when first seen). Object-store uploads appear whole.

A file already read is never read again; when its stamp changes (rewritten, another inode under its name) or it
goes, ``poll`` says so (``FileChange``): the watch's counts then hold a version the directory no longer has.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcdiag.io import storage
from rcdiag.io.paths import directory_files
from rcdiag.io.storage import FilePath, RemotePath
from rcdiag.writer import PART

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
    """A file read earlier that is no longer what was read: ``now`` its stamp, ``None`` when it was deleted."""

    read: FileStamp
    now: FileStamp | None

    @property
    def what(self) -> str:
        """What differs, in words."""
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


class Follower:
    """Lists the root at each ``poll`` and returns the complete files not yet consumed, in natural order."""

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

    def poll(self, consumed: dict[str, FileStamp]) -> tuple[list[tuple[FilePath, FileStamp]], int, list[FileChange]]:
        """The files now complete and not in ``consumed`` (by name), how many are still settling, and the consumed
        files whose stamp differs now or that are gone (the caller says so once)."""
        ready: list[tuple[FilePath, FileStamp]] = []
        changed: list[FileChange] = []
        listed: set[str] = set()
        waiting = 0
        now = time.monotonic()
        for file in self.listing():
            current = stamp(self.root, file)
            if current is None:
                continue
            listed.add(current.name)
            if current.name in consumed:
                if current != consumed[current.name]:
                    changed.append(FileChange(consumed[current.name], current))
                continue
            if self._complete(file, current, now):
                ready.append((file, current))
                self.seen.pop(current.name, None)
            else:
                waiting += 1
        changed += [FileChange(read, None) for name, read in consumed.items() if name not in listed]
        return ready, waiting, changed

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
