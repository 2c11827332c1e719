"""Every file rcdiag writes (reports, pictures, state files, JUnit and Markdown summaries, ``--sequences``) is
written here, so that each rule holds for all of them:

* **Never over an input.** The run's ``Ledger`` holds every file it reads (each reader adds its file before
  reading it: ``reads``) and every file it writes (each output flag adds its file when it is read: ``writes``),
  and compares each with the other side as it is added (the same real path, the same device and inode, a file
  inside an input directory or matched by an input glob): a clash is a ``ConfigError`` naming the flag and the
  input, before that input is read. Every write checks its file against the inputs once more.
* **Whole or not at all.** A regular file is written to a hidden temporary file beside it and renamed over it
  once complete (``os.replace``): a full disk or an abort leaves the previous file as it was, and no partial file.
  The temporary is removed on failure and on an abort (``remove_temporaries``; rcdiag.runtime.interrupts).
* **Only regular files are replaced.** A character device or a FIFO (``/dev/stdout``, ``/dev/null``, a named
  pipe) is written in place; anything else that is not a regular file (a block device, a socket) is refused.
* **Every write is checked**, flush and close included: a failure is an ``OutputError``, ``cannot write PATH:
  REASON`` (exit 2).
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import glob
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import rcdiag.runtime.interrupts as interrupts
from rcdiag.runtime.errors import ConfigError, OutputError

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
    _check_write(path)
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
    _check_write(path)
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
    _check_write(target)
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


INPUT = "the input {source}"
"""How an input is named in a refusal (``{source}``: its path as given); readers name theirs (``the rules file
{source}``)."""


@dataclass
class Ledger:
    """Every file one run reads and every file it writes, so that one rule holds for all of them: **no output is
    written over an input**. An input (a dump, a state, a rules file, pyproject.toml, a tokenizer, a baseline) is
    added by whatever reads it, before it reads it (``reads``); an output by the flag that names it, when the flag
    is read (``writes``). Each is compared with every file of the other side as it is added, so a clash is refused
    whichever comes second: output flags are read before any file is opened, so before that input is read.

    Two files clash when they are the same file (the same real path, so ``../`` spellings and symlinks count; or
    the same device and inode: a hard link), when the output is inside an input directory, or when an input glob
    matches it; remote URLs are compared as text. Two outputs naming one file are refused too."""

    inputs: list[tuple[str, str]] = field(default_factory=list)
    """(path as given, how to name it: ``INPUT``)."""
    outputs: list[tuple[str, str]] = field(default_factory=list)
    """(flag, path as given)."""

    def reads(self, path: str | Path, what: str = INPUT) -> None:
        source = str(path)
        if any(source == known for known, _ in self.inputs):
            return
        for flag, output in self.outputs:
            _refuse(flag, output, source, what)
        self.inputs.append((source, what))

    def writes(self, path: str | Path, flag: str) -> None:
        from rcdiag.io import storage

        output = str(path)
        key = _identity(storage.local_path(output))
        for known_flag, known in self.outputs:
            if _identity(storage.local_path(known)) == key:
                if _flag_name(known_flag) == _flag_name(flag):
                    return  # the same output named again (the CLI's flag, then the library's argument)
                raise ConfigError(
                    f"{flag} {output} names the same file as {known_flag}; give each output its own file."
                )
        for source, what in self.inputs:
            _refuse(flag, output, source, what)
        self.outputs.append((flag, output))

    def check_write(self, path: str | Path) -> None:
        """Before a write to ``path``: an ``OutputError`` if it is an input. An output added with ``writes`` was
        compared with every input already; any other path (a file no flag named) is compared now."""
        from rcdiag.io import storage

        local = storage.local_path(str(path))
        key = _identity(local)
        if storage.is_remote(local) or any(_identity(storage.local_path(known)) == key for _, known in self.outputs):
            return
        for source, what in self.inputs:
            clash = _clash(local, source, what)
            if clash:
                raise OutputError(str(path), f"it {clash}, which this run reads; rcdiag never writes over an input")


_ledger: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("rcdiag_ledger", default=None)


@contextlib.contextmanager
def ledger() -> Iterator[Ledger]:
    """The run's ledger: the one in use (the command line opens one per command, rcdiag.cli), else a new one for
    the block (a library call: ``rcdiag.analyze`` compares its own outputs with its inputs)."""
    current = _ledger.get()
    if current is not None:
        yield current
        return
    made = Ledger()
    token = _ledger.set(made)
    try:
        yield made
    finally:
        _ledger.reset(token)


def reads(*paths: str | Path | None, what: str = INPUT) -> None:
    """Add the files the run is about to read to its ledger (``None``: nothing; no ledger in use: nothing to
    compare with). A ``ConfigError`` when an output already named is one of them."""
    current = _ledger.get()
    for path in paths:
        if current is not None and path is not None:
            current.reads(path, what)


def writes(path: str | Path | None, flag: str) -> None:
    """Add a file the run will write (named by ``flag``) to its ledger; a ``ConfigError`` when it is an input
    already read or named, or another output's file."""
    current = _ledger.get()
    if current is not None and path is not None:
        current.writes(path, flag)


def refuse_inputs(outputs: Iterable[tuple[str, str | Path | None]], inputs: Iterable[str | Path | None]) -> None:
    """``ledger``'s rule for these outputs and inputs at once (a ``ConfigError`` on a clash), added to the ledger in
    use if there is one. Called before anything is read."""
    with ledger():
        for flag, path in outputs:
            writes(path, flag)
        reads(*inputs)


def _check_write(path: str | Path) -> None:
    current = _ledger.get()
    if current is not None:
        current.check_write(path)


def _flag_name(flag: str) -> str:
    """``--save-state`` and the library's ``save_state`` are one output."""
    return flag.lstrip("-").replace("_", "-")


def _refuse(flag: str, output: str, source: str, what: str) -> None:
    from rcdiag.io import storage

    local = storage.local_path(output)
    named = what.replace("{source}", source)
    if storage.is_remote(local):
        if storage.local_path(source).rstrip("/") == local.rstrip("/"):
            raise ConfigError(f"{flag} {output} is {named}; give another file name.")
        return
    clash = _clash(local, source, what)
    if clash:
        raise ConfigError(f"{flag} {output} {clash}; rcdiag never writes over an input: give another file name.")


def _identity(path: str) -> tuple[object, ...]:
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("file", info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else ("path", os.path.realpath(path))


def _clash(output: str, given: str, what: str = INPUT) -> str | None:
    """How ``output`` would write over the input ``given`` (named by ``what``), or ``None``: it would not."""
    from rcdiag.io import storage

    source = storage.local_path(given)
    if storage.is_remote(source):
        return None
    real = os.path.realpath(output)
    mine = _identity(output)
    if any(ch in source for ch in "*?[") and not os.path.exists(source):
        patterns = {os.path.realpath(source), os.path.abspath(source)}
        if any(fnmatch.fnmatch(path, p) for p in patterns for path in (real, os.path.abspath(output))):
            return f"is matched by the input glob {given}"
        files = glob.glob(source, recursive=True)
        if any(_identity(f) == mine for f in files):
            return f"is the same file as one matched by the input glob {given}"
        return None
    if os.path.isdir(source):
        root = os.path.realpath(source)
        if os.path.commonpath([real, root]) == root:
            return f"is inside the input directory {given}"
        if mine[0] == "file" and any(_identity(f) == mine for f in _files_under(source)):
            return f"is the same file (a hard link) as one inside the input directory {given}"
        return None
    named = what.replace("{source}", given)
    if real == os.path.realpath(source):
        through = os.path.abspath(output) != os.path.abspath(source)
        return f"is (through a symlink) {named}" if through else f"is {named}"
    if mine[0] == "file" and _identity(source) == mine:
        return f"is a hard link to {named}"
    return None


def _files_under(directory: str) -> Iterator[str]:
    for root, _, files in os.walk(directory):
        for name in files:
            yield os.path.join(root, name)
