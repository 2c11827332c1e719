"""The reading progress bar: rows, tokens and throughput on stderr, fed by the library's ``on_chunk`` callback."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rcdiag.cli.output import Output
    from rcdiag.settings.reading import ReadOptions


def wanted(quiet: bool, json_to_stdout: bool) -> bool:
    """A bar only on an interactive stderr, not with ``--quiet``, and not while JSON goes to a piped stdout."""
    if quiet or not sys.stderr.isatty():
        return False
    return not (json_to_stdout and not sys.stdout.isatty())


def progress(read: ReadOptions, out: Output) -> AbstractContextManager[Callable[[Any], None] | None]:
    """The bar a command that reads dumps shows: over rows in one process, over parts with workers or Ray."""
    return progress_bar(wanted(read.quiet, out.text_to_stdout))


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Callable[[Any], None] | None]:
    """Yield an ``on_chunk`` callback that drives a rich progress bar (``None`` when disabled)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("reading"),
        BarColumn(),
        TextColumn("{task.fields[parts]}{task.fields[rows]} rows · {task.fields[tokens]} tokens · {task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task("read", total=None, rows="0", tokens="0", rate="", parts="")

    def update(event: Any) -> None:
        elapsed = progress.tasks[task].elapsed or 0.0
        rate = f"{event.tokens / elapsed / 1e6:.1f} M tokens/s" if elapsed > 0 else ""
        by_parts = event.total_parts is not None
        progress.update(
            task,
            total=event.total_parts if by_parts else event.total_rows,
            completed=event.parts if by_parts else event.rows,
            rows=f"{event.rows:,}",
            tokens=f"{event.tokens:,}",
            rate=rate,
            parts=f"{event.parts}/{event.total_parts} parts · " if by_parts else "",
        )

    with progress:
        yield update
