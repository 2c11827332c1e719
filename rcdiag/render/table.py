"""The terminal report: rich tables of every metric with a reading, a per-step trend, and a findings checklist."""

from __future__ import annotations

from typing import TypeVar

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.catalogue import metric, reading, short_key
from rcdiag.catalogue.metrics import ReadingContext, rs_option, step_columns
from rcdiag.records.report import Report, Verdict
from rcdiag.render import counted
from rcdiag.render.panels import sparkline
from rcdiag.render.summary import is_title, rs_keeps
from rcdiag.render.summary_table import print_exact, print_health_warnings, print_summary
from rcdiag.render.text import describe_config, describe_input, fmt, reading_context, where
from rcdiag.render.verdict_text import SEVERITY_STYLE, STATUS_STYLE, verdict_lines
from rcdiag.runtime.printable import printable

T = TypeVar("T")
MAX_TREND_ROWS = 24
SPARK_WIDTH = 12
"""Characters of the sparkline under each per-step column (every step, each character the mean of its run)."""


def render_table(report: Report, console: Console, *, details: bool = False) -> None:
    """Print the report: the verdict first; then, by default, the off-policy table, the IS/RS table and the health
    warnings, one line each (``rcdiag.render.summary_table``); with ``details``, the supporting metrics, every
    metric table, the per-step table, the findings checklist and every finding's full message instead.
    ``--as NAME``'s framework table, ``--explain``'s and the micro-batch sections are always shown."""
    console.print(_header(report))
    if report.verdict is not None:
        print_verdict(report.verdict, console, report if details else None)
    if details:
        _details(report, console)
    else:
        print_summary(report, console)
    if "framework" in report.sections:
        from rcdiag.render.framework_table import render_framework

        render_framework(report, console)
    if report.microbatch is not None:
        from rcdiag.render.microbatch_table import microbatch_section

        for part in microbatch_section(report):
            console.print(part)
    if report.explain is not None or report.sections.get("slices") is not None:
        from rcdiag.render.explain_table import render_explain, render_slices

        render_slices(report, console)
        render_explain(report, console)
    if not details:
        print_health_warnings(report, console)
        return
    for found in report.findings:
        style = SEVERITY_STYLE[found.severity]
        console.print(
            Text.assemble((f"{found.severity.upper()} ", style), (f"[{found.code}] ", "bold"), printable(found.message))
        )


def print_verdict(verdict: Verdict, console: Console, report: Report | None = None) -> None:
    """The verdict, styled: the status coloured, the prescription's YAML as code; with ``report``, the metrics it
    rests on under it."""
    for line in verdict_lines(verdict, report):
        if line.kind == "status":
            console.print(Text.assemble(("verdict ", "bold"), (f" {line.text} ", STATUS_STYLE[verdict.status])))
        elif line.kind == "headline":
            console.print(Text(line.text, style="bold"))
        elif line.kind == "heading":
            console.print(Text(line.text, style="bold underline"))
        elif line.kind == "yaml":
            console.print(Text("    " + line.text, style="cyan"))
        elif line.kind == "item":
            console.print(Text("  • " + line.text))
        else:
            console.print(Text(line.text, style="dim"))
    console.print()


def _details(report: Report, console: Console) -> None:
    """Every metric table, the per-step table and the findings checklist (``--details``)."""
    metrics = report.metrics
    context = reading_context(report)
    title_suffix = " (all steps pooled)" if report.steps else ""
    debug = [k for k in metrics if _group(k) == "debug"]
    if debug:
        title = "verl's debug metrics (training/*, probabilities)" + title_suffix
        console.print(_metric_table(title, debug, metrics, context))
    off = [k for k in metrics if _group(k) == "offpolicy"]
    console.print(_metric_table("Off-policy diagnostics" + title_suffix, off, metrics, context))
    is_keys = [k for k in metrics if _group(k) == "is"]
    if is_keys:
        assert report.config.is_spec is not None
        console.print(_metric_table(is_title(report.config.is_spec) + title_suffix, is_keys, metrics, context))
    for option, keys in _rs_groups(metrics).items():
        title = f"RS {option}: keeps {rs_keeps(report.config.rs_option(option))}{title_suffix}"
        console.print(_metric_table(title, keys, metrics, context))
    aggregates = [k for k in metrics if _group(k) == "rs_aggregate"]
    if aggregates:
        console.print(
            _metric_table("Rejection sampling, all options combined" + title_suffix, aggregates, metrics, context)
        )
    console.print(
        _metric_table("rcdiag diagnostics (not verl keys)" + title_suffix, list(report.extras), report.extras, context)
    )
    print_exact(report, console)
    if report.steps:
        console.print(_trend_table(report))
    console.print(_checklist(report))


def _header(report: Report) -> Text:
    facts = report.input
    parts = [
        f"rcdiag {report.version}",
        printable(facts.path),
        counted(facts.rows, "row"),
        f"{facts.valid_tokens:,} valid tokens of {facts.tokens:,}",
    ]
    if facts.empty_rows:
        parts.append(f"{facts.empty_rows:,} empty rows")
    if facts.steps:
        parts.append(counted(facts.steps, "step"))
    parts.append(f"device {report.device}")
    text = Text(" · ".join(parts), style="bold")
    text.append("\ninput: " + describe_input(report), style="dim")
    if facts.metadata:
        text.append("\nrun: " + printable(", ".join(f"{k}={v}" for k, v in facts.metadata.items())), style="dim")
    if facts.skipped_rows:
        reasons = ", ".join(f"{k} {v}" for k, v in facts.skipped_by_reason.items() if v)
        text.append(f"\nskipped {facts.skipped_rows:,} bad rows ({reasons}) with --on-bad-row skip", style="yellow")
    neg_inf = {k: v for k, v in facts.neg_inf_tokens.items() if v}
    if neg_inf:
        counts = ", ".join(f"{k} {v:,}" for k, v in neg_inf.items())
        text.append(f"\n-inf log-probs at valid positions (legal; verl's clamps apply): {counts}", style="dim")
    text.append("\nconfig: " + describe_config(report.config), style="dim")
    return text


def _group(key: str) -> str:
    spec = metric(key)
    return spec.group if spec is not None else "extras"


def _rs_groups(metrics: dict) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for key in metrics:
        option = rs_option(key)
        if option is not None:
            groups.setdefault(option, []).append(key)
    return groups


def _metric_table(title: str, keys: list[str], values: dict, context: ReadingContext) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("reading", overflow="fold")
    for key in keys:
        table.add_row(key, fmt(values[key]), Text(reading(key, values[key], context)))
    return table


def evenly_spaced(items: list[T], most: int) -> list[T]:
    """All items, or ``most`` of them evenly spaced (first and last included), for a readable table."""
    if len(items) <= most:
        return items
    stride = (len(items) - 1) / (most - 1)
    return [items[round(i * stride)] for i in range(most)]


def step_table(title: str, steps: list[T], most: int) -> tuple[Table, list[T]]:
    """A per-step table with its ``step`` column, and the steps to show: all, or ``most`` evenly spaced (the
    title says so; every step is in the JSON)."""
    shown = evenly_spaced(steps, most)
    if len(shown) < len(steps):
        title += f"; {len(shown)} of {len(steps)} steps shown, evenly spaced; all are in --format json"
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("step", justify="right")
    return table, shown


def _trend_table(report: Report) -> Table:
    present = [k for k in step_columns("analyze") if k in report.metrics]
    steps = list(report.steps)
    table, shown = step_table("Per step (what verl logged at each step)", steps, MAX_TREND_ROWS)
    table.add_column("rows", justify="right")
    for key in present:
        table.add_column(short_key(key), justify="right")
    for step in shown:
        table.add_row(str(step.step), f"{step.rows:,}", *(fmt(step.metrics.get(k)) for k in present))
    if len(steps) > 1:
        table.add_section()
        lines = (sparkline([s.metrics.get(k) for s in steps], SPARK_WIDTH) for k in present)
        table.add_row("trend", "", *(Text(line, style="cyan") for line in lines))
    return table


def _checklist(report: Report) -> Table:
    table = Table(title="Findings checklist", title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("check")
    table.add_column("code", style="dim")
    table.add_column("where", overflow="fold")
    for row in report.checklist:
        if row.status == "not_computed":
            table.add_row(Text("–", style="dim"), Text(row.check, style="dim"), row.code, Text(where(row), style="dim"))
        elif row.status == "ok":
            table.add_row(Text("✓", style="green"), row.check, row.code, "")
        else:
            table.add_row(Text("✗", style=SEVERITY_STYLE[row.status]), row.check, row.code, where(row))
    return table
