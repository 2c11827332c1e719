"""Making findings: ``emit`` gives a finding its severity and advice from the catalogue's spec and keeps the
measured facts apart from the advice; ``ordered`` lists findings in the catalogue's order. Every producer (health
rules, signatures, detectors, sections, compare, crash notes) makes its findings here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rcdiag.catalogue.findings import finding, listing_order
from rcdiag.records.report import Finding, Side


def emit(
    code: str,
    facts: str,
    *,
    more: str = "",
    value: float | None = None,
    threshold: float | tuple[float, float] | None = None,
    metric: str | None = None,
    steps: tuple[int, ...] | None = None,
    detail: dict[str, str] | None = None,
    evidence: dict[str, Any] | None = None,
    side: Side | None = None,
) -> Finding:
    """A finding of ``code``. ``facts``: the measured statement, one sentence without its full stop (the verdict
    quotes it as evidence); ``more``: further sentences, with their full stops. The message is the facts, then
    ``more``, then the spec's advice: ``"{facts}. {more} {advice}"``; the facts alone, as given, when nothing
    follows."""
    spec = finding(code)
    rest = " ".join(part for part in (more, spec.advice) if part)
    message = f"{facts}. {rest}" if rest else facts
    return Finding(
        spec.code,
        spec.severity,
        message,
        metric,
        value,
        threshold,
        steps,
        detail,
        evidence,
        side,
        facts=facts,
        advice=spec.advice,
    )


def at_steps(steps: tuple[int, ...], total: int) -> str:
    """Where a finding grouped over steps holds: ``at 2 of 4 steps (1, 3)`` (the first ten listed) or ``at all 4
    steps``."""
    if len(steps) < total:
        listed = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
        return f"at {len(steps)} of {total} steps ({listed})"
    return f"at all {total} steps"


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """``findings`` by severity, then catalogue order (then side, for ``compare``'s); stable otherwise."""
    return sorted(findings, key=lambda f: (*listing_order(f.code, f.severity), f.side or ""))
