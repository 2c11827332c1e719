"""The outcome of rules on a report: per rule, and for a whole check (the JSON of ``rcdiag check``).

Separate from the rule model because results carry reports; renderers (table, JUnit, GitHub annotations) read
only these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rcdiag.check.rules import Rule, Status
from rcdiag.report import SCHEMA_VERSION, Report


@dataclass(frozen=True)
class RuleResult:
    """A rule evaluated on a report."""

    rule: Rule
    key: str | None
    """The full metric name (``None`` when skipped)."""
    status: Status
    value: float | None
    """The value quoted: the worst step's (every), the last step's, or the mean over steps."""
    limit: float | None
    """The bound the value was held to (for relative rules: derived from the baseline)."""
    step: int | None
    """The step of ``value`` (``None``: a dump without steps, or the mean)."""
    failing_steps: tuple[int, ...]
    checked_steps: int
    baseline: float | None
    message: str

    @property
    def label(self) -> str:
        return f"{self.rule.describe(self.key)} ({self.rule.mode()})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.to_dict(),
            "label": self.label,
            "metric": self.key,
            "status": self.status,
            "value": self.value,
            "limit": self.limit,
            "step": self.step,
            "failing_steps": list(self.failing_steps),
            "checked_steps": self.checked_steps,
            "baseline": self.baseline,
            "message": self.message,
        }


@dataclass(frozen=True)
class CheckResult:
    """Every rule's outcome on one dump (and its baseline)."""

    report: Report
    baseline: Report | None
    results: tuple[RuleResult, ...]

    @property
    def passed(self) -> bool:
        """True when no rule failed (skipped rules do not fail)."""
        return not self.failed

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in ("passed", "failed", "skipped")}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (schema in docs/check.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "check",
            "rcdiag_version": self.report.version,
            "passed": self.passed,
            "counts": self.counts(),
            "config": self.report.config,
            "input": self.report.input.to_dict(),
            "baseline": self.baseline.input.to_dict() if self.baseline is not None else None,
            "results": [r.to_dict() for r in self.results],
        }
