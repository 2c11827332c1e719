"""Health findings: verl's documented thresholds, the kl/k3_kl agreement check, and verl-would-crash notes.

Rules run on each batch verl would have seen (each step, or the whole dump when there is no step column).
A rule that fires at several steps gives one finding that lists them and quotes the worst value. Every code is
documented in docs/findings.md; codes are stable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rcdiag.config import ResolvedConfig
from rcdiag.metrics.batch import BatchResult
from rcdiag.report import Finding, Severity

IS_MEAN_RANGE = (0.5, 2.0)
ESS_MIN = 0.3
IS_STD_MAX = 1.0
KL_ABS_MAX = 0.1
CHI2_TOKEN_MAX = 1.0
KL_K3_RELATIVE_GAP = 0.5
KL_K3_SIGMAS = 3.0
KL_K3_ABS_FLOOR = 1e-5

P = "rollout_corr/"


@dataclass(frozen=True)
class Hit:
    """A rule firing on one batch."""

    code: str
    severity: Severity
    metric: str | None
    value: float | None
    threshold: float | tuple[float, float] | None
    message: str
    badness: float = 0.0
    """Larger is worse; picks the step quoted when the rule fires at several."""


Rule = Callable[[BatchResult], list[Hit]]


def _value(result: BatchResult, key: str) -> float | None:
    return result.metrics.get(key) if key.startswith(P) else result.extras.get(key)


def _is_mean(result: BatchResult) -> list[Hit]:
    value = _value(result, P + "rollout_is_mean")
    lo, hi = IS_MEAN_RANGE
    if value is None or lo <= value <= hi:
        return []
    return [
        Hit(
            "is_mean_out_of_range",
            "warning",
            P + "rollout_is_mean",
            value,
            IS_MEAN_RANGE,
            f"IS weights average {value:.4g}, outside [{lo}, {hi}]: the two engines' log-probs differ "
            "systematically, not by noise. Check that the rollout engine returns log-probs of the sampled "
            "tokens (calculate_log_probs), that both sides use the same temperature and sampling filters, and "
            "the log-prob plumbing.",
            abs(math.log(max(value, 1e-300))),
        )
    ]


def _ess(result: BatchResult) -> list[Hit]:
    value = _value(result, P + "rollout_is_eff_sample_size")
    if value is None or value >= ESS_MIN:
        return []
    return [
        Hit(
            "is_ess_low",
            "warning",
            P + "rollout_is_eff_sample_size",
            value,
            ESS_MIN,
            f"effective sample size is {value:.3g} of the batch (< {ESS_MIN}): a few tokens or sequences "
            "carry most of the IS weight, so the corrected gradient is high-variance. Tighten the IS "
            "threshold, or reject outliers with length-normalised RS (seq_mean_k1 'Geo-RS', or seq_mean_k3).",
            -value,
        )
    ]


def _std(result: BatchResult) -> list[Hit]:
    value = _value(result, P + "rollout_is_std")
    if value is None or value <= IS_STD_MAX:
        return []
    return [
        Hit(
            "is_std_high",
            "warning",
            P + "rollout_is_std",
            value,
            IS_STD_MAX,
            f"IS weights have standard deviation {value:.3g} (> {IS_STD_MAX}): high-variance correction. "
            "Tighten the IS threshold or add length-normalised RS.",
            value,
        )
    ]


def _kl(result: BatchResult) -> list[Hit]:
    value = _value(result, P + "kl")
    if value is None or abs(value) <= KL_ABS_MAX:
        return []
    return [
        Hit(
            "kl_high",
            "warning",
            P + "kl",
            value,
            KL_ABS_MAX,
            f"|kl| = {abs(value):.3g} (> {KL_ABS_MAX}): training and rollout disagree far beyond numerical "
            "noise (k3 KL typically runs 1e-5..1e-3 on dense models, 1e-3..1e-1 on MoE). Likely causes: "
            "temperature applied on one side only, top-k/top-p log-probs not renormalised alike, a stale or "
            "different checkpoint, or misaligned token positions.",
            abs(value),
        )
    ]


def _chi2(result: BatchResult) -> list[Hit]:
    value = _value(result, P + "chi2_token")
    if value is None or value <= CHI2_TOKEN_MAX:
        return []
    return [
        Hit(
            "chi2_token_high",
            "warning",
            P + "chi2_token",
            value,
            CHI2_TOKEN_MAX,
            f"chi2_token = {value:.3g} (> {CHI2_TOKEN_MAX}): the second moment of the token IS ratio is "
            "large, so some tokens have ratios far above 1. Token-level IS needs a tight cap, or reject "
            "those tokens (token_k1/token_k3 RS).",
            value,
        )
    ]


def _kl_k3(result: BatchResult) -> list[Hit]:
    kl = _value(result, P + "kl")
    k3 = _value(result, P + "k3_kl")
    se = _value(result, "rcdiag/kl_std_error")
    if kl is None or k3 is None:
        return []
    gap = kl - k3
    tolerance = max(KL_K3_RELATIVE_GAP * max(abs(kl), abs(k3)), KL_K3_SIGMAS * (se or 0.0), KL_K3_ABS_FLOOR)
    if abs(gap) <= tolerance:
        return []
    return [
        Hit(
            "kl_k3_disagree",
            "warning",
            P + "kl",
            kl,
            tolerance,
            f"kl ({kl:.3g}) and k3_kl ({k3:.3g}) disagree: kl - k3_kl = 1 - mean(ratio) = {gap:.3g}. Both "
            "estimate KL(rollout || training) and agree when the mismatch is small noise, because the mean "
            "ratio pi_train/pi_rollout of tokens sampled from the rollout policy is 1. A gap beyond noise means "
            "a systematic shift: the rollout log-probs are not those of the distribution that sampled the "
            "tokens (top-k/top-p truncation renormalised on one side, a constant offset, shifted positions).",
            abs(gap) / max(tolerance, 1e-300),
        )
    ]


def _rs_all(result: BatchResult) -> list[Hit]:
    value = _value(result, P + "rollout_rs_masked_fraction")
    if value is None or value < 1.0:
        return []
    return [
        Hit(
            "rs_rejects_all_tokens",
            "warning",
            P + "rollout_rs_masked_fraction",
            value,
            1.0,
            "rejection sampling rejects every valid token of the batch: the step trains on nothing. (verl "
            "<= v0.7.1 crashed here: 'Expected at least one valid token in response_mask'.) Loosen the RS "
            "thresholds.",
            value,
        )
    ]


def _not_finite(result: BatchResult) -> list[Hit]:
    hits = []
    for key, value in result.raw.items():
        if value is None or math.isfinite(value):
            continue
        hint = "a log-ratio above ~88 overflows exp() in float32" if key.endswith("k3_kl") else "inf or NaN"
        hits.append(
            Hit(
                "metric_not_finite",
                "warning",
                key,
                None,
                None,
                f"{key} is {value} ({hint}); it is reported as null.",
            )
        )
    return hits


def _crashes(result: BatchResult) -> list[Hit]:
    return [Hit(c.code, "error", c.metric, None, None, c.message) for c in result.crashes]


RULES: tuple[Rule, ...] = (_crashes, _is_mean, _ess, _std, _kl, _chi2, _kl_k3, _rs_all, _not_finite)
"""Every rule, in the order findings are listed."""

FINDING_CODES = (
    "verl_crash_empty_batch",
    "verl_crash_ess_zero_division",
    "is_mean_out_of_range",
    "is_ess_low",
    "is_std_high",
    "kl_high",
    "chi2_token_high",
    "kl_k3_disagree",
    "rs_rejects_all_tokens",
    "metric_not_finite",
    "is_weights_unused",
)


def evaluate(batches: list[tuple[int | None, BatchResult]], resolved: ResolvedConfig) -> list[Finding]:
    """Findings for a dump: the rules on every batch, grouped by code (and metric) across steps."""
    findings: list[Finding] = []
    config = resolved.config
    if config.bypass_mode and config.loss_type == "ppo_clip" and resolved.is_spec is not None:
        findings.append(
            Finding(
                "is_weights_unused",
                "info",
                "bypass mode with loss_type=ppo_clip computes the IS metrics but never applies the weights: "
                "the PPO ratio pi_theta/pi_rollout already corrects. Use loss_type=reinforce to apply them.",
            )
        )
    grouped: dict[tuple[str, str | None], list[tuple[int | None, Hit]]] = {}
    for step, result in batches:
        for rule in RULES:
            for hit in rule(result):
                grouped.setdefault((hit.code, hit.metric), []).append((step, hit))
    with_steps = any(step is not None for step, _ in batches)
    total = len(batches)
    for (code, _metric), hits in grouped.items():
        worst_step, worst = max(hits, key=lambda item: item[1].badness)
        if not with_steps:
            findings.append(Finding(code, worst.severity, worst.message, worst.metric, worst.value, worst.threshold))
            continue
        steps = tuple(sorted(int(step) for step, _ in hits if step is not None))
        if len(steps) < total:
            listed = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
            where = f"at {len(steps)} of {total} steps ({listed})"
        else:
            where = f"at all {total} steps"
        message = f"{where}; worst at step {worst_step}: {worst.message}"
        findings.append(Finding(code, worst.severity, message, worst.metric, worst.value, worst.threshold, steps=steps))
    order = {code: i for i, code in enumerate(FINDING_CODES)}
    severity_rank = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (severity_rank[f.severity], order.get(f.code, 99)))
    return findings
