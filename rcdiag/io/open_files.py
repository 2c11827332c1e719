"""The process's limit on open files, raised (up to the hard limit) before a read that needs many at once.

A directory of shards keeps each file open while reading (its footer and schema are read once, up front), and the
long layout keeps one spill file per bucket open; ``ulimit -n`` is often 1,024. Rather than fail on the 1,021st
file, rcdiag raises its own soft limit to what the read needs when the hard limit allows, and otherwise stops
before opening anything, saying how many files it needs and how to allow them.
"""

from __future__ import annotations

import os

from rcdiag.runtime.errors import InputError

RESERVE = 32
"""Descriptors kept free for everything else (the interpreter, libraries, outputs)."""


def in_use() -> int:
    """Open descriptors now (0 where the system does not say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def room() -> int | None:
    """How many more files this process could open once its soft limit is raised to the hard one (``None``: no
    limit known)."""
    try:
        import resource
    except ImportError:
        return None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return None if hard == resource.RLIM_INFINITY else max(hard - in_use() - RESERVE, 0)


def ensure_open_files(needed: int, what: str, path: str, hint: str = "") -> None:
    """Make room for ``needed`` more open files (``what`` says which), or ``InputError`` saying how to (``hint``:
    what else would do)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = in_use() + needed + RESERVE
    if soft == resource.RLIM_INFINITY or want <= soft:
        return
    if hard == resource.RLIM_INFINITY or want <= hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return
        except (ValueError, OSError):
            pass
    raise InputError(
        f"needs {needed:,} files open at once ({what}) but the limit on open files is {soft:,} (hard limit "
        f"{'unlimited' if hard == resource.RLIM_INFINITY else f'{hard:,}'}); raise it, e.g. 'ulimit -n {want}' "
        f"in the shell that runs rcdiag{hint or ', or read fewer files at a time (a narrower glob or directory)'}",
        path=path,
    )
