"""``analyze --png FILE``: the six-panel dashboard over steps as a PNG (1920x1200), for a slide or an issue."""

from __future__ import annotations

from rcdiag.render import counted
from rcdiag.render.charts import dashboard, png
from rcdiag.render.text import describe_config
from rcdiag.report import Report


def render_png(report: Report) -> bytes:
    """The dashboard of one report."""
    facts = report.input
    steps = counted(facts.steps, "step") if facts.steps else "no step column: the whole dump as one point"
    title = (
        f"rcdiag {report.version} · {facts.path} · {counted(facts.rows, 'row')} · "
        f"{facts.valid_tokens:,} valid tokens · {steps}\n{describe_config(report.config)}"
    )
    return png(dashboard([(None, report)], title))
