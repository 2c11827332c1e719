"""The outcome of rules on a report: per rule, and for a whole check (the JSON of ``rcdiag check``).

Separate from the rule model because results carry reports; renderers (table, JUnit, GitHub annotations) read
only these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rcdiag.check.findings_gate import FindingGate
from rcdiag.check.rules import Rule, Status
from rcdiag.records.report import SCHEMA_VERSION, Finding, Report


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
    """Every rule's outcome on one dump (and its baseline), and the findings the finding gate fails on."""

    report: Report
    baseline: Report | None
    results: tuple[RuleResult, ...]
    fail_on: FindingGate | None = None
    """The gate on findings (``--fail-on``, ``--pack analyze``); ``None``: findings do not fail the check."""
    exact: bool = False
    """``--exact``: the check fails unless the dump's two log-prob columns are bitwise identical at every valid
    token (``rcdiag.sections.exact``)."""

    @property
    def exact_failure(self) -> str | None:
        """Why ``--exact`` fails (naming the first differing response and position), ``None`` when it holds or was
        not asked for."""
        if not self.exact:
            return None
        found = self.report.sections.get("exact")
        if found is None:
            return "this report has no exact match (a state saved before rcdiag compared bits)"
        if found.identical:
            return None
        if not found.tokens_compared:
            return "no valid token to compare: nothing is shown bitwise identical"
        return f"not bitwise identical: {found.summary()}"

    @property
    def failing_findings(self) -> tuple[Finding, ...]:
        """The dump's findings that fail the gate (empty without one)."""
        return self.fail_on.failing(self.report) if self.fail_on is not None else ()

    @property
    def passed(self) -> bool:
        """True when no rule failed (skipped rules do not fail) and no finding fails the gate."""
        return not self.failed and not self.failing_findings and self.exact_failure is None

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")

    def verdict(self) -> str:
        """``PASSED: 3 of 3 rules hold`` or ``FAILED: 1 of 3 rules failed; 2 findings fail --fail-on warning or
        worse`` (with skipped rules and the finding gate when there are any)."""
        counts = self.counts()
        total = len(self.results)
        parts = []
        if total or (self.fail_on is None and not self.exact):
            held = (
                f"{counts['failed']} of {total} rules failed"
                if self.failed
                else f"{counts['passed']} of {total} rules hold"
            )
            parts.append(held + (f", {counts['skipped']} skipped" if counts["skipped"] else ""))
        if self.fail_on is not None:
            n = len(self.failing_findings)
            fails = f"{n} finding{'s' if n != 1 else ''} fail{'s' if n == 1 else ''}" if n else "no finding fails"
            parts.append(f"{fails} --fail-on {self.fail_on.describe()}")
        if self.exact:
            parts.append(self.exact_failure or "bitwise identical (--exact)")
        return f"{'PASSED' if self.passed else 'FAILED'}: {'; '.join(parts)}"

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
            "config": self.report.config.to_dict(),
            "input": self.report.input.to_dict(),
            "baseline": self.baseline.input.to_dict() if self.baseline is not None else None,
            "results": [r.to_dict() for r in self.results],
            "fail_on": self.fail_on.to_dict() if self.fail_on is not None else None,
            "failing_findings": [f.to_dict() for f in self.failing_findings],
            "exact": self._exact_dict(),
        }

    @property
    def exact_message(self) -> str:
        """``--exact``'s outcome in one line: why it fails (``exact_failure``), or the exact match that passed."""
        failure = self.exact_failure
        if failure is not None:
            return failure
        summary: str = self.report.sections["exact"].summary()  # no failure: the report has one, identical
        return summary

    def _exact_dict(self) -> dict[str, Any] | None:
        """``--exact``'s outcome: ``passed``, ``message`` and the report's exact match (null without ``--exact``)."""
        if not self.exact:
            return None
        found = self.report.sections.get("exact")
        passed = self.exact_failure is None
        return {"passed": passed, "message": self.exact_message, **(found.to_dict() if found is not None else {})}
