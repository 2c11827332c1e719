"""The gate on findings (``rcdiag check --fail-on``): a dump fails when analyze gives a finding of a severity or
worse, or one of the named codes, whatever the metric rules say.

Metric rules see only the numbers a user thought to bound; findings are analyze's own judgement (a kl that
disagrees with k3_kl, a mask that looks inverted, a log-prob offset). Without this gate a dump analyze warns
about could pass ``check`` unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rcdiag.catalogue.findings import EXPLAIN_ONLY, SEVERITY_RANK, codes_for
from rcdiag.records.report import Finding, Report, Severity
from rcdiag.runtime.errors import ConfigError

ANALYZE_PACK = "analyze"
"""``--pack analyze``: analyze's own checks as a gate (``ANALYZE_PACK_GATE``)."""


@dataclass(frozen=True)
class FindingGate:
    """Fail on findings of ``severity`` or worse (``None``: none by severity) and on the ``codes`` named."""

    severity: Severity | None = None
    codes: tuple[str, ...] = ()

    @property
    def explain(self) -> bool:
        """True when a named code comes only from ``analyze --explain`` (check then runs it)."""
        return any(code in EXPLAIN_ONLY for code in self.codes)

    def describe(self) -> str:
        """``warning or worse, kl_k3_disagree`` (for tables and messages)."""
        parts = [f"{self.severity} or worse"] if self.severity is not None else []
        return ", ".join(parts + list(self.codes))

    def fails(self, item: Finding) -> bool:
        worse = self.severity is not None and SEVERITY_RANK[item.severity] <= SEVERITY_RANK[self.severity]
        return worse or item.code in self.codes

    def failing(self, report: Report) -> tuple[Finding, ...]:
        """The report's findings this gate fails on, in the report's order."""
        return tuple(item for item in report.findings if self.fails(item))

    def merged(self, other: FindingGate | None) -> FindingGate:
        """Both gates at once: the stricter severity, every code."""
        if other is None:
            return self
        levels: list[Severity] = [s for s in (self.severity, other.severity) if s is not None]
        severity = max(levels, key=SEVERITY_RANK.__getitem__, default=None)
        return FindingGate(severity, tuple(dict.fromkeys(self.codes + other.codes)))

    def to_dict(self) -> dict[str, object]:
        return {"severity": self.severity, "codes": list(self.codes)}


ANALYZE_PACK_GATE = FindingGate(severity="warning")
"""What ``--pack analyze`` adds: every finding analyze rates warning or error fails (``--fail-on warning``)."""


def parse_fail_on(texts: Iterable[str], *, option: str = "--fail-on") -> FindingGate | None:
    """``--fail-on`` values (each a comma-separated list of severities and finding codes) as one gate; ``None``
    without any. An unknown name is a ``ConfigError`` listing the valid ones."""
    severity: Severity | None = None
    codes: list[str] = []
    valid = codes_for("analyze")
    for text in texts:
        for name in (part.strip() for part in text.split(",")):
            if name in SEVERITY_RANK:
                if severity is None or SEVERITY_RANK[name] > SEVERITY_RANK[severity]:
                    severity = name
            elif name in valid:
                codes.append(name)
            else:
                raise ConfigError(
                    f"{option} {text}: '{name}' is neither a severity ({', '.join(SEVERITY_RANK)}) nor a finding code "
                    f"analyze gives; codes: {', '.join(valid)}."
                )
    if severity is None and not codes:
        return None
    return FindingGate(severity, tuple(dict.fromkeys(codes)))
