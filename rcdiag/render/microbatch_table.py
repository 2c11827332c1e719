"""The micro-batch section of the terminal report: how verl cut each step, which micro-batches would crash and why,
and what verl logged per micro-batch next to the whole-batch values."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from rcdiag.catalogue.keys import Key
from rcdiag.records.report import LEGACY_ASSERT, MicroBatchReport, Report
from rcdiag.render.text import fmt

MAX_CRASH_ROWS = 20
PATHS = {
    "legacy_actor": "verl <= 0.7.1 decoupled mode: the actor computes the off-policy metrics per micro-batch on the "
    "RS-modified mask (and asserts a valid token)",
    "bypass": "bypass mode: the whole pipeline per micro-batch on the original mask (ValueError on an empty one)",
    "driver": "verl >= 0.8.0 decoupled mode: no per-micro-batch rollout-correction call, so no micro-batch crash",
}


def microbatch_section(full: Report) -> list[RenderableType]:
    """Renderables for the micro-batch section of ``full`` (which has one)."""
    report = full.microbatch
    assert report is not None
    settings = ", ".join(f"{k}={v}" for k, v in report.settings.items() if v not in (None, False))
    head = Text(f"Micro-batches ({settings})", style="bold")
    head.append(f"\nthis configuration runs: {PATHS[report.path]}", style="dim")
    if report.path == "legacy_actor":
        head.append(
            "\nverl 0.7.1 logged the actor's values (legacy actor) for the 13 off-policy keys: they overwrite the "
            "driver's whole-batch values in the step's metrics",
            style="dim",
        )
    out: list[RenderableType] = [head]
    for step in report.steps:
        if step.refused is not None:
            where = "" if step.step is None else f"step {step.step}: "
            out.append(Text(f"{where}verl refuses this split: {step.refused}", style="bold red"))
    out.append(_crash_table(report))
    if len(report.steps) == 1 and report.steps[0].refused is None:
        out.append(_metrics_table(report, full.metrics))
    elif len(report.steps) > 1:
        out.append(_per_step_table(report, {step.step: step.metrics for step in full.steps}))
    return out


def _per_step_table(report: MicroBatchReport, whole: dict[int, dict[str, float | None]]) -> RenderableType:
    table = _table("Per step: micro-batches, crashes, and kl as each path logged it (— : that path crashes)")
    for name in (
        "step",
        "micro-batches",
        "legacy asserts",
        "bypass errors",
        "whole-batch kl",
        "legacy kl",
        "bypass kl",
    ):
        table.add_column(name, justify="right", no_wrap=True)
    key = Key.KL
    for step in report.steps:
        legacy, bypass = step.legacy_metrics or {}, step.bypass_metrics or {}
        table.add_row(
            str(step.step),
            "refused" if step.refused is not None else f"{len(step.each()):,}",
            f"{len(step.legacy_crashes):,}",
            f"{len(step.bypass_crashes):,}",
            fmt(whole.get(step.step, {}).get(key)) if step.step is not None else "",
            fmt(legacy.get(key)),
            fmt(bypass.get(key)),
        )
    return table


def _crash_table(report: MicroBatchReport) -> RenderableType:
    rows = []
    for step in report.steps:
        for where, micro in step.each():
            why = []
            if micro.legacy_crash:
                why.append(("legacy actor: " + LEGACY_ASSERT, report.path == "legacy_actor"))
            if micro.bypass_crash is not None:
                why.append(("bypass: " + micro.bypass_crash, report.path == "bypass"))
            if why:
                rows.append((where, micro, why))
    total = sum(len(step.each()) for step in report.steps)
    if not rows:
        return Text(f"No micro-batch would crash either path ({total:,} micro-batches).", style="green")
    title = f"Micro-batches that would crash ({len(rows):,} of {total:,}; bold: the path this configuration runs)"
    if len(rows) > MAX_CRASH_ROWS:
        title += f", first {MAX_CRASH_ROWS} shown; all are in --format json"
    table = _table(title)
    for name in ("step", "mini", "rank", "micro", "rows", "valid tokens", "after RS"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("why", overflow="fold")
    for where, micro, why in rows[:MAX_CRASH_ROWS]:
        shown = ", ".join(map(str, micro.rows[:6])) + (", ..." if len(micro.rows) > 6 else "")
        reasons = Text()
        for i, (text, runs) in enumerate(why):
            reasons.append(("; " if i else "") + text, style="bold red" if runs else "dim")
        table.add_row(
            "—" if where.step is None else str(where.step),
            str(where.mini),
            str(where.rank),
            str(where.micro),
            shown,
            f"{micro.n_valid_tokens:,}",
            f"{micro.n_valid_tokens_after_rs:,}",
            reasons,
        )
    return table


def _metrics_table(report: MicroBatchReport, whole: dict[str, float | None]) -> RenderableType:
    step = report.steps[0]
    table = _table("What verl logged: whole batch, and reduced over micro-batches (— : that path crashes)")
    table.add_column("metric", no_wrap=True)
    for name in ("whole batch", "bypass mode", "legacy actor"):
        table.add_column(name, justify="right")
    bypass, legacy = step.bypass_metrics or {}, step.legacy_metrics or {}
    for key, value in whole.items():
        legacy_value = fmt(legacy.get(key)) if key in legacy or step.legacy_metrics is None else ""
        table.add_row(key, fmt(value), fmt(bypass.get(key)), legacy_value)
    return table


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
