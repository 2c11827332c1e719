"""``analyze --png FILE``: the verdict, then the six-panel dashboard over steps (or, for a dump without steps, what
varies inside it) as a PNG 1920 pixels wide, for a slide or an issue."""

from __future__ import annotations

from rcdiag.records.report import Report
from rcdiag.render import counted
from rcdiag.render.charts import dashboard, png
from rcdiag.render.text import describe_config


def render_png(report: Report) -> bytes:
    """The dashboard of one report, its verdict first."""
    facts = report.input
    steps = counted(facts.steps, "step") if facts.steps else "no step column: what varies inside the dump"
    title = (
        f"rcdiag {report.version} · {facts.path} · {counted(facts.rows, 'row')} · "
        f"{facts.valid_tokens:,} valid tokens · {steps}\n{describe_config(report.config)}"
    )
    return png(dashboard([(None, report)], title))
