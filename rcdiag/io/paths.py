"""Everything that touches the file system by name: globs, directories, first bytes, a file's identity.

Kept in one place so that a location is a branch here, not in every reader: a plain path or ``file://`` URL is the
local disk; ``s3://``, ``gs://``, ``hdfs://`` (and fsspec's schemes) go through ``rcdiag.io.storage``. Files are
listed in natural order (``step_2`` before ``step_10``), so results and errors are reproducible;
names starting with ``.`` or ``_`` (temporary and marker files, e.g. a half-written DumpWriter part or
``_SUCCESS``) are never read. A local file is read once however many names reach it (a symlink, a hard link, a
glob through a linked directory), and a glob never follows a link back into a directory it is already inside: each
is said in a ``rcdiag.runtime.notices.Notice`` (a ``rcdiag: note:`` line).
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat as stat_mode
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

from rcdiag.io import registry, storage
from rcdiag.io.storage import FilePath, RemotePath
from rcdiag.runtime.errors import InputError

GLOB_CHARS = "*?["

T = TypeVar("T")
R = TypeVar("R")


def natural_key(path: str | FilePath) -> list:
    """Sort key that orders digit runs by value."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def is_hidden(path: FilePath, root: Path | None = None) -> bool:
    """Temporary or marker files: any path component below ``root`` starting with ``.`` or ``_``."""
    parts = path.relative_to(root).parts if root is not None and isinstance(path, Path) else (path.name,)
    return any(part.startswith((".", "_")) for part in parts)


EMPTY_PATH = "the path is empty (an unset shell variable?); give a file, directory, glob or URL"
"""An empty name would be read as the current directory (``Path("")`` is ``.``): refused instead."""


def refuse_empty(path: str | Path) -> None:
    """``EMPTY_PATH`` as an ``InputError`` when ``path`` is empty or blank (a ``Path`` never is: ``Path("")`` is
    ``.``, which names the directory on purpose)."""
    if isinstance(path, str) and not path.strip():
        raise InputError(EMPTY_PATH)


def expand(path: str | Path) -> list[FilePath]:
    """The files a dump path names: a file, a directory or prefix (read recursively) or a glob."""
    refuse_empty(path)
    text = storage.local_path(str(path))
    if storage.is_remote(text):
        return _expand_remote(text)
    files = glob_files(text)
    if files is not None:
        return distinct_files(files)
    p = Path(text)
    if not stat_mode.S_ISDIR(regular_file(text, "a dump file, a directory or a glob", directory=True).st_mode):
        return [p]
    found = directory_files(p)
    if not found:
        left = left_out(p, [])
        said = f"; {describe_left_out('', left)}" if left else ""
        raise InputError(f"is a directory without dump files ({', '.join(registry.suffixes())}){said}", path=text)
    note_left_out(text, p, found)
    return distinct_files(found)


_KINDS = (
    (stat_mode.S_ISDIR, "a directory"),
    (stat_mode.S_ISFIFO, "a FIFO"),
    (stat_mode.S_ISSOCK, "a socket"),
    (stat_mode.S_ISCHR, "a character device"),
    (stat_mode.S_ISBLK, "a block device"),
)


def not_regular(name: str | Path, *, directory: bool = False) -> tuple[str, os.stat_result | None]:
    """Why the local ``name`` cannot be read as a file, by ``os.stat`` alone (it is never opened: opening a FIFO
    blocks until a writer comes, inside C code that no signal interrupts, and a device may never end), and its
    stat; ``""`` for a regular file (or a directory, with ``directory``). A name that does not exist gives
    ``"file not found"``, a symlink to nothing ``"a dangling symlink to TARGET"``."""
    try:
        info = os.stat(name)
    except FileNotFoundError:
        if os.path.islink(name):
            return f"a dangling symlink to {os.readlink(name)}", None
        return "file not found", None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})", None
    if stat_mode.S_ISREG(info.st_mode) or (directory and stat_mode.S_ISDIR(info.st_mode)):
        return "", info
    kind = next((text for test, text in _KINDS if test(info.st_mode)), "a special file")
    return f"{kind}, not a regular file", info


def regular_file(name: str | Path, what: str = "", *, directory: bool = False) -> os.stat_result:
    """The ``os.stat`` of a local file about to be opened for reading, refused (``InputError``, naming the file and
    what it is) unless it is a regular file (or, with ``directory``, a directory); ``what`` says what to give
    instead. Every local file rcdiag reads passes here before it is opened: the openers below, the state, rules
    and tokenizer loaders."""
    why, info = not_regular(name, directory=directory)
    if info is not None and not why:
        return info
    if why == "file not found" or why.startswith("cannot be read"):
        raise InputError(why, path=str(name))
    give = f"; give {what}" if what and info is not None else ""
    raise InputError(f"is {why}{give}", path=str(name))


def notice(text: str) -> None:
    """Tell the user something about the input that is not an error (the CLI prints ``rcdiag: note: TEXT``)."""
    from rcdiag.runtime.notices import notify

    notify(f"note: {text}")


def distinct_files(files: Sequence[FilePath]) -> list[FilePath]:
    """``files`` with each local file (device and inode) kept once, at its first name; each left out is noted."""
    first: dict[tuple[int, int], FilePath] = {}
    kept: list[FilePath] = []
    for file in files:
        try:
            stat = os.stat(file) if isinstance(file, Path) else None
        except OSError:
            stat = None
        key = None if stat is None else (stat.st_dev, stat.st_ino)
        if key is not None and key in first:
            notice(f"{file} is the same file as {first[key]} (a link); it is read once, as {first[key]}")
            continue
        if key is not None:
            first[key] = file
        kept.append(file)
    return kept


def _expand_remote(url: str) -> list[FilePath]:
    from pyarrow.fs import FileType

    path = storage.parse(url)
    if any(ch in path.key for ch in GLOB_CHARS):
        files: list[FilePath] = sorted(storage.glob(path), key=natural_key)
        files = [f for f in files if not is_hidden(f)]
        if not files:
            raise InputError("matches no file", path=url)
        return list(files)
    kind = storage.file_info(path).type
    if kind == FileType.File:
        return [path]
    if kind == FileType.NotFound:
        raise storage.missing(path)
    files = directory_files(path)
    if not files:
        raise InputError(f"is a prefix without dump files ({', '.join(registry.suffixes())})", path=url)
    note_left_out(url, path, files)
    return files


def state_files(path: str) -> list[str]:
    """The state files one ``merge`` argument names: itself, or the ``.json`` files of a directory, prefix or
    glob (a URL's glob cannot be left to the shell)."""
    refuse_empty(path)
    text = storage.local_path(path)
    remote = storage.is_remote(text)
    is_glob = any(ch in text for ch in GLOB_CHARS)
    if remote and not is_glob and storage.is_dir(storage.parse(text)):
        files: list[FilePath] = list_files(storage.parse(text), (".json",))
    elif not remote and not is_glob and Path(text).is_dir():
        files = list_files(Path(text), (".json",))
        special = special_entries(Path(text))
        if special:
            from rcdiag.runtime.notices import notify

            notify(describe_left_out(text, special))
    elif is_glob:
        files = _expand_remote(text) if remote else [*(glob_files(text) or [Path(text)])]
    else:
        return [path]
    if not files:
        raise InputError("holds no state files (.json)", path=path)
    return [str(f) for f in files]


def special_entries(root: Path) -> list[tuple[str, str]]:
    """Entries under ``root`` that no listing reads because they are neither a regular file nor a directory (a
    FIFO, a socket, a device, a dangling symlink), as (path below ``root``, what it is), in natural order."""
    found = [(p.relative_to(root).as_posix(), not_regular(p)[0]) for p in root.rglob("*") if not p.is_dir()]
    return sorted(((below, why) for below, why in found if why), key=lambda item: natural_key(item[0]))


def _is_dir(path: FilePath) -> bool:
    return storage.is_dir(path) if isinstance(path, RemotePath) else path.is_dir()


def directory_files(root: FilePath) -> list[FilePath]:
    """A format's run directory holds its dumps in ``run_dir`` (prime-rl's ``token_exports``); any other directory
    is read whole, recursively."""
    for fmt in registry.FORMATS:
        if fmt.run_dir is not None:
            found = root if root.name == fmt.run_dir else root / fmt.run_dir
            if _is_dir(found):
                return list_files(found, fmt.suffixes)
    return list_files(root, registry.suffixes())


def glob_files(pattern: str) -> list[Path] | None:
    """The files a glob matches (natural order), or ``None`` when ``pattern`` names an existing path or is no glob."""
    if Path(pattern).exists() or not any(ch in pattern for ch in GLOB_CHARS):
        return None
    found = [f for f in _Glob().matches(pattern) if not is_hidden(f)]
    files = sorted((f for f in found if f.is_file()), key=natural_key)
    special = [(str(f), not_regular(f)[0]) for f in found if not f.is_file() and not f.is_dir()]
    special.sort(key=lambda item: natural_key(item[0]))
    if not files:
        raise InputError("matches no file" + (f"; {describe_left_out('', special)}" if special else ""), path=pattern)
    if special:
        from rcdiag.runtime.notices import notify

        notify(describe_left_out(pattern, special))
    return files


class _Glob:
    """A local glob as ``glob.glob(pattern, recursive=True)`` reads it (``**`` any number of directories, links to
    directories followed, names starting with ``.`` matched only by a pattern that starts with ``.``), except that
    ``**`` enters each directory (device and inode) once: a link back into a directory it is already inside (a
    symlink loop) is noted and not followed, so ``loop -> .`` neither repeats files nor, with two such links,
    takes exponential time."""

    def __init__(self) -> None:
        self.entered: set[tuple[int, int, int]] = set()

    def matches(self, pattern: str) -> Iterator[Path]:
        parts = Path(pattern).parts
        fixed = next(i for i, part in enumerate(parts) if any(ch in part for ch in GLOB_CHARS))
        base = Path(*parts[:fixed]) if fixed else Path()
        yield from self._match(base, parts[fixed:], ())

    def _match(self, base: Path, rest: tuple[str, ...], inside: tuple[tuple[int, int], ...]) -> Iterator[Path]:
        if not rest:
            yield base
            return
        head, tail = rest[0], rest[1:]
        if head == "**":
            yield from self._match(base, tail, inside)
            key = _dir_key(base)
            if key is None:
                return
            for child in _children(base, "*"):
                child_key = _dir_key(child)
                if child_key is None:
                    continue
                if child_key in inside or child_key == key:
                    notice(
                        f"{child} is a link back into a directory the glob is already inside (a symlink loop); "
                        "not followed"
                    )
                    continue
                if (*child_key, len(rest)) in self.entered:
                    notice(f"{child} is a second way into a directory the glob has already read; not read again")
                    continue
                self.entered.add((*child_key, len(rest)))
                yield from self._match(child, rest, (*inside, key))
        elif any(ch in head for ch in GLOB_CHARS):
            for child in _children(base, head):
                yield from self._match(child, tail, inside)
        elif (tail == () or (base / head).is_dir()) and os.path.lexists(base / head):
            yield from self._match(base / head, tail, inside)


def _dir_key(path: Path) -> tuple[int, int] | None:
    """A directory's identity (device, inode), following links; ``None`` for anything else."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino) if stat_mode.S_ISDIR(found.st_mode) else None


def _children(directory: Path, pattern: str) -> list[Path]:
    """Entries of ``directory`` whose names match ``pattern`` (hidden names only for a pattern starting with ``.``)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    hidden = pattern.startswith(".")
    return [
        directory / name
        for name in names
        if (hidden or not name.startswith(".")) and fnmatch.fnmatchcase(name, pattern)
    ]


def list_files(root: FilePath, suffixes: tuple[str, ...]) -> list[FilePath]:
    """Files under ``root`` (recursively) with one of ``suffixes``, hidden ones left out, in natural order."""
    if isinstance(root, RemotePath):
        listed = storage.listing(root)
        remote = [p for p, below in listed if p.suffix.lower() in suffixes and not _hidden_parts(below)]
        return sorted(remote, key=natural_key)
    found = [p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes and not is_hidden(p, root)]
    return sorted(found, key=natural_key)


LEFT_OUT_NAMED = 5
"""A notice of files left out names this many; the rest are counted."""


def note_left_out(label: str, root: FilePath, kept: Sequence[FilePath]) -> None:
    """Say (a ``Notice``) which files under the directory or prefix ``root`` are not read, and why: nothing is
    left out silently."""
    from rcdiag.runtime.notices import notify

    left = left_out(root, kept)
    if left:
        notify(describe_left_out(label, left))


def left_out(root: FilePath, kept: Sequence[FilePath]) -> list[tuple[str, str]]:
    """Files under ``root`` that are not in ``kept``, as (path below ``root``, why), in natural order."""
    read = {str(f) for f in kept}
    if isinstance(root, RemotePath):
        listed = [(str(p), "/".join(below)) for p, below in storage.listing(root)]
    else:  # every entry but a directory: a FIFO, a socket, a device or a dangling symlink is named too
        listed = [(str(p), p.relative_to(root).as_posix()) for p in root.rglob("*") if not p.is_dir()]
    suffixes = registry.suffixes()
    left = []
    for full, below in sorted(listed, key=lambda item: natural_key(Path(item[1]))):
        if full in read:
            continue
        suffix = Path(below).suffix.lower()
        special = "" if isinstance(root, RemotePath) else not_regular(full)[0]
        if special:
            why = special
        elif _hidden_parts(tuple(below.split("/"))):
            why = "hidden: a name starts with '.' or '_'"
        elif suffix not in suffixes:
            why = f"'{suffix}' is not a dump suffix" if suffix else "no dump suffix"
        else:
            why = "outside the run's dump directory"
        left.append((below, why))
    return left


def describe_left_out(label: str, left: Sequence[tuple[str, str]]) -> str:
    """One line: how many files were left out, the first few with why."""
    named = ", ".join(f"{name} ({why})" for name, why in left[:LEFT_OUT_NAMED])
    more = f" and {len(left) - LEFT_OUT_NAMED} more" if len(left) > LEFT_OUT_NAMED else ""
    return f"{f'{label}: ' if label else ''}left out {len(left)} file{'s' if len(left) != 1 else ''}: {named}{more}"


def _hidden_parts(parts: tuple[str, ...]) -> bool:
    return any(part.startswith((".", "_")) for part in parts)


def open_input(path: str | FilePath) -> IO[bytes] | Any:
    """A seekable binary file: the local file, or a random-access file over the object (reads fetch ranges)."""
    text = storage.local_path(str(path))
    if storage.is_remote(text):
        return storage.open_input(storage.parse(text))
    regular_file(text)
    return open(text, "rb")


def arrow_input(path: str) -> Any:
    """A pyarrow file to read Arrow data from: a local file or an object in storage. Never a memory map: a mapped
    file truncated while it is read kills the process with SIGBUS; a read past its end is an error."""
    import pyarrow as pa

    text = storage.local_path(path)
    if storage.is_remote(text):
        return storage.open_input(storage.parse(text))
    regular_file(text)
    return pa.OSFile(text)


REMOTE_OPENERS = 16
"""Objects in storage are opened (footer, size) this many at a time: each open waits on round trips."""


def map_files(function: Callable[[T], R], files: Sequence[T]) -> list[R]:
    """``function`` over ``files`` in order; in object storage on a thread pool (a prefix of 1,000 shards opens in
    seconds, not minutes). The first file's error in order is the one raised, as when reading one by one."""
    if len(files) < 2 or not (isinstance(files[0], RemotePath) or storage.is_remote(str(files[0]))):
        return [function(f) for f in files]
    with ThreadPoolExecutor(max_workers=REMOTE_OPENERS, thread_name_prefix="rcdiag-open") as pool:
        return list(pool.map(function, files))


def read_buffer(path: str, local: int) -> int:
    """The read buffer for ``path``: ``local`` on disk, ``storage.READ_BUFFER`` in object storage."""
    return storage.READ_BUFFER if storage.is_remote(storage.local_path(path)) else local


def open_text(path: str) -> IO[str]:
    """A UTF-8 text file, local or in object storage (read through a buffer)."""
    text = storage.local_path(path)
    if storage.is_remote(text):
        return storage.open_text(storage.parse(text))
    regular_file(text)
    return open(text, encoding="utf-8")


def read_bytes(path: str | Path) -> bytes:
    """A small file whole (a state file), local or in object storage."""
    text = storage.local_path(str(path))
    if storage.is_remote(text):
        remote = storage.parse(text)
        if storage.file_info(remote).type.name == "NotFound":
            raise storage.missing(remote)
        return storage.read_bytes(remote)
    regular_file(text)
    return Path(text).read_bytes()


def read_head(path: FilePath, size: int = 8) -> bytes:
    """The first bytes of a file."""
    if isinstance(path, RemotePath):
        with storage.open_input(path) as handle:
            return handle.read(size)
    regular_file(path)
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror})", path=str(path)) from None


def identity(path: str) -> dict[str, object]:
    """What makes a read file the same file: absolute path (or URL), size and modification time (``merge`` compares
    it)."""
    text = storage.local_path(path)
    if storage.is_remote(text):
        return storage.identity(storage.parse(text))
    stat = os.stat(text)
    return {"path": str(Path(path).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
