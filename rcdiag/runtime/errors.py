"""Errors and exit codes.

Every error a user can cause is an ``RcdiagError`` whose message is one line that names the thing at fault
(file, row, column, option) and, where we know it, the fix. The CLI prints that line and exits with the
error's code; it never shows a traceback for these.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes shared by every command (documented in docs/exit-codes.md)."""

    OK = 0
    """The command ran; findings, however severe, do not change the code of ``analyze``."""
    CHECK_FAILED = 1
    """``rcdiag check``: a rule failed, or a finding fails ``--fail-on``; ``rcdiag watch``: a new alert at
    ``--exit-on``."""
    USAGE = 2
    """Bad option, bad configuration, or bad input file."""
    INTERNAL = 3
    """A bug in rcdiag."""
    ABORTED = 130
    """Interrupted (Ctrl-C, SIGINT): ``rcdiag: aborted``, no partial output file left behind."""
    TERMINATED = 143
    """Terminated (SIGTERM): as ``ABORTED``, with the shell's code for SIGTERM (128 + 15)."""


class RcdiagError(Exception):
    """Base class for errors caused by the user's input or options (exit code 2)."""

    exit_code: ExitCode = ExitCode.USAGE


class ConfigError(RcdiagError, ValueError):
    """An invalid rollout-correction configuration (verl would reject it too, or crash on it)."""


class SettingError(RcdiagError):
    """An ``RCDIAG_*`` environment variable holding a value it does not take (``rcdiag.runtime.environment``). Not a
    ``ValueError``: readers catch those as damaged files, and the file is not at fault."""


class OutputError(RcdiagError):
    """An output file (or stdout) that cannot be written: a full disk, a refused permission, a closed device. The
    message is ``cannot write PATH: REASON``; nothing claims the file was written."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"cannot write {path}: {reason}")
        self.path = str(path)


class InputError(RcdiagError):
    """A dump that cannot be read or holds invalid values.

    ``path``, ``row`` (0-based) or ``sequence`` (the id of a long-layout sequence) and ``column`` locate the
    problem when known; they are also in the message.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        row: int | None = None,
        column: str | None = None,
        sequence: object = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if row is not None:
            where.append(f"row {row}")
        if sequence is not None:
            where.append(f"sequence {sequence!r}")
        if column is not None:
            where.append(f"column '{column}'")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")
        self.path = path
        self.row = row
        self.column = column
