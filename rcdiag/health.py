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

from rcdiag.catalogue import finding, full_key
from rcdiag.catalogue.findings import codes_for, listing_order
from rcdiag.catalogue.metrics import MetricSpec, Threshold, rs_option, thresholds_with_findings
from rcdiag.config import ResolvedConfig
from rcdiag.constants import TEMPERATURE_KEY, TRAIN_TEMPERATURE_KEY
from rcdiag.io.registry import FORMATS
from rcdiag.metrics.batch import BatchResult
from rcdiag.report import Finding, InputFacts
from rcdiag.stats import t_critical

FINDING_CODES = codes_for("analyze")
"""Every code ``analyze`` can give, in listing order (docs/findings.md)."""
KL_K3_FALSE_ALARM_RATE = 1e-4
"""Chance that the kl/k3_kl test fires anywhere on a clean dump, whatever its number of steps (Šidák)."""
KL_K3_RELATIVE_GAP = 0.5
"""The gap must also exceed this share of the larger KL: a significant but tiny gap is not worth a warning."""
KL_K3_ABS_FLOOR = 1e-5
"""Gaps at or below this are float rounding (bitwise-equal engines have a standard error of 0)."""
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
    message: str
    badness: float = 0.0
    """Larger is worse; picks the step quoted when the rule fires at several."""
    detail: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What a batch rule may need beyond its batch."""

    batches: int
    """How many batches (steps) are tested: the kl/k3_kl test corrects for testing them all."""


BatchRule = Callable[[BatchResult, Context], list[Hit]]


def _value(result: BatchResult, key: str) -> float | None:
    key = full_key(key)
    return result.extras[key] if key in result.extras else result.metrics.get(key)


def _threshold_hit(result: BatchResult, spec: MetricSpec, threshold: Threshold) -> Hit | None:
    value = _value(result, spec.key)
    if value is None or threshold.holds(value):
        return None
    code = threshold.finding
    assert code is not None
    rule = threshold.describe(spec.short)
    facts = _FACTS.get(code, _plain_facts)(result, value, spec.short, rule)
    if facts is None:
        return None
    return Hit(code, spec.name, value, threshold.bound, f"{facts}. {finding(code).advice}", threshold.badness(value))


def _plain_facts(result: BatchResult, value: float, name: str, rule: str) -> str:
    return f"{name} = {value:.4g}, against {rule}"


def _rs_most_facts(result: BatchResult, value: float, name: str, rule: str) -> str | None:
    if value >= 1.0:
        return None  # rs_rejects_all_tokens says it
    shares = {
        option: share
        for key, share in result.metrics.items()
        if share is not None
        and (option := rs_option(key)) is not None
        and key == full_key(f"rollout_rs_{option}_masked_fraction")
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
    kl, k3, se = _value(result, "kl"), _value(result, "k3_kl"), _value(result, "rcdiag/kl_std_error") or 0.0
    responses = _value(result, "rcdiag/kl_std_error_dof")
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
    message = (
        f"kl ({kl:.3g}) and k3_kl ({k3:.3g}) disagree: kl - k3_kl = 1 - mean(ratio) = {gap:.3g}, {sigmas} standard "
        f"errors of kl (rcdiag/kl_std_error = {se:.3g}, {dof:.3g} degrees of freedom); noise stays within "
        f"{limit:.2f} standard errors over {steps} tested (false-alarm rate {KL_K3_FALSE_ALARM_RATE:g} per dump). "
        + finding("kl_k3_disagree").advice
    )
    return [Hit("kl_k3_disagree", full_key("kl"), kl, tolerance, message, abs(gap) / tolerance)]


def _rs_all(result: BatchResult, context: Context) -> list[Hit]:
    value = _value(result, "rollout_rs_masked_fraction")
    if value is None or value < 1.0:
        return []
    code = "rs_rejects_all_tokens"
    message = f"rejection sampling rejects every valid token of the batch. {finding(code).advice}"
    return [Hit(code, full_key("rollout_rs_masked_fraction"), value, 1.0, message, value)]


def _not_finite(result: BatchResult, context: Context) -> list[Hit]:
    hits = []
    for key, value in result.raw.items():
        if value is None or math.isfinite(value):
            continue
        hint = "a log-ratio above ~88 overflows exp() in float32" if key.endswith("k3_kl") else "inf or NaN"
        message = f"{key} is {value} ({hint}); it is reported as null."
        hits.append(Hit("metric_not_finite", key, None, None, message, detail={key: str(value)}))
    return hits


def _crashes(result: BatchResult, context: Context) -> list[Hit]:
    return [Hit(c.code, c.metric, None, None, c.message) for c in result.crashes]


BATCH_RULES: tuple[BatchRule, ...] = (_crashes, _thresholds, _kl_k3, _rs_all, _not_finite)
"""Every rule run per batch."""


def evaluate(
    batches: list[tuple[int | None, BatchResult]], resolved: ResolvedConfig, facts: InputFacts | None = None
) -> list[Finding]:
    """Findings for a dump: input rules once, batch rules on every batch grouped by code (and metric)."""
    findings = _config_findings(resolved) + (_input_findings(facts) if facts is not None else [])
    grouped: dict[tuple[str, str | None], list[tuple[int | None, Hit]]] = {}
    context = Context(batches=len(batches))
    for step, result in batches:
        for rule in BATCH_RULES:
            for hit in rule(result, context):
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
    findings.sort(key=lambda f: listing_order(f.code, f.severity))
    return findings


def _grouped(code: str, hits: list[tuple[int | None, Hit]], with_steps: bool, total: int) -> Finding:
    worst_step, worst = max(hits, key=lambda item: item[1].badness)
    severity = finding(code).severity
    detail = {k: v for _, hit in hits for k, v in hit.detail.items()} or None
    if not with_steps:
        return Finding(code, severity, worst.message, worst.metric, worst.value, worst.threshold, detail=detail)
    steps = tuple(sorted(int(step) for step, _ in hits if step is not None))
    if len(steps) < total:
        listed = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
        where = f"at {len(steps)} of {total} steps ({listed})"
    else:
        where = f"at all {total} steps"
    message = f"{where}; worst at step {worst_step}: {worst.message}"
    return Finding(code, severity, message, worst.metric, worst.value, worst.threshold, steps=steps, detail=detail)


def _config_findings(resolved: ResolvedConfig) -> list[Finding]:
    config = resolved.config
    if not (config.bypass_mode and config.loss_type == "ppo_clip" and resolved.is_spec is not None):
        return []
    return [
        Finding(
            "is_weights_unused",
            finding("is_weights_unused").severity,
            "bypass mode with loss_type=ppo_clip computes the IS metrics but never applies the weights: "
            "the PPO ratio pi_theta/pi_rollout already corrects. Use loss_type=reinforce to apply them.",
        )
    ]


def _input_findings(facts: InputFacts) -> list[Finding]:
    out: list[Finding] = []

    def add(code: str, message: str, value: float | None = None, threshold: float | None = None) -> None:
        spec = finding(code)
        out.append(Finding(code, spec.severity, f"{message} {spec.advice}", None, value, threshold))

    if facts.valid_tokens and facts.empty_rows / facts.rows > MASK_EMPTY_ROW_SHARE:  # none valid: a crash finding
        add(
            "mask_looks_inverted",
            f"{facts.empty_rows:,} of {facts.rows:,} rows have no valid token (more than "
            f"{MASK_EMPTY_ROW_SHARE:.0%}) and {facts.valid_tokens:,} of {facts.tokens:,} tokens are valid: the mask "
            "looks inverted (1 at prompt or padding) or belongs to another column.",
            facts.empty_rows / facts.rows,
            MASK_EMPTY_ROW_SHARE,
        )
    kinds = set(re.split(r"[^\w-]+", facts.format))  # "nemo-rl", "nemo-rl, 3 files", "a+b" for merged states
    if kinds & set(FORMATS_WITH_PROMPTS) and facts.columns.get("response_mask", "") is None:
        add(
            "mask_missing",
            f"this {facts.format} dump has no mask key, so every position counts as a response token, prompt and "
            f"padding included ({facts.valid_tokens:,} valid tokens of {facts.tokens:,}).",
        )
    temperatures = [_positive(facts.metadata.get(key)) for key in (TEMPERATURE_KEY, TRAIN_TEMPERATURE_KEY)]
    rollout_t, train_t = temperatures
    if rollout_t is not None and train_t is not None and rollout_t != train_t:
        add(
            "temperature_recorded_mismatch",
            f"the dump records a rollout temperature of {rollout_t:g} but a trainer temperature of {train_t:g}.",
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
            f"{sum(neg_inf.values()):,} valid tokens have a -inf log-prob ({counts}){where}. kl, k3_kl, the PPL "
            "metrics and the rcdiag/abs_log_ratio_* extras are infinite there and reported as null.",
            float(sum(neg_inf.values())),
        )
    return out


def _positive(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
