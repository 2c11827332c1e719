"""A rich console for stdout that does not squeeze tables into 80 columns when piped, and that lets a closed pipe
end the stdout part quietly (``rcdiag analyze X | head -1`` keeps its exit code; rich's own handler exits 1)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from rcdiag.cli.stdout import StdoutClosedError, stdout_gone
from rcdiag.runtime.errors import OutputError

PIPE_WIDTH = 160


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdout_gone()
        raise StdoutClosedError  # Output.emit carries on without stdout


class _CheckedStdout:
    """``sys.stdout`` whose failed writes (a full disk behind ``>``) are an ``OutputError``; a closed pipe stays a
    ``BrokenPipeError``, which rich hands to ``on_broken_pipe``."""

    def write(self, text: str) -> int:
        return self._checked(sys.stdout.write, text)

    def flush(self) -> None:
        self._checked(sys.stdout.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stdout, name)

    @staticmethod
    def _checked(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            stdout_gone()
            raise OutputError("stdout", exc.strerror or str(exc)) from None


def stdout_console() -> Console:
    """The terminal's width on a terminal, 160 columns otherwise."""
    return _StdoutConsole(file=_CheckedStdout(), width=None if sys.stdout.isatty() else PIPE_WIDTH)  # type: ignore[arg-type]
