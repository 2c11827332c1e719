"""Every file rcdiag writes (reports, pictures, state files, JUnit and Markdown summaries, ``--sequences``) is
written here, so that each rule holds for all of them:

* **Never over an input.** ``refuse_inputs`` compares every output path with every input (the same real path,
  the same device and inode, a file inside an input directory or matched by an input glob) before anything is
  read; a clash is a ``ConfigError`` naming the flag and the input.
* **Whole or not at all.** A regular file is written to a hidden temporary file beside it and renamed over it
  once complete (``os.replace``): a full disk or an abort leaves the previous file as it was, and no partial file.
  The temporary is removed on failure and on an abort (``remove_temporaries``; rcdiag.interrupts).
* **Only regular files are replaced.** A character device or a FIFO (``/dev/stdout``, ``/dev/null``, a named
  pipe) is written in place; anything else that is not a regular file (a block device, a socket) is refused.
* **Every write is checked**, flush and close included: a failure is an ``OutputError``, ``cannot write PATH:
  REASON`` (exit 2).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import rcdiag.interrupts as interrupts
from rcdiag.errors import ConfigError, OutputError

STATE_MODE = 0o600
"""State files hold what was read (paths, metadata): readable by their owner only."""

_temporaries: set[Path] = set()
"""Temporary files and directories of writes in progress (removed on failure and on an abort)."""


def remove_temporaries() -> None:
    """Remove every temporary file and directory of a write still in progress (an abort's cleanup)."""
    for path in list(_temporaries):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        _temporaries.discard(path)


def check_destination(path: Path, flag: str) -> None:
    """``path`` can be written: it is a regular file, a character device or a FIFO, or does not exist yet in an
    existing, writable directory. Anything else is a ``ConfigError`` naming ``flag``."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name.")
    kind = _kind(path)
    if kind == "other":
        raise ConfigError(f"{flag} {path}: is not a regular file, a character device or a FIFO; give a file name.")
    parent = path.parent
    if kind == "missing" and not parent.is_dir():
        raise ConfigError(f"{flag} {path}: the directory {parent} does not exist.")
    if not os.access(path if kind != "missing" else parent, os.W_OK):
        raise ConfigError(f"{flag} {path}: cannot be written (permission denied).")


def _in_place(path: Path) -> bool:
    """Written in place: a character device or FIFO, and any path under /dev or /proc (``-o /dev/stdout``, which
    may stand for a pipe or for the file a shell redirected it to)."""
    return _kind(path) == "stream" or (path.is_absolute() and path.parts[1:2] in (("dev",), ("proc",)))


def _kind(path: Path) -> str:
    """``regular``, ``stream`` (a character device or FIFO: written in place), ``missing`` or ``other``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "other"
    if stat.S_ISREG(mode):
        return "regular"
    return "stream" if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) else "other"


def write_file(path: str | Path, data: bytes | str, *, mode: int | None = None, append: bool = False) -> int:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all; return the bytes written.

    ``mode``: the permissions of a new file (default: the existing file's, else 0666 less the umask). ``append``
    adds to a regular file in place (``$GITHUB_STEP_SUMMARY``); a failed append is cut back to the old size."""
    interrupts.check()  # nothing is written after a signal, even one whose exception was swallowed
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target = Path(os.path.realpath(path))  # through a symlink to its file: the link stays a link
    if _in_place(Path(path)):
        _write_in_place(Path(path), payload, str(path))
    elif append and target.exists():
        _append(target, payload, str(path))
    else:
        with replacing(path, mode=mode) as temporary:
            _write_in_place(temporary, payload, str(path), durable=True)
    return len(payload)


def _write_in_place(target: Path, payload: bytes, shown: str, *, durable: bool = False) -> None:
    """Write and close, checked; ``durable``: on the disk (fsync) before the rename makes it visible."""
    try:
        with open(target, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
    except OSError as exc:
        raise OutputError(shown, exc.strerror or str(exc)) from None


def _append(target: Path, payload: bytes, shown: str) -> None:
    size = target.stat().st_size
    try:
        with open(target, "ab") as handle:
            handle.write(payload)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.truncate(target, size)
        if isinstance(exc, OSError):
            raise OutputError(shown, exc.strerror or str(exc)) from None
        raise


@contextlib.contextmanager
def replacing(path: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to (a writer that wants a file name: polars); on a
    normal exit it becomes ``path`` (renamed over a regular file, copied into a device or FIFO), on an exception
    it is removed and ``path`` is left as it was. An ``OSError`` is an ``OutputError`` naming ``path``."""
    interrupts.check()
    stream = _in_place(Path(path))
    target = Path(path) if stream else Path(os.path.realpath(path))
    directory = Path(tempfile.gettempdir()) if stream else target.parent
    try:
        handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".rcdiag-tmp", dir=directory)
    except OSError as exc:
        raise OutputError(path, exc.strerror or str(exc)) from None
    temporary = Path(name)
    _temporaries.add(temporary)
    try:
        os.close(handle)
        yield temporary
        if stream:
            with open(temporary, "rb") as source, open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
        else:
            os.chmod(temporary, mode if mode is not None else _mode_for(target))
            os.replace(temporary, target)
    except OSError as exc:
        raise OutputError(path, exc.strerror or str(exc)) from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
        _temporaries.discard(temporary)


def temporary_directory(target: str | Path, prefix: str) -> Path:
    """A scratch directory beside ``target`` (the same disk), removed by ``remove_directory`` or on an abort."""
    try:
        made = Path(tempfile.mkdtemp(prefix=prefix, dir=Path(os.path.realpath(target)).parent))
    except OSError as exc:
        raise OutputError(target, exc.strerror or str(exc)) from None
    _temporaries.add(made)
    return made


def remove_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    _temporaries.discard(directory)


def _mode_for(target: Path) -> int:
    """A replaced file keeps its permissions; a new one gets 0666 less the umask, as ``open`` would give it."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(target).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def refuse_inputs(outputs: Iterable[tuple[str, str | Path | None]], inputs: Iterable[str | Path | None]) -> None:
    """A ``ConfigError`` when an output (``(flag, path)``) would write over an input: the same file (real path, or
    device and inode: a hard link), a file inside an input directory, or a path an input glob matches; also when
    two outputs name one file. Remote URLs are compared as text. Called before anything is read."""
    from rcdiag.io import storage

    named = [(flag, str(path)) for flag, path in outputs if path is not None]
    sources = [str(source) for source in inputs if source is not None]
    for flag, text in named:
        local = storage.local_path(text)
        if storage.is_remote(local):
            for source in sources:
                if storage.local_path(source).rstrip("/") == local.rstrip("/"):
                    raise ConfigError(f"{flag} {text} is the input {source}; give another file name.")
            continue
        for source in sources:
            clash = _clash(local, storage.local_path(source))
            if clash:
                raise ConfigError(
                    f"{flag} {text} {clash} {source}; rcdiag never writes over an input: give another file name."
                )
    seen: dict[tuple[object, ...], str] = {}
    for flag, text in named:
        key = _identity(storage.local_path(text))
        if key in seen:
            raise ConfigError(f"{flag} {text} names the same file as {seen[key]}; give each output its own file.")
        seen[key] = flag


def _identity(path: str) -> tuple[object, ...]:
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("file", info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else ("path", os.path.realpath(path))


def _clash(output: str, source: str) -> str | None:
    """How ``output`` would write over the input ``source`` (``None``: it would not)."""
    from rcdiag.io import storage

    if storage.is_remote(source):
        return None
    real = os.path.realpath(output)
    mine = _identity(output)
    if any(ch in source for ch in "*?[") and not os.path.exists(source):
        patterns = {os.path.realpath(source), os.path.abspath(source)}
        if any(fnmatch.fnmatch(path, p) for p in patterns for path in (real, os.path.abspath(output))):
            return "is matched by the input glob"
        files = glob.glob(source, recursive=True)
        return "is the same file as one matched by the input glob" if any(_identity(f) == mine for f in files) else None
    if os.path.isdir(source):
        root = os.path.realpath(source)
        if os.path.commonpath([real, root]) == root:
            return "is inside the input directory"
        if mine[0] == "file" and any(_identity(f) == mine for f in _files_under(source)):
            return "is the same file (a hard link) as one inside the input directory"
        return None
    if real == os.path.realpath(source) or (mine[0] == "file" and _identity(source) == mine):
        return "is the input"
    return None


def _files_under(directory: str) -> Iterator[str]:
    for root, _, files in os.walk(directory):
        for name in files:
            yield os.path.join(root, name)
