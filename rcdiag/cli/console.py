"""A rich console for stdout that does not squeeze tables into 80 columns when piped, and that lets a closed pipe
end the stdout part quietly (``rcdiag analyze X | head -1`` keeps its exit code; rich's own handler exits 1)."""

from __future__ import annotations

import sys

from rich.console import Console

from rcdiag.cli.output import StdoutClosedError, stdout_gone

PIPE_WIDTH = 160


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdout_gone()
        raise StdoutClosedError  # Output.emit carries on without stdout


def stdout_console() -> Console:
    """The terminal's width on a terminal, 160 columns otherwise."""
    return _StdoutConsole(width=None if sys.stdout.isatty() else PIPE_WIDTH)
