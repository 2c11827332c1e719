"""Plain-text pieces every renderer shares (terminal, HTML): numbers, the input and configuration lines, and where
a checklist row fired (the rows themselves: ``Report.checklist``). Imports no rich."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import ReadingContext
from rcdiag.records.report import BucketRow, ChecklistRow, Report, SliceRow, WorstRow
from rcdiag.runtime.printable import printable
from rcdiag.settings.correction import ResolvedConfig

KL_STD_ERROR = Key.KL_STD_ERROR
"""kl's standard error, which the metric readings weigh kl against."""


def fmt(value: float | None) -> str:
    """Numbers as verl logs would show them, to 6 significant digits; ``—`` for null."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    return f"{value:.6g}"


def describe_input(report: Report) -> str:
    """Format and the column used for each role."""
    used = ", ".join(f"{role}={name}" for role, name in report.input.columns.items() if name is not None)
    steps = f"; steps from the {report.input.step_source}" if report.input.step_source else ""
    return printable(f"{report.input.format}; columns {used}{steps}")  # names from a file: never raw to a terminal


def describe_config(config: ResolvedConfig) -> str:
    """One line saying what is computed (the fields as given: ``threshold=2`` stays ``2``)."""
    cfg = config.config
    bits = []
    if cfg.rollout_is is not None and cfg.rollout_is_threshold is not None:
        bits.append(f"rollout_is={cfg.rollout_is} threshold={cfg.rollout_is_threshold}")
        if cfg.rollout_is_batch_normalize:
            bits.append("batch-normalized")
    else:
        bits.append("rollout_is=null")
    if cfg.rollout_rs is not None:
        bits.append(f"rollout_rs={cfg.rollout_rs} threshold={cfg.rollout_rs_threshold}")
    else:
        bits.append("rollout_rs=null")
    # loss_type matters in bypass mode only; decoupled runs say so instead of printing a field that is unused
    bits.append(f"bypass_mode=true loss_type={cfg.loss_type}" if cfg.bypass_mode else "bypass_mode=false (decoupled)")
    bits.append(f"as verl {cfg.verl_version} logs it")
    return ", ".join(bits)


def reading_context(report: Report) -> ReadingContext:
    """What the metric readings need from the report: kl's standard error and the findings that fired."""
    return ReadingContext(report.extras.get(KL_STD_ERROR), frozenset(f.code for f in report.findings))


def where(row: ChecklistRow) -> str:
    """Where a checklist row fired (``3166.38 (1 step: 2)``, ``whole dump``), or why it was not computed."""
    if row.status == "ok":
        return ""
    if row.status == "not_computed":
        return row.reason
    at = "whole dump" if row.steps is None else _steps_text(row.steps)
    return at if row.value is None else f"{fmt(row.value)} ({at})"


def _steps_text(steps: tuple[int, ...]) -> str:
    listed = ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''}: {listed}"


BREAKDOWNS = {
    "position": "By token position in the response",
    "rollout_prob": "By the rollout engine's probability of the sampled token",
    "length": "By response length (valid tokens)",
}
"""``--explain``'s breakdowns and their titles."""
BREAKDOWN_METRICS = {"kl": "kl", "k3_kl": "k3_kl", "chi2_token": "chi2_token", "abs_log_ratio_mean": "mean |log-ratio|"}
"""Each breakdown bucket's metrics and their column labels."""
WORST_COLUMNS = ("row", "step", "id", "valid tokens", "log-ratio sum", "max |log-ratio|", "at position",
                 "old / rollout log-prob there")  # fmt: skip


SLICE_COLUMNS = ("value", "rows", "tokens", "share of tokens", "kl", "k3_kl", "mean |log-ratio|", "share of k3_kl", "z",
                 "status")  # fmt: skip
"""``--by``'s table columns (``breakdowns.by.COLUMN``), terminal and HTML."""


def slice_cells(entry: SliceRow) -> tuple[str, ...]:
    """One ``--by`` slice, in ``SLICE_COLUMNS`` order (the value as the dump holds it, made printable)."""
    value = entry.value
    return (
        "null" if value is None else printable(str(value)),
        f"{entry.rows:,}",
        f"{entry.tokens:,}",
        _percent(entry.token_share),
        fmt(entry.kl),
        fmt(entry.k3_kl),
        fmt(entry.abs_log_ratio_mean),
        _percent(entry.k3_share),
        "—" if entry.z is None else f"{entry.z:.3g}",
        entry.status,
    )


def slice_title(column: str, count: int, shown: int) -> str:
    """The title of one ``--by`` table (saying when it shows only some of the column's values)."""
    more = f"; the {shown} carrying most of k3_kl of its {count} values" if shown < count else ""
    return printable(f"By {column} (--by {column}{more})")


def shown_slices(entries: Sequence[SliceRow], most: int) -> Sequence[SliceRow]:
    """At most ``most`` slices, those carrying the largest share of k3_kl, in the table's (reading) order."""
    if len(entries) <= most:
        return entries
    kept = sorted(range(len(entries)), key=lambda i: -(entries[i].k3_share or 0.0))[:most]
    return [entries[i] for i in sorted(kept)]


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def bucket_label(entry: BucketRow) -> str:
    """``[0, 32)``, ``[0.99, 1]``, ``>= 2048``."""
    lo, hi = entry.lo, entry.hi
    if hi is None:
        return f">= {lo:g}"
    return f"[{lo:g}, {hi:g}{']' if hi == 1.0 and isinstance(hi, float) else ')'}"


def worst_cells(entry: WorstRow) -> tuple[str, ...]:
    """One worst-responses row, in ``WORST_COLUMNS`` order."""
    at = (
        "—"
        if entry.old_log_prob_at_max is None
        else f"{fmt(entry.old_log_prob_at_max)} / {fmt(entry.rollout_log_prob_at_max)}"
    )
    return (
        str(entry.row),
        "—" if entry.step is None else str(entry.step),
        "—" if entry.id is None else printable(entry.id),
        f"{entry.length:,}",
        fmt(entry.log_ratio_sum),
        fmt(entry.max_abs_log_ratio),
        "—" if entry.position_of_max is None else str(entry.position_of_max),
        at,
    )


SPOKEN_COLUMNS = (
    "option",
    "verl threshold",
    "match",
    "tokens zeroed",
    "responses zeroed",
    "weights truncated",
    "weight mean",
    "ESS",
)
"""The columns of the recommendations in a framework's settings (``sweep --as NAME``), every renderer's."""


def spoken_cells(rec: Any) -> tuple[str, ...]:
    """A recommendation in the ``--as`` framework's settings: its match and its effect under that framework."""
    spoken = rec.framework
    assert spoken is not None
    assert rec.threshold is not None
    effect = spoken.effect
    if effect is None:
        return (rec.option, rec.threshold, spoken.match, "—", "—", "—", "—", "—")
    shares = (effect.tokens_zeroed, effect.responses_zeroed, effect.weights_truncated, effect.weight_mean, effect.ess)
    return (rec.option, rec.threshold, spoken.match.replace("_", " "), *(fmt(v) for v in shares))
