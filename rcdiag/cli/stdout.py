"""What happens when the reader of stdout goes away: the exception that says so and the redirect that follows.
Below both ``rcdiag.cli.output`` and ``rcdiag.cli.console``, which both need them."""

from __future__ import annotations

import os
import sys


class StdoutClosedError(Exception):
    """The reader of stdout went away (``rcdiag analyze X | head -1``). ``Output.emit`` carries on without stdout, so
    the files asked for are still written and the exit code is the verdict's; elsewhere ``rcdiag.cli.main`` exits 0.

    Not an ``OSError``: click turns an ``EPIPE`` ``OSError`` into exit 1 before ``main`` could see it."""


def stdout_gone() -> None:
    """Point stdout at the null device: what is still printed (or buffered) goes nowhere, without a second error
    at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (captured): nothing to redirect
        pass
