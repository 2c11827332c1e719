"""Warnings on the command line: the library's notices (``rcdiag.notices.Notice``) as one ``rcdiag: ...`` line each
on stderr, at once; any other warning (numpy, torch) held back and shown only after the command succeeded, so that
a failing command leaves exactly one error line."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rcdiag.notices import Notice


@contextmanager
def notices_live_warnings_held() -> Iterator[list[warnings.WarningMessage]]:
    """Within the block, print notices as they come and collect every other warning into the yielded list."""
    held: list[warnings.WarningMessage] = []

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None):
        if issubclass(category, Notice):
            print(f"rcdiag: {message}", file=sys.stderr, flush=True)
        else:
            held.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield held


def show_held(held: list[warnings.WarningMessage]) -> None:
    """Show the warnings held back during a command that succeeded, as Python shows them."""
    for warning in held:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
