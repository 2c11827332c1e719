"""The ``--explain`` part of the table: breakdowns, worst responses and the detectors' checklist."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from rcdiag.records.report import BucketRow, ExplainReport, Report, TokenRow
from rcdiag.render.text import (
    BREAKDOWN_METRICS,
    BREAKDOWNS,
    SLICE_COLUMNS,
    WORST_COLUMNS,
    bucket_label,
    fmt,
    shown_slices,
    slice_cells,
    slice_title,
    worst_cells,
)
from rcdiag.render.token_text import (
    SHOWN,
    TOKEN_COLUMNS,
    TOKEN_TABLES,
    caption,
    pieces,
    rgb,
    strength,
    token_cells,
    token_note,
    window,
)
from rcdiag.runtime.printable import printable

if TYPE_CHECKING:
    from rich.console import Console


def render_explain(report: Report, console: Console) -> None:
    """Print the breakdowns and the worst responses (nothing without ``--explain``); the detectors are rows of
    the findings checklist."""
    explained = report.explain
    if explained is None:
        return
    for name, rows in explained.breakdowns.bucketed():
        console.print(_breakdown(BREAKDOWNS[name], rows))
    token = explained.breakdowns.token
    if token is not None:
        for name, ranked in token.ranked():
            console.print(_token_table(TOKEN_TABLES[name], ranked))
        console.print(Text(token_note(token), style="dim"))
    console.print(_worst(explained))
    for text in explained.texts:
        console.print(_highlighted(text, explained))


TERMINAL_SLICES = 16
"""Values of a ``--by`` column the terminal shows (those carrying most of k3_kl; the JSON and HTML have all)."""


def render_slices(report: Report, console: Console) -> None:
    """``--by``'s tables, one per column (nothing without ``--by``)."""
    record = report.sections.get("slices")
    if record is None:
        return
    for column, entries in record.tables.items():
        shown = shown_slices(entries, TERMINAL_SLICES)
        table = Table(title=slice_title(column, len(entries), len(shown)), title_justify="left", title_style="bold",
                      show_edge=False, pad_edge=False)  # fmt: skip
        for name in SLICE_COLUMNS:
            table.add_column(name, justify="left" if name in ("value", "status") else "right")
        for entry in shown:
            table.add_row(*slice_cells(entry))
        console.print(table)


TERMINAL_TOKENS = 160
"""Tokens of a worst response the terminal shows, around its largest |log-ratio|."""


def _token_table(title: str, entries: tuple[TokenRow, ...]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    for column in TOKEN_COLUMNS:
        table.add_column(column, justify="left" if column == "text" else "right", no_wrap=column == "text")
    for entry in entries[:SHOWN]:
        table.add_row(*token_cells(entry))
    if not entries:
        table.add_row("—", "no id stands out", *("" for _ in TOKEN_COLUMNS[2:]))
    return table


def _highlighted(text: Any, explained: ExplainReport) -> Text:
    """A worst response's text around its peak, each token on a background coloured by its log-ratio (red: the
    trainer's log-prob is higher, blue: the rollout's)."""
    entry = next((e for e in explained.worst_sequences if e.row == text.row), None)
    a, b = window(text, TERMINAL_TOKENS)
    shown = Text()
    shown.append(f"{caption(text, entry)}, valid tokens {text.start + a}-{text.start + b - 1}: ", style="bold")
    for piece, value in zip(pieces(text)[a:b], text.log_ratios[a:b], strict=True):
        r, g, b = rgb(value)
        shown.append(printable(piece), style=f"black on rgb({r},{g},{b})" if strength(value) > 0 else "")
    return shown


def _breakdown(title: str, entries: tuple[BucketRow, ...]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("bucket", no_wrap=True)
    table.add_column("tokens", justify="right")
    for label in BREAKDOWN_METRICS.values():
        table.add_column(label, justify="right")
    for entry in entries:
        table.add_row(
            bucket_label(entry), f"{entry.tokens:,}", *(fmt(getattr(entry, key)) for key in BREAKDOWN_METRICS)
        )
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
