"""Alerts of ``rcdiag watch``: the report's findings, the ``check`` rules and the trend forecasts, evaluated at each
new step; an alert is new the first time its key holds (``finding:CODE``, ``rule:LABEL``, ``forecast:METRIC...``),
and is not raised again at the following steps, nor after a restart (the keys are kept in the watch state).

Severities: a finding keeps its own; a failed rule is an ``error`` (the bound ``check`` would fail on); a forecast
crossing is a ``warning`` (it has not happened yet); a file replaced or deleted after it was read (``file:NAME``)
is a ``warning``: the watch's counts no longer match the directory's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.catalogue.findings import SEVERITY_RANK
from rcdiag.check.evaluate import evaluate_rules
from rcdiag.check.findings_gate import FindingGate
from rcdiag.check.metric_names import resolve_metric
from rcdiag.check.rules import Rule
from rcdiag.records.report import Finding, Report, Severity
from rcdiag.watch.files import FileChange
from rcdiag.watch.forecast import DEFAULT_LEVEL, DEFAULT_WINDOW, Direction, Forecast, NoTrend, trend

AlertKind = Literal["finding", "rule", "forecast", "file"]
DEFAULT_HORIZON = 50
"""A forecast alerts when its expected crossing is at most this many steps ahead."""
DEFAULT_GATE = FindingGate(severity="warning")
"""Findings that alert without ``--fail-on``: every warning and error."""
_DIRECTIONS: dict[str, Direction] = {"max": "above", "max_abs": "above", "min": "below"}


@dataclass(frozen=True)
class Alert:
    """One condition that newly holds at ``step``."""

    key: str
    kind: AlertKind
    severity: Severity
    step: int | None
    message: str
    metric: str | None = None
    value: float | None = None
    limit: float | None = None
    detail: dict[str, Any] | None = None
    """The finding, rule result or forecast behind it, as in the JSON report."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AlertPolicy:
    """What alerts, and what stops the watch."""

    rules: tuple[Rule, ...] = ()
    gate: FindingGate | None = DEFAULT_GATE
    exit_on: Severity | None = None
    """Stop (exit 1) on a new alert of this severity or worse; ``None``: never."""
    horizon: int = DEFAULT_HORIZON
    window: int = DEFAULT_WINDOW
    level: float = DEFAULT_LEVEL

    def stops(self, alerts: Sequence[Alert]) -> bool:
        if self.exit_on is None:
            return False
        return any(SEVERITY_RANK[a.severity] <= SEVERITY_RANK[self.exit_on] for a in alerts)

    def on_step(
        self, steps: Report, step: int, alerted: Collection[str], findings: Sequence[Finding] = ()
    ) -> tuple[list[Alert], list[Forecast], list[NoTrend]]:
        """The new rule, forecast and finding alerts (keys not in ``alerted``), the forecasts at ``step`` and the
        bounded metrics a level change leaves without a trend; ``steps`` is a report whose steps are those up to
        ``step``, ``findings`` what is judged at it (the bias detectors: ``rcdiag.watch.session``), alerting as the
        whole report's findings do (the same keys, so each alerts once)."""
        found: list[Alert] = self._finding_alerts(findings, step)
        for result in evaluate_rules(steps, self.rules):
            if result.status == "failed":
                message = f"{result.label}: {result.message}"
                found.append(
                    Alert(f"rule:{result.label}", "rule", "error", step, message, result.key, result.value,
                          result.limit, result.to_dict())
                )  # fmt: skip
        forecasts, flat = self.trends(steps)
        for item in forecasts:
            if item.expected <= item.last_step + self.horizon:
                key = f"forecast:{item.metric}:{item.direction}:{item.limit:g}"
                found.append(
                    Alert(key, "forecast", "warning", step, item.message, item.metric, None, item.limit, item.to_dict())
                )
        return _new(found, alerted), forecasts, flat

    def on_report(self, report: Report, step: int | None, alerted: Collection[str]) -> list[Alert]:
        """The new finding alerts of a whole report (attributed to ``step``, the last step read)."""
        return _new(self._finding_alerts(report.findings, step), alerted)

    def _finding_alerts(self, findings: Sequence[Finding], step: int | None) -> list[Alert]:
        """An alert for each finding the gate fails on (none without a gate)."""
        if self.gate is None:
            return []
        return [
            Alert(f"finding:{f.code}", "finding", f.severity, step, f.message, f.metric, f.value, None, f.to_dict())
            for f in findings
            if self.gate.fails(f)
        ]

    def forecasts(self, report: Report) -> list[Forecast]:
        """The crossing forecast of each bounded rule (``max``, ``min``, ``max_abs``) whose metric is computed."""
        return self.trends(report)[0]

    def trends(self, report: Report) -> tuple[list[Forecast], list[NoTrend]]:
        """``forecasts``, and each bounded metric whose last level change leaves no trend to forecast."""
        available = [*report.metrics, *report.extras]
        made: list[Forecast] = []
        flat: list[NoTrend] = []
        seen: set[tuple[str, str, float]] = set()
        for rule in self.rules:
            direction = _DIRECTIONS.get(rule.kind)
            key = resolve_metric(rule.metric, available)
            if direction is None or key is None or (key, rule.kind, rule.bound) in seen:
                continue
            seen.add((key, rule.kind, rule.bound))
            steps = [s.step for s in report.steps]
            values = [(s.metrics | s.extras).get(key) for s in report.steps]
            if rule.kind == "max_abs":
                values = [None if v is None else abs(v) for v in values]
            made_one = trend(key, steps, values, rule.bound, direction, window=self.window, level=self.level)
            if isinstance(made_one, Forecast):
                made.append(made_one)
            elif made_one is not None:
                flat.append(made_one)
        return made, flat


def file_alert(change: FileChange, step: int | None, location: str) -> Alert:
    """A file read earlier changed or went, or a rank file appeared after its rollout was read: the watch keeps the
    rows it read (accumulators cannot give a file's rows back), so its numbers and those of ``rcdiag analyze`` of
    the directory now differ; said once, by file."""
    name = change.name
    if change.read is None:
        message = (
            f"{name} in {location} appeared after the watch read its rollout's rank files: the watch keeps the "
            "rollout as it read it, without this file, and does not read it (alone it would count the rollout "
            "again); `rcdiag analyze` of the directory reads the rollout with it"
        )
    else:
        if change.now is None:
            fate = "its rows stay counted here, and `rcdiag analyze` of the directory no longer counts them"
        else:
            fate = (
                "the watch keeps the rows of the version it read and does not read it again; `rcdiag analyze` of "
                "the directory reads the new one"
            )
        happened = "was deleted" if change.now is None else f"changed ({change.what})"
        message = f"{name} in {location} {happened} after the watch read it: {fate}"
    detail = {
        "file": name,
        "read": None if change.read is None else change.read.to_dict(),
        "now": None if change.now is None else change.now.to_dict(),
    }
    return Alert(f"file:{name}", "file", "warning", step, message, detail=detail)


def _new(found: list[Alert], alerted: Collection[str]) -> list[Alert]:
    return list({a.key: a for a in found if a.key not in alerted}.values())
