"""The verdict: one status, the causes with their evidence, and one prescription, from a finished report.

This first version maps findings to causes and a status; the prescription policy (docs/verdict.md) fills in
``recommendation``. Every rendering shows the verdict first.
"""

from __future__ import annotations

from rcdiag.report import Cause, CauseClass, Finding, Report, Verdict, VerdictStatus

CAUSE_OF: dict[str, CauseClass] = {
    "verl_crash_empty_batch": "crash",
    "verl_crash_ess_zero_division": "crash",
    "verl_crash_microbatch_all_rejected": "crash",
    "verl_crash_microbatch_empty": "crash",
    "verl_refuses_microbatch_setup": "crash",
    "rs_rejects_all_tokens": "crash",
    "kl_negative": "swapped_columns",
    "temperature_mismatch": "temperature",
    "logprob_offset": "temperature",
    "sampling_truncation": "truncation",
    "position_drift": "position",
    "mismatch_trend": "trend",
    "sparse_outliers": "outliers",
    "is_saturated": "saturated_is",
    "token_specific": "token_specific",
}
"""The cause class each finding code is evidence of (codes absent here do not name a cause)."""

STATUS_OF: dict[CauseClass, VerdictStatus] = {
    "crash": "broken",
    "swapped_columns": "broken",
    "temperature": "fix",
    "truncation": "fix",
    "position": "fix",
    "trend": "fix",
    "token_specific": "fix",
    "outliers": "correct",
    "saturated_is": "correct",
    "noise": "correct",
}
"""The status a cause alone implies; the verdict takes the worst."""

_ORDER: tuple[VerdictStatus, ...] = ("healthy", "correct", "fix", "broken")


def judge(report: Report) -> Verdict:
    """The verdict for ``report`` (its findings and metrics)."""
    causes = _causes(report.findings)
    if not causes and any(f.severity != "info" for f in report.findings):
        causes.append(_noise(report.findings))
    status: VerdictStatus = max((STATUS_OF[c.cls] for c in causes), key=_ORDER.index, default="healthy")
    if status == "healthy":
        headline = "healthy: no finding beyond numerical noise"
    else:
        headline = f"{status}: " + ", ".join(cause.cls.replace("_", " ") for cause in causes)
    return Verdict(status=status, headline=headline, causes=tuple(causes))


def _causes(findings: tuple[Finding, ...]) -> list[Cause]:
    by_class: dict[CauseClass, list[Finding]] = {}
    for f in findings:
        cls = CAUSE_OF.get(f.code)
        if cls is not None:
            by_class.setdefault(cls, []).append(f)
    return [
        Cause(cls, tuple(f.code for f in group), group[0].message)
        for cls, group in sorted(by_class.items(), key=lambda item: -_ORDER.index(STATUS_OF[item[0]]))
    ]


def _noise(findings: tuple[Finding, ...]) -> Cause:
    raised = [f for f in findings if f.severity != "info"]
    return Cause("noise", tuple(f.code for f in raised), raised[0].message)
