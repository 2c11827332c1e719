"""The terminal view of a ``Comparison``: both sides' metrics with difference and ratio, the temperature section,
the per-step difference, and the verdicts."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.catalogue.metrics import short_key, step_columns
from rcdiag.compare import Comparison, Comparisons, MetricDiff
from rcdiag.records.report import Report
from rcdiag.render import counted
from rcdiag.render.panels import sparkline
from rcdiag.render.table import SPARK_WIDTH, print_verdict, step_table
from rcdiag.render.text import describe_config, fmt
from rcdiag.render.verdict_text import SEVERITY_STYLE
from rcdiag.runtime.printable import printable

MAX_STEP_ROWS = 24


def render_comparison(comparison: Comparison | Comparisons, console: Console) -> None:
    """Print the whole comparison: each side's verdict first."""
    if isinstance(comparison, Comparisons):
        render_comparisons(comparison, console)
        return
    console.print(_header(comparison))
    for side, report in (("A", comparison.a), ("B", comparison.b)):
        if report.verdict is not None:
            console.print(Text(f"{side}: {printable(report.input.path)}", style="bold"))
            print_verdict(report.verdict, console, report)
    suffix = " (all steps pooled)" if comparison.a.steps or comparison.b.steps else ""
    console.print(_metric_table("Metrics side by side" + suffix, comparison.metrics))
    if comparison.tests:
        console.print(Text("Is B different from A? (95% intervals; docs/compare.md)", style="bold"))
        for test in comparison.tests.values():
            style = "yellow" if test.significant else "dim"
            console.print(Text("  " + test.sentence(), style=style))
    console.print(_temperature_table(comparison))
    for line in comparison.temperature.explanation:
        console.print(Text("  " + line))
    if comparison.steps:
        console.print(_step_table(comparison))
    for side, steps in comparison.unpaired_steps.items():
        if steps:
            listed = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
            console.print(Text(f"steps only in {side}: {listed} (not paired)", style="dim"))
    console.print(Text("Findings", style="bold"))
    for side, report in (("a", comparison.a), ("b", comparison.b)):
        codes = ", ".join(f.code for f in report.findings) or "none"
        console.print(Text(f"  analyze on side {side}: {codes}", style="dim"))
    for finding in comparison.findings:
        where = f"side {finding.side}: " if finding.side and not finding.message.startswith("side") else ""
        console.print(
            Text.assemble(
                (f"{finding.severity.upper()} ", SEVERITY_STYLE[finding.severity]),
                (f"[{finding.code}] ", "bold"),
                printable(where + finding.message),
            )
        )


def render_comparisons(many: Comparisons, console: Console) -> None:
    """Every dump against the baseline: one line per dump, its verdict, then its tests (Holm-adjusted)."""
    base = many.baseline
    console.print(
        Text(f"rcdiag {base.version} compare · {len(many.reports)} dumps · device {base.device}", style="bold")
    )
    console.print(Text(_describe("baseline A", base)))
    console.print(Text("config (every dump): " + describe_config(base.config), style="dim"))
    if base.verdict is not None:
        console.print(Text(f"A: verdict {_verdict_line(base)}"))
    for i, comparison in enumerate(many.comparisons):
        label = chr(ord("B") + i) if i < 25 else str(i + 2)
        report = comparison.b
        console.print(Text(_describe(label, report), style="bold"))
        if report.verdict is not None:
            console.print(Text(f"  verdict {_verdict_line(report)}"))
        for test in comparison.tests.values():
            style = "yellow" if test.significant else "dim"
            console.print(Text("  " + test.sentence("A", label), style=style))
        if comparison.findings:
            console.print(Text(f"  the pair's findings (side a: A, side b: {label}):", style="dim"))
        for finding in comparison.findings:
            console.print(
                Text(f"  {finding.severity.upper()} [{finding.code}] {printable(finding.message)}", style="dim")
            )
    console.print(
        Text(
            f"p-values Holm-adjusted over the {len(many.comparisons)} comparisons (per metric); docs/compare.md",
            style="dim",
        )
    )


def _verdict_line(report: Report) -> str:
    """``STATUS: headline``, the headline's own leading status word not repeated."""
    assert report.verdict is not None
    status = report.verdict.status
    return f"{status.upper()}: {printable(report.verdict.headline.removeprefix(status + ': '))}"


def _describe(side: str, report: Report) -> str:
    facts = report.input
    parts = [f"{side}: {printable(facts.path)}", counted(facts.rows, "row"), f"{facts.valid_tokens:,} valid tokens"]
    if facts.steps:
        parts.append(counted(facts.steps, "step"))
    return " · ".join(parts)


def _header(comparison: Comparison) -> Text:
    text = Text(f"rcdiag {comparison.a.version} compare · device {comparison.a.device}", style="bold")
    text.append("\n" + _describe("a", comparison.a))
    text.append("\n" + _describe("b", comparison.b))
    text.append("\nconfig (both sides): " + describe_config(comparison.a.config), style="dim")
    record = comparison.a.sections.get("framework")
    if record is not None:  # --as NAME: its keys side by side beside verl's
        text.append("\nframework (both sides): " + printable(record.heading()), style="dim")
    return text


def _metric_table(title: str, rows: tuple[MetricDiff, ...]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    for column in ("a", "b", "b - a", "b / a"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row.key, fmt(row.a), fmt(row.b), fmt(row.difference), _ratio(row.ratio))
    return table


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}x"


def _temperature_table(comparison: Comparison) -> Table:
    t = comparison.temperature
    table = Table(
        title="Temperature: kl ~ Var(eps)/(2 T^2), so kl*T^2 and T*sqrt(2 kl) are comparable across temperatures",
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("side")
    table.add_column("T", justify="right")
    table.add_column("from")
    table.add_column("kl", justify="right")
    table.add_column("k3_kl", justify="right")
    table.add_column("kl*T^2", justify="right")
    table.add_column("noise T*sqrt(2 kl) [kl ± 2 se]", justify="right")
    for side, st in (("a", t.a), ("b", t.b)):
        noise = fmt(st.noise)
        if st.noise_low is not None and st.noise_high is not None:
            noise += f" [{st.noise_low:.3g}, {st.noise_high:.3g}]"
        table.add_row(
            side,
            fmt(st.temperature),
            st.source or "unknown",
            fmt(st.kl),
            fmt(st.k3_kl),
            fmt(st.kl_t2),
            noise,
        )
    return table


def _step_table(comparison: Comparison) -> Table:
    pairs = list(comparison.steps)
    table, shown = step_table("Per step (steps in both dumps): a, b and b - a", pairs, MAX_STEP_ROWS)
    keys = [k for k in step_columns("compare") if pairs[0].get(k) is not None]
    for key in keys:
        name = short_key(key)
        for column in (f"{name} a", f"{name} b", f"{name} b-a"):
            table.add_column(column, justify="right", no_wrap=True)
    for pair in shown:
        cells = [str(pair.step)]
        for key in keys:
            row = pair.get(key)
            assert row is not None
            cells += [fmt(row.a), fmt(row.b), fmt(row.difference)]
        table.add_row(*cells)
    if len(pairs) > 1:
        columns = [[getattr(p.get(k), side) for p in pairs] for k in keys for side in ("a", "b", "difference")]
        table.add_section()
        table.add_row("trend", *(Text(sparkline(values, SPARK_WIDTH), style="cyan") for values in columns))
    slopes = [f"{short_key(k)} {fmt(v)}/step" for k, v in comparison.trend.items() if v is not None]
    if slopes:
        table.caption = "trend of b - a (least-squares slope): " + ", ".join(slopes)
        table.caption_justify = "left"
    return table
