"""``rcdiag watch``'s views: what each event becomes on the screen or in a pipe (the CLI writes it).

``WatchScreen`` is the live view on a terminal: it keeps the last steps, the last report, the alerts and the
forecasts, and ``render`` draws them (rich). ``text_line`` and ``json_line`` give one event as plain lines, for a
pipe or a file. The renderer registry (``rcdiag.render.registry``, kinds ``watch`` and ``watch_line``) names them.
"""

from __future__ import annotations

import json
from collections import deque
from typing import TYPE_CHECKING, Any

from rcdiag.catalogue.keys import Key
from rcdiag.runtime.printable import printable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from rcdiag.records.report import Report
    from rcdiag.watch import StepEvent
    from rcdiag.watch.session import Event, ReportEvent

SHOWN_STEPS = 12
"""Steps in the live view's table."""
SHOWN_METRICS = (Key.KL, Key.K3_KL, Key.CHI2_TOKEN, Key.LOG_PPL_ABS_DIFF)
SHOWN_ALERTS = 8


def json_line(event: Event) -> str:
    """One JSON object per step and per whole report, one per line (read as it comes)."""
    return json.dumps(event.to_dict()) + "\n"


def text_line(event: Event) -> str:
    """One plain line per step and per report, and one per alert."""
    from rcdiag.watch import StepEvent

    if isinstance(event, StepEvent):
        step = event.step
        values = " ".join(
            f"{key.rpartition('/')[2]}={_g(step.metrics.get(key))}" for key in SHOWN_METRICS if key in step.metrics
        )
        lines = [f"step {step.step}: {step.rows} rows, {step.valid_tokens:,} tokens {values}"]
    else:
        codes = ", ".join(f"{f.code} ({f.severity})" for f in event.report.findings) or "none"
        lines = [
            f"after step {event.step} ({event.files} files): verdict {verdict_line(event.report)}; findings: {codes}"
        ]
    lines += [f"  ALERT {a.severity}: {printable(a.message)}" for a in event.alerts]
    return "\n".join(lines) + "\n"


class WatchScreen:
    """The live view's content: fed every event and the number of files settling, drawn by ``render``."""

    def __init__(self, location: str, consumed: Any) -> None:
        self.location = location
        self.consumed = consumed
        """The session's files read (a live collection: its size is shown)."""
        self.steps: deque[StepEvent] = deque(maxlen=SHOWN_STEPS)
        self.alerts: deque[str] = deque(maxlen=SHOWN_ALERTS)
        self.last: StepEvent | None = None
        self.report: ReportEvent | None = None
        self.waiting = 0

    def add(self, event: Event) -> None:
        from rcdiag.watch import StepEvent

        if isinstance(event, StepEvent):
            self.steps.append(event)
            self.last = event
        else:
            self.report = event
        self.alerts.extend(f"step {a.step}: {a.severity}: {a.message}" for a in event.alerts)

    def render(self) -> RenderableType:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        last = self.last
        head = Text(
            f"watching {printable(self.location)}: {len(self.consumed)} file(s) read"
            + (f", {self.waiting} settling" if self.waiting else ""),
            style="bold",
        )
        table = Table(box=None, pad_edge=False)
        keys = [k for k in SHOWN_METRICS if last is not None and k in last.step.metrics]
        for column in ("step", "rows", "tokens", *(k.rpartition("/")[2] for k in keys)):
            table.add_column(column, justify="right")
        for event in self.steps:
            values = [_g(event.step.metrics.get(k)) for k in keys]
            table.add_row(str(event.step.step), str(event.step.rows), f"{event.step.valid_tokens:,}", *values)
        parts: list[Any] = [head, table]
        report = self.report.report if self.report is not None else None
        if report is not None and report.verdict is not None:
            parts.append(Text(f"verdict: {verdict_line(report)}", style="bold"))
        if report is not None and report.findings:
            parts.append(Text("findings: " + ", ".join(f"{f.code} ({f.severity})" for f in report.findings)))
        if last is not None:
            parts += [Text(f"forecast: {f.message}", style="yellow") for f in last.forecasts]
            parts += [Text(f"forecast: {f.message}", style="dim") for f in last.no_trend]
        parts += [Text(f"ALERT {printable(line)}", style="red") for line in self.alerts]
        return Group(*parts)


def verdict_line(report: Report) -> str:
    """The verdict's headline, led by its status unless the headline already says it."""
    verdict = report.verdict
    if verdict is None:
        return "none"
    headline = printable(verdict.headline)
    return headline if headline.startswith(verdict.status) else f"{verdict.status}: {headline}"


def _g(value: float | None) -> str:
    return "null" if value is None else f"{value:.4g}"
