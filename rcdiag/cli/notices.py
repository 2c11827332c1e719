"""Warnings on the command line: the library's notices (``rcdiag.runtime.notices.Notice``) as one ``rcdiag: ...`` line
each on stderr, a ``Busy`` one at once and the others once the command has succeeded; any other warning (numpy, torch)
held back likewise and shown as Python shows it. A failing command leaves exactly one line, its error."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rcdiag.runtime.notices import Busy, Notice


@contextmanager
def notices_live_warnings_held() -> Iterator[list[warnings.WarningMessage]]:
    """Within the block, print ``Busy`` notices as they come and collect every other warning into the yielded
    list."""
    held: list[warnings.WarningMessage] = []

    def show(
        message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if issubclass(category, Busy):
            print(f"rcdiag: {message}", file=sys.stderr, flush=True)
        else:
            held.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield held


def show_held(held: list[warnings.WarningMessage]) -> None:
    """Show what was held back during a command that succeeded: notices as ``rcdiag:`` lines, other warnings as
    Python shows them."""
    for warning in held:
        if issubclass(warning.category, Notice):
            print(f"rcdiag: {warning.message}", file=sys.stderr, flush=True)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
