"""rcdiag run as a child process (``python -m rcdiag``): the environment that finds this checkout, the small chunks
that make a run over conftest's ``big_dump`` last long enough for a signal to land mid-run, and whether the child
has a file open (read from ``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import ROOT

ENV = os.environ | {"PYTHONPATH": str(ROOT)}
SLOW = ("--chunk-tokens", "2048", "-q")
"""Small chunks: the run over ``big_dump`` takes seconds, so a signal lands mid-run."""


def has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open (False once it has exited)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False
