"""The verdict: one status, the causes with their evidence, and one prescription, from a finished report.

The policy (docs/verdict.md): findings name causes (``CAUSE_OF``: a new finding code is one line there); the kl/k3
gap names truncation or a heavy tail; without a named cause, the size of the mismatch against published levels
(``NOISE_K3_MAX``) decides between ``healthy`` and ``correct``, and ``correct`` (class ``noise``) only when the
mismatch passes the precision tests (``rcdiag.signature_rules.precision_tests``): a systematic mismatch that fits
no known signature is ``unexplained`` (status ``fix``), never noise. Only ``correct`` gets a threshold prescription
(``rcdiag.prescribe``); its effect on the dump is measured by the library (``rcdiag.api``), never guessed here.
"""

from __future__ import annotations

from collections.abc import Iterable

from rcdiag.catalogue import finding
from rcdiag.prescribe import candidate
from rcdiag.report import Cause, CauseClass, Finding, Report, Verdict, VerdictStatus
from rcdiag.signature_rules import (
    NOISE_K3_MAX,
    NOISE_SIGMAS,
    kl_beyond_noise,
    mismatch_large,
    precision_tests,
    swap_consistent,
)

CAUSE_OF: dict[str, CauseClass] = {
    "verl_crash_empty_batch": "crash",
    "verl_crash_ess_zero_division": "crash",
    "verl_crash_microbatch_all_rejected": "crash",
    "verl_crash_microbatch_empty": "crash",
    "verl_refuses_microbatch_setup": "crash",
    "rs_rejects_all_tokens": "crash",
    "kl_negative": "swapped_columns",
    "temperature_mismatch": "temperature",
    "temperature_recorded_mismatch": "temperature",
    "logprob_offset": "offset",
    "offset_per_response": "offset",
    "mask_padding_valid": "mask",
    "mask_tokens_unsampled": "mask",
    "mask_looks_inverted": "mask",
    "logprobs_misaligned": "alignment",
    "logprobs_not_sampled": "logprob_mode",
    "mismatch_not_noise": "unexplained",
    "sampling_truncation": "truncation",
    "position_drift": "position",
    "mismatch_trend": "trend",
    "sparse_outliers": "outliers",
    "is_saturated": "saturated_is",
    "token_specific": "token_specific",
    "logprob_neg_inf": "token_specific",
}
"""The cause class each finding code is evidence of (codes absent here name no cause of their own)."""

STATUS_OF: dict[CauseClass, VerdictStatus] = {
    "crash": "broken",
    "swapped_columns": "broken",
    "mask": "broken",
    "alignment": "broken",
    "offset": "fix",
    "logprob_mode": "fix",
    "unexplained": "fix",
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
BF16_ABS_LOG_RATIO = 0.01
"""Mean |log-ratio| reported for bf16 dense models (vLLM, Qwen3-4B: ~0.011; mismatch-practice.md), quoted in the
headline as the yardstick."""
SIZE_CODES = ("kl_high", "chi2_token_high")
"""Metric warnings about the data's mismatch itself (not the configured correction): with no other cause they are
evidence of a large precision-like mismatch (``noise``)."""
CONFIG_CODES = (
    "is_mean_out_of_range",
    "is_ess_low",
    "is_std_high",
    "rs_rejects_most_tokens",
    "is_weights_unused",
)
"""Findings about the correction the report was computed with, not about the data: reported as next steps."""
DETECTORS = {
    "temperature_mismatch": "a temperature applied on one side",
    "logprob_offset": "a log-prob offset on one side",
    "sampling_truncation": "top-k/top-p renormalised on one side",
    "position_drift": "mismatch growing along the response",
    "mismatch_trend": "mismatch growing across steps",
    "token_specific": "mismatch on a few token ids",
}
"""``--explain``'s detectors and what each tests: without ``--explain`` the verdict says they were not examined."""
DEFAULT_DETECTORS = ("mismatch_trend",)
"""Detectors every analyze runs (they read only the per-step metrics), so never "not examined"."""
NO_TOKEN_IDS = "mismatch on a few token ids (it also needs token ids: none found in the dump; --token-col NAME)"
"""``token_specific`` not examined, on a dump without token ids (``InputFacts.columns["token_ids"]`` is ``None``):
``--explain`` alone would not test it."""
CLASS_TEXT: dict[CauseClass, str] = {
    "noise": "precision-like noise, large",
    "temperature": "a temperature applied on one side only",
    "truncation": "top-k/top-p renormalised on one side",
    "position": "mismatch growing along the response",
    "trend": "mismatch growing across steps",
    "outliers": "sparse outlier tokens",
    "saturated_is": "the configured IS saturates",
    "swapped_columns": "the log-prob columns look swapped",
    "crash": "verl would crash or reject everything",
    "token_specific": "mismatch on a few token ids (or tokens one engine gives probability 0)",
    "mask": "the mask covers tokens that were not sampled",
    "alignment": "the two columns are shifted by a position",
    "offset": "a constant log-prob offset on one side",
    "logprob_mode": "the rollout reports log-probs of another distribution than it sampled from",
    "unexplained": "a systematic mismatch that fits no known signature",
}
"""Each class in words, for the headline."""
DATA_CLASSES: tuple[CauseClass, ...] = ("mask", "alignment", "offset")
"""Classes that explain the whole log-ratio by the data's layout: with one of them, the classes read from the
log-ratio's sign or size (swapped columns, log-prob mode, the kl/k3 gap, the sign-reading detectors) name nothing
of their own."""
UNMODELLED = (
    "sampling parameters applied on one side only (repetition, presence or frequency penalty, logit bias, "
    "soft-capping, min-p, a temperature)",
    "raw vs processed log-probs (vLLM logprobs_mode)",
    "the alignment of the two columns (a BOS/EOS or one-position shift)",
    "what the mask covers (prompt, padding, tool output)",
    "the engine and model versions and weights on each side",
)
"""What an ``unexplained`` verdict asks to check: the causes rcdiag has no signature for yet, or whose signature
needs ``--explain``."""
SIGN_READING = ("temperature_mismatch", "sampling_truncation", "logprob_offset")
"""Detectors that read which side scores a token higher: with the columns swapped (kl_negative) they see the
opposite of what happened (a swapped 4-bit dump reads as a flatter rollout), so they name no cause of their own."""
_ORDER: tuple[VerdictStatus, ...] = ("healthy", "correct", "fix", "broken")


def judge(report: Report) -> Verdict:
    """The verdict for ``report`` (its findings and metrics). The prescription's ``effect`` is left ``None``: it
    needs the dump (``rcdiag.api`` measures it)."""
    findings = report.findings
    causes = _causes(findings, report)
    size = _Size(report)
    if not causes and (size.large or any(f.code in SIZE_CODES for f in findings)):
        codes = tuple(f.code for f in findings if f.code in SIZE_CODES)
        passed, failed = precision_tests(report.metrics, report.extras)
        if failed:
            causes.append(Cause("unexplained", codes, f"{size.evidence}; not precision noise: {'; '.join(failed)}"))
        else:
            tests = f"; consistent with precision noise: {', '.join(passed)}" if passed else ""
            causes.append(Cause("noise", codes, size.evidence + tests))
    status: VerdictStatus = max((STATUS_OF[c.cls] for c in causes), key=_ORDER.index, default="healthy")
    steps = [*_input_steps(findings), *_fix_steps(causes), *_config_steps(findings)]
    recommendation = candidate(report, status, frozenset(c.cls for c in causes))
    if recommendation is not None:
        steps.extend(recommendation.alternatives)
    if status == "healthy":
        steps.append(
            "correction is optional at this level; if you want it, token-level TIS (decoupled_token_is: "
            "rollout_is token, threshold 2.0) is the robust default"
        )
    steps.extend(_not_examined(report))
    return Verdict(
        status=status,
        headline=_headline(status, causes, size, report, None if recommendation is None else recommendation.setting),
        causes=tuple(causes),
        recommendation=None if recommendation is None else recommendation.prescription,
        next_steps=tuple(steps),
    )


class _Size:
    """How large the mismatch is against published levels, and whether kl is beyond its noise."""

    def __init__(self, report: Report) -> None:
        m, e = report.metrics, report.extras
        self.k3 = m.get("rollout_corr/k3_kl")
        self.kl = m.get("rollout_corr/kl")
        self.abs_mean = e.get("rcdiag/abs_log_ratio_mean")
        self.beyond_noise = kl_beyond_noise(m, e)
        self.large = mismatch_large(m, e)

    @property
    def evidence(self) -> str:
        parts = []
        if self.k3 is not None:
            parts.append(f"k3_kl {self.k3:.3g} ({'above' if self.k3 > NOISE_K3_MAX else 'within'} {NOISE_K3_MAX:g}")
            parts[-1] += ", the top of the dense bf16 range)"
        if self.abs_mean is not None:
            parts.append(
                f"mean |log-ratio| {self.abs_mean:.3g} ({self.abs_mean / BF16_ABS_LOG_RATIO:.2g}x the ~"
                f"{BF16_ABS_LOG_RATIO:g} reported for bf16 dense models)"
            )
        if self.kl is not None and not self.beyond_noise:
            parts.append(f"kl {self.kl:.3g} within {NOISE_SIGMAS:g} standard errors of 0")
        return ", ".join(parts) or "no valid token"


def _causes(findings: tuple[Finding, ...], report: Report) -> list[Cause]:
    by_class: dict[CauseClass, list[Finding]] = {}
    for f in findings:
        cls = CAUSE_OF.get(f.code)
        if cls is not None:
            by_class.setdefault(cls, []).append(f)
    offsets = by_class.get("offset", [])
    if "truncation" in by_class and offsets and all(f.code == "logprob_offset" for f in offsets):
        del by_class["offset"]  # a truncation's missing mass reads as an offset of the capped ratio: not its own
    data = any(f.code not in SIGN_READING for cls in DATA_CLASSES for f in by_class.get(cls, []))
    if data:  # the layout explains the log-ratio's sign and size
        by_class.pop("swapped_columns", None)
        by_class.pop("logprob_mode", None)
        _drop_sign_reading(by_class)
    elif "swapped_columns" in by_class and not swap_consistent(report.extras):
        # kl < 0 on sampled tokens, but exchanging the columns does not make the dump read as noise: the rollout
        # reports log-probs of another distribution than it sampled from (raw log-probs at T != 1, another token's)
        by_class.setdefault("logprob_mode", []).extend(by_class.pop("swapped_columns"))
    if "swapped_columns" in by_class:
        by_class["swapped_columns"].extend(by_class.pop("logprob_mode", []))
    if "swapped_columns" in by_class or "logprob_mode" in by_class:
        _drop_sign_reading(by_class)
    gap = next((f for f in findings if f.code == "kl_k3_disagree"), None)
    if gap is not None and not data and not any(c in by_class for c in ("swapped_columns", "logprob_mode")):
        cls = _gap_class(report, "outliers" in by_class)
        by_class.setdefault(cls, []).append(gap)
        by_class[cls].extend(f for f in findings if f.code in SIZE_CODES)  # its size is the same evidence
    named = [cls for cls in by_class if cls != "unexplained" and STATUS_OF[cls] in ("fix", "broken")]
    if named and "unexplained" in by_class:  # a named bug class explains what is systematic
        del by_class["unexplained"]
    causes = [
        Cause(cls, tuple(dict.fromkeys(f.code for f in group)), _evidence(cls, group, report))
        for cls, group in by_class.items()
    ]
    return sorted(causes, key=lambda c: -_ORDER.index(STATUS_OF[c.cls]))


def _drop_sign_reading(by_class: dict[CauseClass, list[Finding]]) -> None:
    """Drop the detectors that read which side scores a token higher (``SIGN_READING``): on swapped columns, raw
    log-probs or a layout bug they see what the bug made, not a cause of their own."""
    for cls in {CAUSE_OF[code] for code in SIGN_READING}:
        kept = [f for f in by_class.get(cls, []) if f.code not in SIGN_READING]
        if kept:
            by_class[cls] = kept
        else:
            by_class.pop(cls, None)


def _gap_class(report: Report, outliers: bool) -> CauseClass:
    """kl - k3_kl = 1 - mean(ratio): on tokens sampled from the rollout engine the mean ratio is 1 unless the
    trainer's probabilities of them do not sum to 1 over the rollout's support (the rollout renormalised over a
    top-k/top-p subset: mean ratio < 1, kl above k3_kl) or a few huge ratios dominate the mean (k3_kl above kl)."""
    kl, k3 = report.metrics.get("rollout_corr/kl"), report.metrics.get("rollout_corr/k3_kl")
    if outliers or kl is None or k3 is None or kl <= k3:
        return "outliers"
    return "truncation"


def _evidence(cls: CauseClass, group: list[Finding], report: Report) -> str:
    if cls in ("truncation", "outliers") and any(f.code == "kl_k3_disagree" for f in group):
        kl, k3 = report.metrics.get("rollout_corr/kl"), report.metrics.get("rollout_corr/k3_kl")
        if kl is not None and k3 is not None:
            mean_ratio = 1.0 - (kl - k3)
            gap = (
                f"kl {kl:.3g} vs k3_kl {k3:.3g}: the mean ratio pi_train/pi_rollout of the sampled tokens is "
                f"{mean_ratio:.4g}, not 1"
            )
            if cls == "truncation":
                gap += f" (the rollout kept ~{mean_ratio:.1%} of the trainer's mass: renormalised over a subset)"
            else:
                gap += " (a few huge ratios dominate the mean)"
            others = [f.message for f in group if f.code != "kl_k3_disagree"]
            return "; ".join([*(_first_sentence(m) for m in others), gap])
    return "; ".join(_first_sentence(f.message) for f in group)


def _first_sentence(message: str) -> str:
    """A finding's measured statement: its message up to the first sentence end (the rest is advice)."""
    head, sep, _ = message.partition(". ")
    return head if sep else message


def _headline(status: VerdictStatus, causes: list[Cause], size: _Size, report: Report, setting: str | None) -> str:
    names = "; ".join(CLASS_TEXT[c.cls] for c in causes)
    if status == "healthy":
        unexamined = " (bias detectors not run: see next steps)" if report.explain is None else ""
        return f"healthy: the engines agree to numerical noise: {size.evidence}{unexamined}"
    if status == "correct":
        return f"correct: {names} ({size.evidence}); correct it with {setting}"
    if status == "fix":
        return f"fix: {names}, which correction cannot repair: fix the engine or configuration first"
    return f"broken: {names}: the data or the configuration cannot be right as it is"


def _input_steps(findings: Iterable[Finding]) -> list[str]:
    codes = ("mask_looks_inverted", "mask_missing", "metric_not_finite")
    return [f"{f.code}: {finding(f.code).advice}" for f in findings if f.code in codes]


def _fix_steps(causes: list[Cause]) -> list[str]:
    """What to fix first, for each bug class: the advice of its first finding."""
    out = []
    for cause in causes:
        if cause.cls == "unexplained":
            out.append(f"find the systematic difference first; check, in this order: {'; '.join(UNMODELLED)}")
            continue
        if STATUS_OF[cause.cls] in ("fix", "broken"):
            advice = next((finding(code).advice for code in cause.codes if finding(code).advice), "")
            if cause.cls == "logprob_mode":  # never kl_negative's "swapped": that reading was tested and rejected
                advice = finding("logprobs_not_sampled").advice
            if cause.cls == "truncation" and not advice.startswith("Return"):
                advice = (
                    "Return log-probs of the same distribution on both sides: both renormalised over the same "
                    "top-k/top-p set, or both over the full vocabulary."
                )
            if advice:
                out.append(f"fix {cause.cls.replace('_', ' ')} first: {advice}")
    return out


def _config_steps(findings: tuple[Finding, ...]) -> list[str]:
    return [
        f"the configured correction: {f.code}: {finding(f.code).advice}" for f in findings if f.code in CONFIG_CODES
    ]


def _not_examined(report: Report) -> list[str]:
    """What the verdict could not test: ``--explain``'s detectors when they did not run (never read as a pass)."""
    if report.explain is None:
        lacks_ids = "token_ids" in report.input.columns and report.input.columns["token_ids"] is None
        shown = {**DETECTORS, "token_specific": NO_TOKEN_IDS} if lacks_ids else DETECTORS
        tests = "; ".join(text for code, text in shown.items() if code not in DEFAULT_DETECTORS)
        return [f"not examined without --explain: {tests}. Run `rcdiag analyze PATH --explain` to test for them"]
    return [f"{code} not run: {why.removeprefix('not run: ')}" for code, why in report.explain.not_run.items()]
