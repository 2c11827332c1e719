"""The verdict as plain lines (terminal: analyze and compare): status, headline, causes, the prescription's
YAML and measured effect, next steps, and the few metrics that support it. Imports no rich."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rcdiag.catalogue.keys import Key
from rcdiag.records.report import Effect, FrameworkSetting, Report, Verdict
from rcdiag.render.panels import effect_facts, framework_effect_facts
from rcdiag.render.text import fmt
from rcdiag.runtime.printable import printable

STATUS_STYLE = {
    "identical": "bold cyan",
    "healthy": "bold green",
    "correct": "bold yellow",
    "fix": "bold red",
    "broken": "bold white on red",
}
"""Terminal colour of each status."""
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
"""Terminal colour of each finding severity."""
SUPPORTING = (
    ("kl", Key.KL),
    ("k3_kl", Key.K3_KL),
    ("chi2_token", Key.CHI2_TOKEN),
    ("chi2_seq", Key.CHI2_SEQ),
    ("mean |log-ratio|", Key.ABS_LOG_RATIO_MEAN),
    ("max |log-ratio|", Key.ABS_LOG_RATIO_MAX),
    ("kl std error", Key.KL_STD_ERROR),
)
"""The metrics a verdict rests on (label, key): under it in ``compare`` and ``--details``; by default, those not in
the off-policy table (``rcdiag.render.summary.OFFPOLICY``) follow that table."""

Kind = Literal["status", "headline", "heading", "item", "yaml", "metrics"]


@dataclass(frozen=True)
class Line:
    kind: Kind
    text: str


def effect_text(effect: Effect | None) -> str:
    """One line: what the prescription does on this dump (measured)."""
    if effect is None:
        return "effect not measured (no dump to re-read: run rcdiag analyze on the dump with the setting above)"
    return "measured on this dump: " + ", ".join(f"{what} {value}" for what, value in effect_facts(effect))


def framework_lines(spoken: FrameworkSetting) -> list[Line]:
    """The prescription in the ``--as`` framework's settings: heading, its options as its users write them, the
    effect measured under its semantics, and how it matches verl's setting."""
    match = spoken.match.replace("_", " ")
    lines = [Line("heading", f"prescription in {spoken.release} (--as {spoken.name}; {match} as verl's setting)")]
    lines.extend(Line("yaml", row) for row in spoken.paste.rstrip("\n").splitlines())
    if spoken.effect is not None:
        facts = ", ".join(f"{what} {value}" for what, value in framework_effect_facts(spoken.effect))
        lines.append(Line("item", f"measured on this dump under {spoken.release}'s semantics: {facts}"))
    elif spoken.options:
        lines.append(Line("item", "effect not measured (no dump to re-read)"))
    lines.append(Line("item", printable(("what differs: " if spoken.match != "same" else "") + spoken.meaning)))
    return lines


def verdict_lines(verdict: Verdict, report: Report | None = None) -> list[Line]:
    """The verdict, then (with ``report``) the supporting metrics."""
    lines = [Line("status", verdict.status.upper()), Line("headline", printable(verdict.headline))]
    if verdict.causes:
        lines.append(Line("heading", "causes"))
        lines.extend(
            Line("item", printable(f"{cause.cls} [{', '.join(cause.codes) or '-'}]: {cause.evidence}"))
            for cause in verdict.causes
        )
    p = verdict.recommendation
    if p is not None:
        name = f" (verl preset {p.preset})" if p.preset else ""
        if p.framework is not None:
            lines.extend(framework_lines(p.framework))
            name = f"verl's setting{name}"
        lines.append(Line("heading", name.strip() if p.framework is not None else f"prescription{name}"))
        lines.extend(Line("yaml", row) for row in p.yaml.rstrip("\n").splitlines())
        lines.append(Line("item", effect_text(p.effect)))
        lines.append(Line("item", "why: " + p.why))
    if verdict.next_steps:
        lines.append(Line("heading", "next steps"))
        lines.extend(Line("item", printable(step)) for step in verdict.next_steps)
    if report is not None:
        shown = supporting_text(report)
        if shown:
            lines.append(Line("metrics", shown))
    return lines


def supporting_text(report: Report, leave_out: tuple[str, ...] = ()) -> str:
    """``kl 0.000273796  ·  k3_kl ...``: the supporting metrics the report has, but those in ``leave_out`` (shown
    elsewhere on the same screen); ``""`` when none is left."""
    values = {**report.metrics, **report.extras}
    shown = [f"{label} {fmt(values[key])}" for label, key in SUPPORTING if key in values and key not in leave_out]
    return "  ·  ".join(shown)
