"""A rich console for stdout that does not squeeze tables into 80 columns when piped."""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 160


def stdout_console() -> Console:
    """The terminal's width on a terminal, 160 columns otherwise."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
