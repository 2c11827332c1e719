"""Health findings: the catalogue's thresholds, the kl/k3_kl noise test, input checks and verl-would-crash notes.

Batch rules run on each batch verl would have seen (each step, or the whole dump when there is no step column);
a rule that fires at several steps gives one finding that lists them and quotes the worst value. Input rules
run once on what was read (the mask, the recorded temperatures, -inf log-probs). Codes, severities and advice
come from ``rcdiag.catalogue``; docs/findings.md documents each statistic and threshold.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

from rcdiag.catalogue.emit import at_steps, emit, ordered
from rcdiag.catalogue.findings import Code, codes_for
from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import (
    DEBUG_PREFIX,
    MetricSpec,
    Threshold,
    finding_threshold,
    known_key,
    rs_key,
    rs_option,
    thresholds_with_findings,
)
from rcdiag.core.formulas import k3
from rcdiag.core.stats import t_critical
from rcdiag.io.registry import FORMATS
from rcdiag.metrics.batch import BatchResult
from rcdiag.records.report import Finding, Histogram, InputFacts
from rcdiag.settings.constants import TEMPERATURE_KEY, TRAIN_TEMPERATURE_KEY
from rcdiag.settings.correction import ResolvedConfig

FINDING_CODES = codes_for("analyze")
"""Every code ``analyze`` can give, in listing order (docs/findings.md)."""
KL_K3_FALSE_ALARM_RATE = 1e-4
"""Chance that the kl/k3_kl test fires anywhere on a clean dump, whatever its number of steps (Šidák)."""
KL_K3_RELATIVE_GAP = 0.5
"""The gap must also exceed this share of the larger KL: a significant but tiny gap is not worth a warning."""
KL_K3_ABS_FLOOR = 1e-5
"""Gaps at or below this are float rounding (bitwise-equal engines have a standard error of 0)."""
IS_SATURATED_SHARE = 0.9
"""is_saturated: share of raw IS ratios beyond the upper threshold from which the correction is a constant."""
OUTLIER_LOG_RATIO = 1.0
"""sparse_outliers: a token is an outlier from |log-ratio| >= 1 nat (a probability off by e); precision noise stays
orders of magnitude below."""
OUTLIER_TOKEN_SHARE = 0.01
"""sparse_outliers: the outliers are sparse when at most this share of the valid tokens."""
OUTLIER_K3_SHARE = 0.5
"""sparse_outliers: ... and they carry at least this share of k3_kl (a lower bound, from the histogram's bin edges)."""
MASK_EMPTY_ROW_SHARE = 0.5
"""More than this share of rows without a valid token: the mask looks inverted."""
FORMATS_WITH_PROMPTS = tuple(f.name for f in FORMATS if f.prompts)
"""Formats whose rows hold prompt and padding (the format registry says which)."""


@dataclass(frozen=True)
class Hit:
    """A rule firing on one batch."""

    code: str
    metric: str | None
    value: float | None
    threshold: float | tuple[float, float] | None
    facts: str
    """The measured statement (``rcdiag.catalogue.emit.emit``'s ``facts``)."""
    badness: float = 0.0
    """Larger is worse; picks the step quoted when the rule fires at several."""
    detail: dict[str, str] = field(default_factory=dict)
    more: str = ""
    """Further measured sentences (``emit``'s ``more``)."""


@dataclass(frozen=True)
class Context:
    """What a batch rule may need beyond its batch."""

    batches: int
    """How many batches (steps) are tested: the kl/k3_kl test corrects for testing them all."""


BatchRule = Callable[[BatchResult, Context], list[Hit]]


def _value(result: BatchResult, key: str) -> float | None:
    """A full key's value (``Key``), an extra's or a verl metric's; a key the catalogue does not declare raises
    (``known_key``) instead of reading ``None``, which would read as healthy."""
    key = known_key(key)
    return result.extras[key] if key in result.extras else result.metrics.get(key)


def _threshold_hit(result: BatchResult, spec: MetricSpec, threshold: Threshold) -> Hit | None:
    value = _value(result, spec.name)
    if value is None or threshold.holds(value):
        return None
    code = threshold.finding
    assert code is not None
    rule = threshold.describe(spec.short)
    facts = _FACTS.get(code, _plain_facts)(result, value, spec.short, rule)
    if facts is None:
        return None
    return Hit(code, spec.name, value, threshold.bound, facts, threshold.badness(value))


def _plain_facts(result: BatchResult, value: float, name: str, rule: str) -> str:
    return f"{name} = {value:.4g}, against {rule}"


def _rs_most_facts(result: BatchResult, value: float, name: str, rule: str) -> str | None:
    if value >= 1.0:
        return None  # rs_rejects_all_tokens says it
    shares = {
        option: share
        for key, share in result.metrics.items()
        if share is not None and (option := rs_option(key)) is not None and key == rs_key(option, "masked_fraction")
    }
    text = f"RS rejects {value:.1%} of the valid tokens (against {rule})"
    if shares:
        option = max(shares, key=lambda o: shares[o])
        text += f"; {option} rejects the most on its own ({shares[option]:.1%})"
    return text


_FACTS: dict[str, Callable[[BatchResult, float, str, str], str | None]] = {"rs_rejects_most_tokens": _rs_most_facts}
"""Findings whose message says more than "metric = value, against the rule" (``None``: do not fire)."""


def _thresholds(result: BatchResult, context: Context) -> list[Hit]:
    hits = (_threshold_hit(result, spec, threshold) for spec, threshold in thresholds_with_findings())
    return [hit for hit in hits if hit is not None]


def kl_k3_critical(tests: int, dof: float | None = None) -> float:
    """Standard errors a gap must exceed so that ``tests`` independent clean batches fire with probability
    ``KL_K3_FALSE_ALARM_RATE`` in all: Šidák's per-test rate 1 - (1 - alpha)^(1/tests), two-sided, from Student's
    t with ``dof`` degrees of freedom (the normal distribution without)."""
    per_test = -math.expm1(math.log1p(-KL_K3_FALSE_ALARM_RATE) / max(tests, 1))
    if dof is None:
        return NormalDist().inv_cdf(1.0 - per_test / 2.0)
    return t_critical(per_test, dof)


def _kl_k3(result: BatchResult, context: Context) -> list[Hit]:
    kl, k3, se = _value(result, Key.KL), _value(result, Key.K3_KL), _value(result, Key.KL_STD_ERROR) or 0.0
    responses = _value(result, Key.KL_STD_ERROR_DOF)
    if kl is None or k3 is None or responses is None or responses < 2.0:
        return []  # fewer than two responses' worth: no noise estimate to test against
    gap = kl - k3
    dof = responses - 1.0
    limit = kl_k3_critical(context.batches, dof)
    tolerance = max(limit * se, KL_K3_RELATIVE_GAP * max(abs(kl), abs(k3)), KL_K3_ABS_FLOOR)
    if abs(gap) <= tolerance:
        return []
    sigmas = f"{abs(gap) / se:.1f}" if se > 0 else "infinitely many"
    steps = f"{context.batches} batches" if context.batches != 1 else "1 batch"
    facts = (
        f"kl ({kl:.3g}) and k3_kl ({k3:.3g}) disagree: kl - k3_kl = 1 - mean(ratio) = {gap:.3g}, {sigmas} standard "
        f"errors of kl (rcdiag/kl_std_error = {se:.3g}, {dof:.3g} degrees of freedom); noise stays within "
        f"{limit:.2f} standard errors over {steps} tested (false-alarm rate {KL_K3_FALSE_ALARM_RATE:g} per dump)"
    )
    return [Hit(Code.KL_K3_DISAGREE, Key.KL, kl, tolerance, facts, abs(gap) / tolerance)]


def kl_negative_limit(se: float, dof: float, tests: int) -> float:
    """How far below 0 a kl must be to fire kl_negative: the kl/k3_kl test's noise limit (same false-alarm rate),
    and never less than its rounding floor."""
    return max(kl_k3_critical(tests, dof) * se, KL_K3_ABS_FLOOR)


def _kl_negative(result: BatchResult, context: Context) -> list[Hit]:
    kl, se = _value(result, Key.KL), _value(result, Key.KL_STD_ERROR) or 0.0
    responses = _value(result, Key.KL_STD_ERROR_DOF)
    if kl is None or responses is None or responses < 2.0:
        return []
    limit = kl_negative_limit(se, responses - 1.0, context.batches)
    if kl >= -limit:
        return []
    sigmas = f"{-kl / se:.1f}" if se > 0 else "infinitely many"
    facts = (
        f"kl = {kl:.4g} is negative by {sigmas} standard errors (rcdiag/kl_std_error = {se:.3g}; noise stays "
        f"within {limit:.3g} at the false-alarm rate {KL_K3_FALSE_ALARM_RATE:g} per dump)"
    )
    return [Hit(Code.KL_NEGATIVE, Key.KL, kl, -limit, facts, -kl / limit)]


def _is_saturated(result: BatchResult, context: Context) -> list[Hit]:
    share = _value(result, Key.ROLLOUT_IS_RATIO_FRACTION_HIGH)
    if share is None or share < IS_SATURATED_SHARE:
        return []
    mean, std = _value(result, Key.ROLLOUT_IS_MEAN), _value(result, Key.ROLLOUT_IS_STD)
    ess = _value(result, Key.ROLLOUT_IS_EFF_SAMPLE_SIZE)
    facts = ", ".join(
        f"{name} = {value:.4g}"
        for name, value in (("rollout_is_mean", mean), ("rollout_is_std", std), ("ESS", ess))
        if value is not None
    )
    statement = (
        f"{share:.1%} of the raw IS ratios exceed the upper threshold (from {IS_SATURATED_SHARE:.0%} the weights are "
        f"a constant){'; ' + facts if facts else ''}"
    )
    key = Key.ROLLOUT_IS_RATIO_FRACTION_HIGH
    return [Hit(Code.IS_SATURATED, key, share, IS_SATURATED_SHARE, statement, share)]


def seq_is_usable_ess() -> float:
    """seq_is_hopeless: verl's documented ESS minimum (the catalogue's is_ess_low bound), applied to untruncated
    sequence weights."""
    return finding_threshold(Code.IS_ESS_LOW).limit


def seq_is_ess(chi2_seq: float) -> float:
    """Effective sample size share of untruncated sequence IS weights: E[w]^2 / E[w^2] = 1 / (1 + chi2_seq)."""
    return 1.0 / (1.0 + chi2_seq) if chi2_seq > -1.0 else 1.0


def _seq_is_hopeless(result: BatchResult, context: Context) -> list[Hit]:
    chi2 = _value(result, Key.CHI2_SEQ)
    floor = seq_is_usable_ess()
    if chi2 is None or seq_is_ess(chi2) >= floor:
        return []
    ess = seq_is_ess(chi2)
    facts = (
        f"chi2_seq = {chi2:.4g}: untruncated sequence IS weights have an effective sample size of "
        f"1 / (1 + chi2_seq) = {ess:.3g} of the responses, below {floor:g}"
    )
    return [Hit(Code.SEQ_IS_HOPELESS, Key.CHI2_SEQ, chi2, 1.0 / floor - 1.0, facts, chi2)]


def outlier_shares(histogram: Histogram) -> tuple[int, float, float]:
    """(outlier tokens, their share of the valid tokens, a lower bound on the share of the k3 sum they carry):
    outliers have |log-ratio| >= OUTLIER_LOG_RATIO; each bin's k3 term e^d - 1 - d is taken at its edge nearest 0
    (the term grows with |d| on both sides), and every other token's at its bin's far edge (an upper bound)."""
    edges = (-math.inf, *histogram.edges, math.inf)
    total = sum(histogram.counts)
    if total == 0:
        return 0, 0.0, 0.0
    outliers, low_k3, high_k3 = 0, 0.0, 0.0
    for i, count in enumerate(histogram.counts):
        if not count:
            continue
        lo, hi = edges[i], edges[i + 1]
        near = 0.0 if lo < 0.0 < hi else (hi if hi <= 0.0 else lo)
        far = max(abs(lo), abs(hi))
        far = -far if hi <= 0.0 else far
        if abs(near) >= OUTLIER_LOG_RATIO:
            outliers += count
            low_k3 += count * _k3_term(near)
        else:
            high_k3 += count * _k3_term(far) if math.isfinite(far) else math.inf
    share = low_k3 / (low_k3 + high_k3) if low_k3 > 0 else 0.0
    return outliers, outliers / total, share


def _k3_term(d: float) -> float:
    return k3(math.expm1(min(d, 700.0)), d)


def sparse(shares: tuple[int, float, float]) -> bool:
    """The ``sparse_outliers`` definition on ``outlier_shares``' result: some outliers, at most
    ``OUTLIER_TOKEN_SHARE`` of the tokens, carrying at least ``OUTLIER_K3_SHARE`` of k3_kl."""
    count, share, k3_share = shares
    return count > 0 and share <= OUTLIER_TOKEN_SHARE and k3_share >= OUTLIER_K3_SHARE


def _sparse_outliers(result: BatchResult, context: Context) -> list[Hit]:
    if result.log_ratio is None:
        return []
    count, share, k3_share = shares = outlier_shares(result.log_ratio)
    if not sparse(shares):
        return []
    facts = (
        f"{count:,} tokens ({share:.3%} of the valid tokens) have |log-ratio| >= {OUTLIER_LOG_RATIO:g} and carry at "
        f"least {k3_share:.0%} of k3_kl (from the log-ratio histogram)"
    )
    return [Hit(Code.SPARSE_OUTLIERS, None, k3_share, OUTLIER_K3_SHARE, facts, k3_share)]


def _rs_all(result: BatchResult, context: Context) -> list[Hit]:
    value = _value(result, Key.ROLLOUT_RS_MASKED_FRACTION)
    if value is None or value < 1.0:
        return []
    facts = "rejection sampling rejects every valid token of the batch"
    return [Hit(Code.RS_REJECTS_ALL_TOKENS, Key.ROLLOUT_RS_MASKED_FRACTION, value, 1.0, facts, value)]


def _not_finite(result: BatchResult, context: Context) -> list[Hit]:
    hits = []
    for key, value in result.raw.items():
        if value is None or math.isfinite(value) or key.startswith(DEBUG_PREFIX):
            continue  # verl's debug metrics are NaN by definition (no token; one token's std; a corr without spread)
        hint = "a log-ratio above ~88 overflows exp() in float32" if key.endswith("k3_kl") else "inf or NaN"
        facts = f"{key} is {value} ({hint}); it is reported as null."
        hits.append(Hit(Code.METRIC_NOT_FINITE, key, None, None, facts, detail={key: str(value)}))
    return hits


def _crashes(result: BatchResult, context: Context) -> list[Hit]:
    return [Hit(c.code, c.metric, None, None, c.message) for c in result.crashes]


BATCH_RULES: tuple[BatchRule, ...] = (
    _crashes,
    _thresholds,
    _kl_k3,
    _kl_negative,
    _is_saturated,
    _seq_is_hopeless,
    _sparse_outliers,
    _rs_all,
    _not_finite,
)
"""Every rule run per batch."""
CONTEXT_RULES: tuple[BatchRule, ...] = (_kl_k3, _kl_negative)
"""The batch rules that read the context (how many batches are tested): a batch's hits change as batches are added."""
NORMAL_MARGIN = 0.999
"""``could_fire_in_context`` compares against this share of the normal critical value (Student's t, never below it,
is a numerical root: the margin covers its rounding)."""

StepHits = Callable[[int | None, BatchResult, Context], list[Hit]]
"""A batch's hits: every batch rule's, in ``BATCH_RULES`` order (``evaluate``'s ``step_hits``)."""


def batch_hits(step: int | None, result: BatchResult, context: Context) -> list[Hit]:
    """Every batch rule's hits on one batch."""
    return [hit for rule in BATCH_RULES for hit in rule(result, context)]


def could_fire_in_context(result: BatchResult, tests: int) -> bool:
    """Whether a context rule (kl/k3_kl, kl_negative) may fire on ``result`` among ``tests`` batches. Both compare
    against Student's t critical value, never below the normal one: a batch within the normal bound fires neither
    (``False``), and t's quantile, the costly part of a report of many steps, is not computed for it."""
    kl, k3, se = _value(result, Key.KL), _value(result, Key.K3_KL), _value(result, Key.KL_STD_ERROR) or 0.0
    if kl is None or not all(math.isfinite(v) for v in (kl, se, 0.0 if k3 is None else k3)):
        return True  # the rules themselves say what a missing or non-finite value does
    normal = NORMAL_MARGIN * kl_k3_critical(tests) * se
    if k3 is not None and abs(kl - k3) > max(normal, KL_K3_RELATIVE_GAP * max(abs(kl), abs(k3)), KL_K3_ABS_FLOOR):
        return True
    return kl < -max(normal, KL_K3_ABS_FLOOR)


def evaluate(
    batches: list[tuple[int | None, BatchResult]],
    resolved: ResolvedConfig,
    facts: InputFacts | None = None,
    *,
    step_hits: StepHits = batch_hits,
) -> list[Finding]:
    """Findings for a dump: input rules once, batch rules on every batch grouped by code (and metric). ``step_hits``:
    a batch's hits (``rcdiag watch`` keeps those that do not depend on the other batches)."""
    findings = _config_findings(resolved) + (_input_findings(facts) if facts is not None else [])
    grouped: dict[tuple[str, str | None], list[tuple[int | None, Hit]]] = {}
    context = Context(batches=len(batches))
    for step, result in batches:
        for hit in step_hits(step, result, context):
            grouped.setdefault((hit.code, hit.metric), []).append((step, hit))
    neg_inf = next((f for f in findings if f.code == "logprob_neg_inf"), None)
    with_steps = any(step is not None for step, _ in batches)
    not_finite: dict[str, str] = {}
    for (code, _metric), hits in grouped.items():
        if code == "metric_not_finite" and neg_inf is not None:
            for step, hit in hits:  # the cause is already named: keep the per-metric detail in its finding
                not_finite.update({k if step is None else f"step {step}: {k}": v for k, v in hit.detail.items()})
            continue
        findings.append(_grouped(code, hits, with_steps, len(batches)))
    if neg_inf is not None and not_finite:
        findings[findings.index(neg_inf)] = dataclasses.replace(neg_inf, detail=not_finite)
    return ordered(findings)


def _grouped(code: str, hits: list[tuple[int | None, Hit]], with_steps: bool, total: int) -> Finding:
    worst_step, worst = max(hits, key=lambda item: item[1].badness)
    detail = {k: v for _, hit in hits for k, v in hit.detail.items()} or None
    facts, steps = worst.facts, None
    if with_steps:
        steps = tuple(sorted(int(step) for step, _ in hits if step is not None))
        facts = f"{at_steps(steps, total)}; worst at step {worst_step}: {facts}"
    return emit(
        code,
        facts,
        more=worst.more,
        value=worst.value,
        threshold=worst.threshold,
        metric=worst.metric,
        steps=steps,
        detail=detail,
    )


def _config_findings(resolved: ResolvedConfig) -> list[Finding]:
    config = resolved.config
    if not (config.bypass_mode and config.loss_type == "ppo_clip" and resolved.is_spec is not None):
        return []
    return [
        emit(
            Code.IS_WEIGHTS_UNUSED,
            "bypass mode with loss_type=ppo_clip computes the IS metrics but never applies the weights: "
            "the PPO ratio pi_theta/pi_rollout already corrects",
        )
    ]


def _input_findings(facts: InputFacts) -> list[Finding]:
    out: list[Finding] = []

    def add(code: str, facts: str, value: float | None = None, threshold: float | None = None, more: str = "") -> None:
        out.append(emit(code, facts, more=more, value=value, threshold=threshold))

    if facts.valid_tokens and facts.empty_rows / facts.rows > MASK_EMPTY_ROW_SHARE:  # none valid: a crash finding
        add(
            "mask_looks_inverted",
            f"{facts.empty_rows:,} of {facts.rows:,} rows have no valid token (more than "
            f"{MASK_EMPTY_ROW_SHARE:.0%}) and {facts.valid_tokens:,} of {facts.tokens:,} tokens are valid: the mask "
            "looks inverted (1 at prompt or padding) or belongs to another column",
            facts.empty_rows / facts.rows,
            MASK_EMPTY_ROW_SHARE,
        )
    kinds = set(re.split(r"[^\w-]+", facts.format))  # "nemo-rl", "nemo-rl, 3 files", "a+b" for merged states
    if kinds & set(FORMATS_WITH_PROMPTS) and facts.columns.get("response_mask", "") is None:
        add(
            "mask_missing",
            f"this {facts.format} dump has no mask key, so every position counts as a response token, prompt and "
            f"padding included ({facts.valid_tokens:,} valid tokens of {facts.tokens:,})",
        )
    temperatures = [_positive(facts.metadata.get(key)) for key in (TEMPERATURE_KEY, TRAIN_TEMPERATURE_KEY)]
    rollout_t, train_t = temperatures
    if rollout_t is not None and train_t is not None and rollout_t != train_t:
        add(
            "temperature_recorded_mismatch",
            f"the dump records a rollout temperature of {rollout_t:g} but a trainer temperature of {train_t:g}",
            train_t,
            rollout_t,
        )
    neg_inf = {side: n for side, n in facts.neg_inf_tokens.items() if n}
    if neg_inf:
        counts = " and ".join(f"{n:,} in {side}" for side, n in neg_inf.items())
        firsts = sorted((tuple(at), side) for side, at in facts.neg_inf_first.items() if side in neg_inf)
        where = (
            f"; the first is in {firsts[0][1]} at row {firsts[0][0][0]}, position {firsts[0][0][1]}" if firsts else ""
        )
        add(
            "logprob_neg_inf",
            f"{sum(neg_inf.values()):,} valid tokens have a -inf log-prob ({counts}){where}",
            float(sum(neg_inf.values())),
            more="kl, k3_kl, the PPL metrics and the rcdiag/abs_log_ratio_* extras are infinite there and reported as "
            "null.",
        )
    return out


def _positive(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
