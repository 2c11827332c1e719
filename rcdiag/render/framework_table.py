"""``--as NAME`` in the terminal: the framework's release and options, its keys with their values (all steps pooled)
and what each means, and the notes on what it does not log or what its values depend on."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.records.report import Report
from rcdiag.render.text import fmt
from rcdiag.runtime.printable import printable


def render_framework(report: Report, console: Console) -> None:
    """The framework table, when the report was computed ``--as`` a framework other than verl."""
    record: Any = report.sections.get("framework")
    if record is None:
        return
    pooled = " (all steps pooled)" if report.steps else ""
    table = Table(title=printable(record.heading()) + pooled, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_column("reading")
    for key, value, reading in record.rows():
        table.add_row(key, fmt(value), reading)
    if record.rows():
        console.print(table)
    else:
        console.print(Text(printable(record.heading()) + ": no key logged", style="bold"))
    for note in record.notes:
        console.print(Text("  note: " + printable(note), style="dim"))
