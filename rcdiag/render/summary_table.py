"""The terminal's default screen after the verdict (rich): the off-policy table, the IS/RS table and the health
warnings, one line each; the rows come from ``rcdiag.render.summary``."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.catalogue import finding
from rcdiag.records.report import Report
from rcdiag.render.summary import (
    DETAILS_HINT,
    OFFPOLICY,
    Check,
    correction_rows,
    exact_line,
    health_warnings,
    offpolicy_rows,
)
from rcdiag.render.text import fmt
from rcdiag.render.verdict_text import SEVERITY_STYLE, STATUS_STYLE, supporting_text


def print_summary(report: Report, console: Console) -> None:
    """The off-policy table, the supporting metrics it leaves out, and the IS/RS table when IS or RS is on."""
    steps = report.input.steps
    pooled = f" (all {steps:,} steps pooled)" if steps > 1 else " (its one step)" if report.steps else ""
    table = _table("Off-policy" + pooled)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("health check", overflow="fold")
    for row in offpolicy_rows(report):
        table.add_row(row.label, fmt(row.value), _checks(row.checks, rules=True))
    console.print(table)
    rest = supporting_text(report, leave_out=OFFPOLICY)
    if rest:
        console.print(Text("rcdiag: " + rest, style="dim"))
    print_exact(report, console)
    rows = correction_rows(report)
    if not rows:
        return
    table = _table("IS/RS: share truncated or rejected" + pooled)
    table.add_column("option", no_wrap=True)
    table.add_column("setting", overflow="fold")
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("responses", justify="right", no_wrap=True)
    with_ess = any(row.ess is not None for row in rows)
    if with_ess:
        table.add_column("ESS", justify="right", no_wrap=True)
    table.add_column("check", overflow="fold")
    for c in rows:
        ess = (fmt(c.ess) if c.ess is not None else "",) if with_ess else ()
        table.add_row(c.name, c.setting, _share(c.tokens), _share(c.responses), *ess, _checks(c.checks, rules=False))
    console.print(table)


def print_exact(report: Report, console: Console) -> None:
    """The exact-match line (``rcdiag.render.summary.exact_line``), when the report has one."""
    line = exact_line(report)
    if line is not None:
        identical = report.sections["exact"].identical
        console.print(Text(line, style=STATUS_STYLE["identical"] if identical else "dim"))


def print_health_warnings(report: Report, console: Console) -> None:
    """Each error and warning finding on one line (cut to the line's width: ``--details`` and JSON have every
    message whole), then the hint to ``--details``."""
    found = health_warnings(report)
    console.print(Text("Health warnings" if found else "Health warnings: none", style="bold"))
    for w in found:
        line = Text.assemble((f"{w.severity.upper()} ", SEVERITY_STYLE[w.severity]), (f"[{w.code}] ", "bold"), w.text)
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
    console.print(Text(DETAILS_HINT, style="dim"))


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)


def _share(value: float | None) -> str:
    return "—" if value is None else fmt(value)


def _checks(checks: tuple[Check, ...], *, rules: bool) -> Text:
    """``✓ |kl| <= 0.1``, a failed one ``✗ |kl| <= 0.1 (kl_high)``, coloured by its finding's severity (an info
    finding ``·``), an untested one ``–``. Without ``rules``, one mark: the first failure's ``✗`` (the health
    warnings below name it), else ``✓`` when a check held."""
    out = Text()
    if not rules:
        failed = [c for c in checks if c.fired]
        if failed:
            out.append(*_mark(failed[0].code))
        elif any(c.status == "ok" for c in checks):
            out.append("✓", style="green")
        return out
    for c in checks:
        if out:
            out.append("  ")
        if c.status == "ok":
            out.append(f"✓ {c.rule}", style="green")
            continue
        if c.status == "unchecked":
            out.append(f"– {c.rule} (no value)", style="dim")
            continue
        out.append(*_mark(c.code))
        out.append(f" {c.rule} ({c.code})" if c.rule else f" {c.code}")
    return out


def _mark(code: str) -> tuple[str, str]:
    severity = finding(code).severity
    return ("·" if severity == "info" else "✗"), SEVERITY_STYLE[severity]
