"""The terminal checklist of ``rcdiag check``: one row per rule with its value, bound and step."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.check import CheckResult
from rcdiag.render import counted
from rcdiag.render.check_formats import exact_cases
from rcdiag.render.text import describe_config, fmt
from rcdiag.runtime.printable import printable

_MARK = {"passed": Text("✓", style="green"), "failed": Text("✗", style="bold red"), "skipped": Text("–", style="dim")}


def render_check(result: CheckResult, console: Console) -> None:
    """Print the header, the checklist and a one-line verdict."""
    facts = result.report.input
    header = Text(
        f"rcdiag {result.report.version} check · {printable(facts.path)} · {counted(facts.rows, 'row')}", style="bold"
    )
    if facts.steps:
        header.append(f" · {counted(facts.steps, 'step')}", style="bold")
    if result.baseline is not None:
        header.append(f" · baseline {printable(result.baseline.input.path)}", style="bold")
    header.append("\nconfig: " + describe_config(result.report.config), style="dim")
    console.print(header)
    table = Table(
        title="Checklist",
        title_justify="left",
        title_style="bold",
        caption="worst value: the step's value nearest the limit where a rule holds, furthest beyond it where it fails",
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("", no_wrap=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("steps")
    table.add_column("worst value", justify="right", no_wrap=True)
    table.add_column("limit", justify="right", no_wrap=True)
    table.add_column("at step", justify="right")
    table.add_column("source", style="dim")
    table.add_column("detail", overflow="fold")
    for item in result.results:
        style = "dim" if item.status == "skipped" else ""
        table.add_row(
            _MARK[item.status],
            Text(item.rule.describe(item.key), style=style),
            item.rule.mode(),
            fmt(item.value),
            fmt(item.limit),
            "" if item.step is None else str(item.step),
            item.rule.source,
            Text(item.message, style=style),
        )
    if result.fail_on is not None:
        for found in result.failing_findings:
            table.add_row(
                _MARK["failed"],
                f"finding {found.code} ({found.severity})",
                ", ".join(map(str, found.steps)) if found.steps else "",
                "",
                "",
                "",
                "--fail-on",
                Text(found.message),
            )
        if not result.failing_findings:
            table.add_row(_MARK["passed"], f"no finding: {result.fail_on.describe()}", "", "", "", "", "--fail-on", "")
    for name, failure, text in exact_cases(result):
        table.add_row(_MARK["failed" if failure else "passed"], name, "", "", "", "", "--exact", Text(text))
    console.print(table)
    console.print(Text(result.verdict(), style="bold green" if result.passed else "bold red"))
