"""The ``--explain`` part of the table: breakdowns, worst responses and the detectors' checklist."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from rcdiag.render.text import BREAKDOWN_METRICS, BREAKDOWNS, WORST_COLUMNS, bucket_label, fmt, worst_cells
from rcdiag.report import ExplainReport, Report

if TYPE_CHECKING:
    from rich.console import Console


def render_explain(report: Report, console: Console) -> None:
    """Print the breakdowns and the worst responses (nothing without ``--explain``); the detectors are rows of
    the findings checklist."""
    explained = report.explain
    if explained is None:
        return
    for name, title in BREAKDOWNS.items():
        console.print(_breakdown(title, explained.breakdowns[name]))
    console.print(_worst(explained))


def _breakdown(title: str, entries: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("bucket", no_wrap=True)
    table.add_column("tokens", justify="right")
    for label in BREAKDOWN_METRICS.values():
        table.add_column(label, justify="right")
    for entry in entries:
        table.add_row(bucket_label(entry), f"{entry['tokens']:,}", *(fmt(entry[key]) for key in BREAKDOWN_METRICS))
    return table


def _worst(explained: ExplainReport) -> Table:
    table = Table(
        title=f"Worst responses (largest |sum of log-ratios|, top {len(explained.worst_sequences)})",
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
    )
    for column in WORST_COLUMNS:
        table.add_column(column, justify="right" if column != "id" else "left")
    for entry in explained.worst_sequences:
        table.add_row(*worst_cells(entry))
    return table
