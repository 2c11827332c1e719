"""The verdict: one status, the causes with their evidence, and one prescription, from a finished report.

The policy (docs/verdict.md): findings name causes (each finding's spec in ``rcdiag.catalogue.findings`` says which
class it is evidence of, its role, whether it reads the log-ratio's sign); the kl/k3 gap names truncation or a heavy
tail; without a named cause, the size of the mismatch against published levels
(``NOISE_K3_MAX``) decides between ``healthy`` and ``correct``, and ``correct`` (class ``noise``) only when the
mismatch passes the precision tests (``rcdiag.diagnosis.signature_rules.precision_tests``): a systematic mismatch that
fits no known signature is ``unexplained`` (status ``fix``), never noise. A ``healthy`` dump whose valid tokens are all
bitwise equal (``rcdiag.sections.exact``) is ``identical``. Only ``correct`` gets a threshold prescription
(``rcdiag.diagnosis.prescribe``); its effect on the dump is measured by the library (``rcdiag.api``), never guessed
here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rcdiag.catalogue import finding
from rcdiag.catalogue.findings import Code, Role, detectors, of_class
from rcdiag.catalogue.keys import Key
from rcdiag.diagnosis.health import outlier_shares, sparse
from rcdiag.diagnosis.prescribe import candidate, optional_correction
from rcdiag.diagnosis.signature_rules import (
    MIN_TOKENS,
    NOISE_K3_MAX,
    NOISE_SIGMAS,
    kl_beyond_noise,
    mismatch_large,
    precision_tests,
    swap_consistent,
)
from rcdiag.metrics.signatures import HISTORY_KEYS
from rcdiag.records.report import Cause, CauseClass, Finding, Report, Verdict, VerdictStatus

DERIVED_CLASSES: dict[CauseClass, str] = {
    "noise": "a large mismatch (size findings, or k3_kl above NOISE_K3_MAX) with no other cause that passes the "
    "precision tests",
    "unexplained": "besides mismatch_not_noise: a large mismatch with no other cause that fails a precision test; "
    "kl_k3_disagree with k3_kl above kl where the outliers are not sparse (a heavy tail over many tokens)",
    "truncation": "besides sampling_truncation: kl_k3_disagree with kl above k3_kl (mass missing)",
    "outliers": "besides sparse_outliers: kl_k3_disagree with k3_kl above kl where the sparse_outliers definition "
    "holds on the dump's log-ratio histogram (a few huge ratios)",
    "logprob_mode": "besides logprobs_not_sampled and logprobs_of_another_token: kl_negative where swapping the "
    "columns does not read as noise",
}
"""Classes the verdict names from what no single finding's spec says (``judge``, ``_causes``); every other class
is some finding's ``cause`` in the catalogue."""

STATUS_OF: dict[CauseClass, VerdictStatus] = {
    "crash": "broken",
    "swapped_columns": "broken",
    "mask": "broken",
    "alignment": "broken",
    "offset": "fix",
    "logprob_mode": "fix",
    "processing": "fix",
    "unexplained": "fix",
    "replica": "fix",
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
HISTORY = "a penalty on repeated tokens (repetition, presence or frequency: it reads the token ids)"
"""The history test (``repeated_tokens_lowered``) not examined: the dump's token ids were not read (analyze reads
them on its own only where the verdict names noise or an unexplained mismatch)."""
NO_HISTORY = (
    "a penalty on repeated tokens (repetition, presence or frequency: it needs token ids: none found in the dump; "
    "--token-col NAME)"
)
"""The history test, on a dump without token ids."""
HISTORY_OPEN: tuple[CauseClass, ...] = ("noise", "unexplained")
"""Classes a penalty on repeated tokens would replace: a verdict naming one of them on a dump whose token ids were not
read asks for the history test (``history_untested``)."""
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
    "processing": "logit processing on one side",
    "unexplained": "a systematic mismatch that fits no known signature",
    "replica": "mismatch concentrated in a subset of rows (one replica, worker or slice)",
}
"""Each class in words, for the headline."""
SIGNS: dict[str, str] = {
    Code.CERTAIN_TOKENS_LOWERED: "large logits compressed: soft-capping",
    Code.REPEATED_TOKENS_LOWERED: "a penalty on repeated tokens",
    Code.LOGPROBS_OF_ANOTHER_TOKEN: "another token's: the most likely one's",
}
"""What a finding that shows one form of its class shows (``processing``'s two, ``logprob_mode``'s top-1 log-probs),
after the class's words in the headline."""
DATA_CLASSES: tuple[CauseClass, ...] = ("mask", "alignment", "offset")
"""Classes that explain the whole log-ratio by the data's layout: with one of them, the classes read from the
log-ratio's sign, size or shape (swapped columns, log-prob mode, processing, the kl/k3 gap, the sign-reading
detectors) name nothing of their own."""
UNMODELLED = (
    "sampling parameters applied on one side only (repetition, presence or frequency penalty, logit bias, "
    "soft-capping, min-p, a temperature)",
    "raw vs processed log-probs (vLLM logprobs_mode)",
    "the alignment of the two columns (a BOS/EOS or one-position shift)",
    "what the mask covers (prompt, padding, tool output)",
    "the engine and model versions and weights on each side",
)
"""What an ``unexplained`` verdict asks to check: the causes rcdiag has no signature for yet."""
_ORDER: tuple[VerdictStatus, ...] = ("identical", "healthy", "correct", "fix", "broken")


def judge(report: Report) -> Verdict:
    """The verdict for ``report`` (its findings and metrics). The prescription's ``effect`` is left ``None``: it
    needs the dump (``rcdiag.api`` measures it)."""
    findings = report.findings
    causes = _causes(findings, report)
    size = _Size(report)
    if not causes and (size.large or any(_is(f, "size") for f in findings)):
        codes = tuple(f.code for f in findings if _is(f, "size"))
        passed, failed = precision_tests(report.metrics, report.extras)
        if failed:
            causes.append(Cause("unexplained", codes, f"{size.evidence}; not precision noise: {'; '.join(failed)}"))
        else:
            tests = f"; consistent with precision noise: {', '.join(passed)}" if passed else ""
            causes.append(Cause("noise", codes, size.evidence + tests))
    status: VerdictStatus = max((STATUS_OF[c.cls] for c in causes), key=_ORDER.index, default="healthy")
    exact = report.sections.get("exact")
    if status == "healthy" and exact is not None and exact.identical:
        status = "identical"  # no mismatch at all: not noise, and nothing the detectors could examine
    steps = [*_input_steps(findings), *_fix_steps(causes), *_config_steps(findings, status)]
    recommendation = candidate(report, status, frozenset(c.cls for c in causes))
    if recommendation is not None:
        steps.extend(recommendation.alternatives)
    if status == "healthy":
        steps.append(optional_correction(report))
    if status != "identical":
        steps.extend(_not_examined(report))
    return Verdict(
        status=status,
        headline=_headline(status, causes, size, report, None if recommendation is None else recommendation.setting),
        causes=tuple(causes),
        recommendation=None if recommendation is None else recommendation.prescription,
        next_steps=tuple(steps),
    )


def history_untested(report: Report) -> bool:
    """The verdict names a class the history test could replace (``HISTORY_OPEN``) and the dump has token ids that
    were not read (``InputFacts.columns`` leaves ``token_ids`` out then; it is ``None`` for a dump without them)."""
    verdict = report.verdict
    if verdict is None or "token_ids" in report.input.columns or report.input.path in ("", "<memory>"):
        return False
    return any(cause.cls in HISTORY_OPEN for cause in verdict.causes)


class _Size:
    """How large the mismatch is against published levels, and whether kl is beyond its noise."""

    def __init__(self, report: Report) -> None:
        m, e = report.metrics, report.extras
        self.k3 = m.get(Key.K3_KL)
        self.kl = m.get(Key.KL)
        self.abs_mean = e.get(Key.ABS_LOG_RATIO_MEAN)
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


def _is(found: Finding, role: Role) -> bool:
    return finding(found.code).role == role


def _reads_sign(found: Finding) -> bool:
    return finding(found.code).reads_sign


def _reads_shape(found: Finding) -> bool:
    return finding(found.code).reads_shape


def _causes(findings: tuple[Finding, ...], report: Report) -> list[Cause]:
    by_class: dict[CauseClass, list[Finding]] = {}
    for f in findings:
        cls = finding(f.code).cause
        if cls is not None:
            by_class.setdefault(cls, []).append(f)
    offsets = by_class.get("offset", [])
    if "truncation" in by_class and offsets and all(f.code == Code.LOGPROB_OFFSET for f in offsets):
        del by_class["offset"]  # a truncation's missing mass reads as an offset of the capped ratio: not its own
    data = any(not _reads_sign(f) for cls in DATA_CLASSES for f in by_class.get(cls, []))
    if data:  # the layout explains the log-ratio's sign, size and shape
        by_class.pop("swapped_columns", None)
        by_class.pop("logprob_mode", None)
        by_class.pop("processing", None)
        _drop_sign_reading(by_class)
    if "processing" in by_class:  # a processor's shape is what the shape-reading detectors see
        _drop(by_class, _reads_shape)
    elif "swapped_columns" in by_class and not swap_consistent(report.extras):
        # kl < 0 on sampled tokens, but exchanging the columns does not make the dump read as noise: the rollout
        # reports log-probs of another distribution than it sampled from (raw log-probs at T != 1, another token's)
        by_class.setdefault("logprob_mode", []).extend(by_class.pop("swapped_columns"))
    if "swapped_columns" in by_class:
        by_class["swapped_columns"].extend(by_class.pop("logprob_mode", []))
    if "swapped_columns" in by_class or "logprob_mode" in by_class:
        _drop_sign_reading(by_class)
    gap = next((f for f in findings if f.code == Code.KL_K3_DISAGREE), None)
    if gap is not None and not data and not any(c in by_class for c in ("swapped_columns", "logprob_mode")):
        cls = _gap_class(report, "outliers" in by_class)
        by_class.setdefault(cls, []).append(gap)
        if cls != "unexplained":
            by_class[cls].extend(f for f in findings if _is(f, "size"))  # its size is the same evidence
    named = [cls for cls in by_class if cls != "unexplained" and STATUS_OF[cls] in ("fix", "broken")]
    if named and "unexplained" in by_class:  # a named bug class explains what is systematic
        del by_class["unexplained"]
    causes = [
        Cause(cls, tuple(dict.fromkeys(f.code for f in group)), _evidence(cls, group, report))
        for cls, group in by_class.items()
    ]
    return sorted(causes, key=lambda c: -_ORDER.index(STATUS_OF[c.cls]))


def _drop_sign_reading(by_class: dict[CauseClass, list[Finding]]) -> None:
    """Drop the findings that read which side scores a token higher (their spec's ``reads_sign``: with the columns
    swapped a 4-bit dump reads as a flatter rollout): on swapped columns, raw log-probs or a layout bug they see
    what the bug made, not a cause of their own."""
    _drop(by_class, _reads_sign)


def _drop(by_class: dict[CauseClass, list[Finding]], dropped: Callable[[Finding], bool]) -> None:
    """Drop the findings ``dropped`` picks from their classes (a class left without a finding goes)."""
    for cls in list(by_class):
        kept = [f for f in by_class[cls] if not dropped(f)]
        if kept:
            by_class[cls] = kept
        else:
            del by_class[cls]


def _gap_class(report: Report, outliers: bool) -> CauseClass:
    """kl - k3_kl = 1 - mean(ratio): on tokens sampled from the rollout engine the mean ratio is 1 unless the
    trainer's probabilities of them do not sum to 1 over the rollout's support (the rollout renormalised over a
    top-k/top-p subset: mean ratio < 1, kl above k3_kl) or a few huge ratios dominate the mean (k3_kl above kl):
    ``outliers`` only where they are few (the ``sparse_outliers`` definition holds on the dump's log-ratio
    histogram); a heavy tail over many tokens is systematic, ``unexplained``."""
    kl, k3 = report.metrics.get(Key.KL), report.metrics.get(Key.K3_KL)
    if not outliers and kl is not None and k3 is not None and kl > k3:
        return "truncation"
    if outliers or (report.log_ratio is not None and sparse(outlier_shares(report.log_ratio))):
        return "outliers"
    return "unexplained"


def _evidence(cls: CauseClass, group: list[Finding], report: Report) -> str:
    if cls in ("truncation", "outliers", "unexplained") and any(f.code == Code.KL_K3_DISAGREE for f in group):
        kl, k3 = report.metrics.get(Key.KL), report.metrics.get(Key.K3_KL)
        if kl is not None and k3 is not None:
            mean_ratio = 1.0 - (kl - k3)
            gap = (
                f"kl {kl:.3g} vs k3_kl {k3:.3g}: the mean ratio pi_train/pi_rollout of the sampled tokens is "
                f"{mean_ratio:.4g}, not 1"
            )
            if cls == "truncation":
                gap += f" (the rollout kept ~{mean_ratio:.1%} of the trainer's mass: renormalised over a subset)"
            elif cls == "outliers":
                gap += " (a few huge ratios dominate the mean)"
            elif report.log_ratio is not None:
                _, share, _ = outlier_shares(report.log_ratio)
                gap += f" ({share:.1%} of the tokens beyond 1 nat: a heavy tail, not sparse outliers)"
            others = [f.facts for f in group if f.code != Code.KL_K3_DISAGREE]
            return "; ".join([*others, gap])
    return "; ".join(f.facts for f in group)


def _headline(status: VerdictStatus, causes: list[Cause], size: _Size, report: Report, setting: str | None) -> str:
    names = "; ".join(_class_text(c) for c in causes)
    if status == "identical":
        compared = report.sections["exact"].tokens_compared
        return f"identical: the two log-prob columns are bitwise identical at all {compared:,} valid tokens"
    if status == "healthy":
        unexamined = " (bias detectors not run: see next steps)" if report.detectors_not_run is None else ""
        return f"healthy: the engines agree to numerical noise: {size.evidence}{unexamined}"
    if status == "correct":
        return f"correct: {names} ({size.evidence}); correct it with {setting}"
    if status == "fix":
        return f"fix: {names}, which correction cannot repair: fix the engine or configuration first"
    return f"broken: {names}: the data or the configuration cannot be right as it is"


def _class_text(cause: Cause) -> str:
    signs = [SIGNS[code] for code in cause.codes if code in SIGNS]
    return CLASS_TEXT[cause.cls] + (f" ({'; '.join(signs)})" if signs else "")


def _input_steps(findings: Iterable[Finding]) -> list[str]:
    return [f"{f.code}: {f.advice}" for f in findings if _is(f, "input")]


def _fix_steps(causes: list[Cause]) -> list[str]:
    """What to fix first, for each bug class (``class_advice``)."""
    out = []
    for cause in causes:
        if cause.cls == "unexplained":
            out.append(f"find the systematic difference first; check, in this order: {'; '.join(UNMODELLED)}")
            continue
        advice = class_advice(cause)
        if STATUS_OF[cause.cls] in ("fix", "broken") and advice:
            out.append(f"fix {cause.cls.replace('_', ' ')} first: {advice}")
    return out


def class_advice(cause: Cause) -> str:
    """What to do about a cause, from the catalogue: its class's ``class_advice`` where a spec of the class has
    one; else the advice of its first finding that is evidence of that class by its spec (never another class's:
    kl_negative's "swapped" under ``logprob_mode``, where swapping was tested and rejected); else, when no finding
    of the class itself shows it, the advice of the class's first spec that has one."""
    specs = of_class(cause.cls)
    declared = next((spec.class_advice for spec in specs if spec.class_advice), None)
    if declared is not None:
        return declared
    own = [finding(code) for code in cause.codes if finding(code).cause == cause.cls]
    return next((spec.advice for spec in own or specs if spec.advice), "")


def _config_steps(findings: tuple[Finding, ...], status: VerdictStatus) -> list[str]:
    """The configured correction's findings; under ``fix`` or ``broken`` without their advice to tune it: no
    threshold is the remedy there, and the correction is chosen again once the cause is fixed."""
    raised = [f for f in findings if _is(f, "configuration")]
    if raised and status in ("fix", "broken"):
        codes = ", ".join(f.code for f in raised)
        return [
            f"the configured correction raises {codes} on this dump: no threshold is the remedy; fix the cause "
            "above, then analyze the dump again to choose one"
        ]
    return [f"the configured correction: {f.code}: {f.advice}" for f in raised]


def _not_examined(report: Report) -> list[str]:
    """What the verdict could not test: each bias detector that did not run, and why, and the history test where the
    token ids were not read or the dump has none (never read as a pass)."""
    columns = report.input.columns
    lacks_ids = "token_ids" in columns and columns["token_ids"] is None
    history = report.extras.get(HISTORY_KEYS[-1]) is None and report.input.valid_tokens >= MIN_TOKENS
    not_run = report.detectors_not_run
    if not_run is None:  # every analyze runs them: a report built from a state without their sums
        tests = [str(spec.detects) for spec in detectors() if spec.code != Code.MISMATCH_TREND]  # the trend ran
        if history:
            tests.append(NO_HISTORY if lacks_ids else HISTORY)
        return [f"not examined (the state holds no detector sums): {'; '.join(tests)}"]
    steps = [f"{code} not run: {why.removeprefix('not run: ')}" for code, why in not_run.items()]
    if history:
        why = NO_HISTORY if lacks_ids else f"{HISTORY}; run `{report.command('analyze', '--explain')}` to test for it"
        steps.append(f"{Code.REPEATED_TOKENS_LOWERED} not run: {why}")
    return steps
