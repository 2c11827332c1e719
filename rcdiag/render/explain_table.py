"""The ``--explain`` part of the table: breakdowns, worst responses and the detectors' checklist."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from rcdiag.render.table import fmt
from rcdiag.report import ExplainReport, Report

if TYPE_CHECKING:
    from rich.console import Console

_BREAKDOWNS = {
    "position": "By token position in the response",
    "rollout_prob": "By the rollout engine's probability of the sampled token",
    "length": "By response length (valid tokens)",
}
_METRICS = ("kl", "k3_kl", "chi2_token", "abs_log_ratio_mean")


def render_explain(report: Report, console: Console) -> None:
    """Print the breakdowns and the worst responses (nothing without ``--explain``); the detectors are rows of
    the findings checklist."""
    explained = report.explain
    if explained is None:
        return
    for name, title in _BREAKDOWNS.items():
        console.print(_breakdown(title, explained.breakdowns[name]))
    console.print(_worst(explained))


def _bucket(entry: dict[str, Any]) -> str:
    lo, hi = entry["lo"], entry["hi"]
    if hi is None:
        return f">= {lo:g}"
    return f"[{lo:g}, {hi:g}{']' if hi == 1.0 and isinstance(hi, float) else ')'}"


def _breakdown(title: str, entries: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("bucket", no_wrap=True)
    table.add_column("tokens", justify="right")
    for key in _METRICS:
        table.add_column(key if key != "abs_log_ratio_mean" else "mean |log-ratio|", justify="right")
    for entry in entries:
        table.add_row(_bucket(entry), f"{entry['tokens']:,}", *(fmt(entry[key]) for key in _METRICS))
    return table


def _worst(explained: ExplainReport) -> Table:
    table = Table(
        title=f"Worst responses (largest |sum of log-ratios|, top {len(explained.worst_sequences)})",
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
    )
    for column in ("row", "step", "id", "valid tokens", "log-ratio sum", "max |log-ratio|", "at position",
                   "old / rollout log-prob there"):  # fmt: skip
        table.add_column(column, justify="right" if column != "id" else "left")
    for e in explained.worst_sequences:
        at = (
            "—"
            if e["old_log_prob_at_max"] is None
            else (f"{fmt(e['old_log_prob_at_max'])} / {fmt(e['rollout_log_prob_at_max'])}")
        )
        table.add_row(
            str(e["row"]),
            "—" if e["step"] is None else str(e["step"]),
            "—" if e["id"] is None else str(e["id"]),
            f"{e['length']:,}",
            fmt(e["log_ratio_sum"]),
            fmt(e["max_abs_log_ratio"]),
            "—" if e["position_of_max"] is None else str(e["position_of_max"]),
            at,
        )
    return table
