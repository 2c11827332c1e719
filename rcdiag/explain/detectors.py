"""The five bias detectors every analyze runs (``token_specific``, ``rcdiag.explain.token_detector``, needs
``--explain``'s by-token table): statistic, threshold and evidence (docs/findings.md argues each threshold).

Every detector returns at most one ``Finding`` whose message quotes its evidence and whose ``evidence`` dict
holds the same numbers for machines. Noise is measured, not assumed, with whole responses as the independent
units: the shape detectors (temperature_mismatch, sampling_truncation) test per-response (cluster) means with
Student's t at ``SHAPE_FALSE_ALARM_RATE``; the others keep their sums per hash group (``breakdowns.GROUPS``) and
take the spread between groups as the standard error, firing only when an effect is large *and* beyond ``Z``
standard errors of that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from rcdiag.catalogue.emit import emit
from rcdiag.catalogue.findings import Code, detectors
from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import finding_threshold
from rcdiag.core.forecast import beyond, fit_line, forecast
from rcdiag.core.stats import t_critical
from rcdiag.explain.breakdowns import DOUBLING_EDGES, N_DOUBLING, SUMS, bucket_metrics
from rcdiag.explain.statistics import (
    LIKELY,
    RATIO_CAP,
    SHIFT_TOL,
    UNLIKELY,
    ClusterMean,
    OffsetSums,
    ScaleSums,
    ShapeSums,
    group_spread,
)
from rcdiag.records.report import Finding

DETECTORS = tuple(spec.code for spec in detectors())
"""The detectors' codes, in catalogue order (their wording and advice live in the finding catalogue)."""

Z = 3.0
"""Standard errors an effect must clear beyond its threshold."""
EXP_MAX = 700.0
"""A growth factor reported is at most ``exp(EXP_MAX)`` (finite: a report is JSON without inf)."""
MIN_TOKENS = 2000
"""Fewer valid tokens than this (in the compared sets) leave a detector silent."""
MIN_GROUPS = 8
"""Row groups with data needed for a standard error."""

SHAPE_FALSE_ALARM_RATE = 1e-4
"""temperature_mismatch and sampling_truncation: the chance that noise alone clears a test's critical value (Student's
t, responses as the units; ``shape_critical``), per detector and dump."""
MIN_BUCKET_TOKENS = 200
MIN_RESPONSES = 20
"""temperature_mismatch and sampling_truncation: tokens, and effective responses, needed in each of the unlikely
(trainer p < UNLIKELY) and likely (p >= LIKELY) sets for a standard error."""
TEMPERATURE_MIN_SHIFT = 0.02
"""temperature_mismatch (sharper): the unlikely tokens' mean log-ratio old - rollout must reach this many nats (a
rollout at T = 0.95 gives ~0.06 on the tiny real model; noise gives a negative mean)."""
FLAT_SHARE_MIN = 0.95
"""temperature_mismatch (flatter): share of the moved likely tokens the rollout scores lower (a temperature moves
every one down; noise both ways: at most 0.82 measured where FLAT_MIN_MOVED tokens moved, a 4-bit rollout)."""
FLAT_MIN_MOVED = 100
"""temperature_mismatch (flatter): likely tokens moved by more than SHIFT_TOL needed for that share."""
TRUNCATION_MIN_DEFICIT = 0.003
"""sampling_truncation: the mean capped IS ratio at least this far below 1 (0.3% of the trainer's mass missing)."""
TRUNCATION_SHARE_MIN = 0.05
"""sampling_truncation: net share of tokens scored higher by the rollout (five times the most that sparse outliers,
at most 1% of the tokens by their definition, can carry)."""
OFFSET_MIN = 0.02
"""logprob_offset: the capped mean IS ratio must sit this far from 1 (a 2% probability-mass shift)."""
OFFSET_SHARE_MIN = 0.25
"""logprob_offset: net share of tokens shifted in the offset's direction."""
DRIFT_RATIO_MIN = 3.0
"""position_drift: late-position k3 KL over early-position k3 KL ('several times')."""
DRIFT_LOWER_MIN = 2.0
DRIFT_GROUP_SHARE = 0.8
"""position_drift: at least this share of hash groups must have a late/early ratio above DRIFT_LOWER_MIN."""
DRIFT_ABS_RATIO_MIN = 1.5
"""position_drift: late positions' mean |log-ratio| over the early positions'. Noise whose scale grows gives
sqrt(DRIFT_RATIO_MIN) = 1.73 at the k3 threshold (k3 grows as the square of the scale, |log-ratio| as the scale);
a few huge tokens, which dominate k3 wherever they land, barely move the mean |log-ratio|."""
DRIFT_FLOOR = 1e-5
"""position_drift: late k3 KL below this is numerically negligible whatever its growth."""
EARLY_BUCKETS = (0, 1)
"""Positions [0, 64)."""
LATE_FROM = 4
"""Positions from 256 on."""
TREND_MIN_STEPS = 4
TREND_K3_FLOOR = 1e-10
"""mismatch_trend: a step whose k3_kl is at or below this carries no measurable mismatch (float32 rounding between
identical engines gives ~1e-14; bf16 noise ~1e-4): it is left out of the log fit, where its logarithm would
outweigh every real step (a run whose first step has identical weights, then drifts, would never fire)."""
TREND_GROWTH_MIN = 2.0
"""mismatch_trend: fitted growth of k3_kl over the steps analysed."""
TREND_T_MIN = 4.0
"""mismatch_trend: the growth rate in standard errors of the fit (residual scatter)."""
TREND_HALVES_MIN = 1.4
"""mismatch_trend: the median k3_kl of the later half of the steps over that of the earlier half (one spiking
step cannot move a median)."""
KL, K3_KL, CHI2_TOKEN = Key.KL, Key.K3_KL, Key.CHI2_TOKEN
KL_WARN = finding_threshold(Code.KL_HIGH).limit
CHI2_WARN = finding_threshold(Code.CHI2_TOKEN_HIGH).limit
"""verl's warning thresholds (|kl| > 0.1, chi2_token > 1.0: kl_high's and chi2_token_high's, from the metric
catalogue) projected by the trend."""


class DetectorSums(Protocol):
    """What the detectors read of a state: the default analyze's (``rcdiag.explain.detector_state.DetectorState``)
    or ``--explain``'s (``rcdiag.explain.state.ExplainState``), whose sums are the same."""

    shape: ShapeSums
    scale: ScaleSums
    offset: OffsetSums

    @property
    def position_sums(self) -> np.ndarray: ...


def detect(state: DetectorSums, steps: Sequence[tuple[int, dict[str, float | None]]]) -> list[Finding]:
    """Every detector's finding (none on a healthy dump)."""
    trend = mismatch_trend(steps)
    return [*detect_sums(state), *([] if trend is None else [trend])]


def detect_sums(state: DetectorSums) -> list[Finding]:
    """The findings of the detectors that read the sums alone (all but ``mismatch_trend``, which reads the steps'
    metrics: ``rcdiag sweep`` computes none of its own)."""
    found = [
        temperature_mismatch(state.shape, state.scale),
        logprob_offset(state.offset),
        sampling_truncation(state.shape, state.offset),
        position_drift(state),
    ]
    return [f for f in found if f is not None]


def not_run(state: DetectorSums, steps: Sequence[tuple[int, dict[str, float | None]]]) -> dict[str, str]:
    """Why each detector that had too little data to test did not run (its checklist row shows "–", not ✓)."""
    reasons = {
        Code.TEMPERATURE_MISMATCH: _shape_data(state.shape),
        Code.LOGPROB_OFFSET: _offset_data(state.offset),
        Code.SAMPLING_TRUNCATION: _shape_data(state.shape, ratio=True),
        Code.POSITION_DRIFT: _position_data(state),
        Code.MISMATCH_TREND: _trend_data(steps),
    }
    return {code.value: f"not run: {why}" for code, why in reasons.items() if why is not None}


def _too_few(what: str, have: float, need: int) -> str | None:
    return f"{int(have):,} {what}, needs {need:,}" if have < need else None


def _shape_data(shape: ShapeSums, ratio: bool = False) -> str | None:
    """Why temperature_mismatch (or, with ``ratio``, sampling_truncation) cannot test this dump."""
    tokens = float(shape.cluster("ratio")[0])
    need = [_too_few("valid tokens", tokens, MIN_TOKENS)]
    for name, label in (("unlikely", f"trainer p < {UNLIKELY:g}"), ("likely", f"trainer p >= {LIKELY:g}")):
        n, _, _, _, nn = (float(v) for v in shape.cluster(name))
        need.append(_too_few(f"tokens at {label}", n, MIN_BUCKET_TOKENS))
        need.append(_too_few(f"effective responses with tokens at {label}", n * n / nn if nn > 0 else 0, MIN_RESPONSES))
    if ratio and tokens > 0 and shape.mean("ratio") is None:
        need.append("a log-ratio is NaN (-inf on both sides), so the mean IS ratio is undefined")
    return next((why for why in need if why is not None), None)


def _offset_data(offset: OffsetSums) -> str | None:
    n_col = offset.column("n")
    return _too_few("valid tokens", float(n_col.sum()), MIN_TOKENS) or _too_few(
        "groups of responses with tokens", int((n_col > 0).sum()), MIN_GROUPS
    )


def _position_data(state: DetectorSums) -> str | None:
    per_group = state.position_sums
    early = per_group[:, list(EARLY_BUCKETS)].sum(axis=1)[:, 0]
    late = per_group[:, LATE_FROM:].sum(axis=1)[:, 0]
    return (
        _too_few("tokens at positions < 64", float(early.sum()), MIN_TOKENS)
        or _too_few(f"tokens at positions >= {DOUBLING_EDGES[LATE_FROM]}", float(late.sum()), MIN_TOKENS)
        or _too_few("groups of responses with early and late tokens", int(((early > 0) & (late > 0)).sum()), MIN_GROUPS)
    )


def _trend_data(steps: Sequence[tuple[int, dict[str, float | None]]]) -> str | None:
    if not steps:
        return "the dump has no steps"
    usable = sum(1 for _, m in steps if (v := m.get(K3_KL)) is not None and v > TREND_K3_FLOOR)
    return _too_few(f"step(s) with k3_kl above {TREND_K3_FLOOR:g}", usable, TREND_MIN_STEPS)


# ------------------------------------------------------------------------------------------- temperature


def shape_critical(responses: float) -> float:
    """Standard errors a shape test (temperature_mismatch, sampling_truncation) must clear: Student's t with the
    effective responses less 1 degrees of freedom, one-sided at SHAPE_FALSE_ALARM_RATE / 2 (the two directions
    of temperature_mismatch together at SHAPE_FALSE_ALARM_RATE)."""
    return t_critical(SHAPE_FALSE_ALARM_RATE, max(responses - 1.0, 1.0))


def _shape_means(shape: ShapeSums) -> tuple[ClusterMean, ClusterMean] | None:
    """The mean log-ratio over unlikely and likely tokens, when both have the data for a noise estimate."""
    unlikely, likely = shape.mean("unlikely"), shape.mean("likely")
    if unlikely is None or likely is None:
        return None
    if min(unlikely.tokens, likely.tokens) < MIN_BUCKET_TOKENS or min(unlikely.responses, likely.responses) < (
        MIN_RESPONSES
    ):
        return None
    return unlikely, likely


def temperature_mismatch(shape: ShapeSums, scale: ScaleSums | None = None) -> Finding | None:
    """One side sharper than the other, from the sign of the log-ratio d = old - rollout on the tokens the trainer
    found unlikely (p < UNLIKELY) and likely (p >= LIKELY), each a mean with responses as the units of noise.

    A rollout at T < 1 takes mass from unlikely tokens and gives it to likely ones: d > 0 on the first, d < 0 on
    the second. Noise cannot do that in expectation: the mean d of a set of tokens B is at most log(P_B / Q_B)
    (log-sum inequality; P, Q the trainer's and rollout's mass on B), and noise on either side moves mass towards
    the unlikely tokens (logit noise flattens a softmax in expectation; trainer noise selects the tokens it
    pushed down), so the unlikely tokens' mean d is below 0. Truncation only raises the rollout's log-probs (d <= 0).
    A flatter rollout (T > 1) gives the signs noise gives; it is told from noise by the likely tokens: a
    temperature moves every one of them down, noise moves them both ways.
    """
    means = _shape_means(shape)
    if means is None or float(shape.cluster("ratio")[0]) < MIN_TOKENS:
        return None
    unlikely, likely = means
    critical = shape_critical(min(unlikely.responses, likely.responses))
    moved_up, moved_down = shape.count("likely_up"), shape.count("likely_down")
    moved = moved_up + moved_down
    share_down = moved_down / moved if moved > 0 else 0.0
    if unlikely.mean >= TEMPERATURE_MIN_SHIFT and unlikely.z() >= critical and likely.z() <= -critical:
        direction = "sharper"
    elif (
        unlikely.z() <= -critical
        and likely.z() >= critical
        and moved >= FLAT_MIN_MOVED
        and share_down >= FLAT_SHARE_MIN
    ):
        direction = "flatter"
    else:
        return None
    slopes = ScaleSums.slopes(scale.sums.sum(axis=0)) if scale is not None else None
    evidence = {
        "direction": direction,
        "log_ratio_unlikely": unlikely.mean,
        "std_error_unlikely": unlikely.std_error,
        "tokens_unlikely": int(unlikely.tokens),
        "log_ratio_likely": likely.mean,
        "std_error_likely": likely.std_error,
        "tokens_likely": int(likely.tokens),
        "likely_moved_down_share": share_down if moved > 0 else None,
        "likely_moved": int(moved),
        "critical": critical,
        "slope": slopes[2] if slopes is not None else None,
    }
    sharper = direction == "sharper"
    side = (
        "the rollout engine sampled at a lower temperature than the trainer scored at (or the trainer forgot to "
        "divide its logits by it)"
        if sharper
        else "the rollout engine sampled at a higher temperature than the trainer scored at (or the trainer divided "
        "by a temperature the rollout did not use)"
    )
    how = (
        f"the first is positive (at least {TEMPERATURE_MIN_SHIFT:g} nats), which noise (it flattens a distribution) "
        "and truncation (it only raises the rollout's log-probs) cannot make it"
        if sharper
        else f"{share_down:.0%} of the {int(moved):,} likely tokens moved by more than {SHIFT_TOL} nats moved down "
        f"(at least {FLAT_SHARE_MIN:.0%}; noise moves them both ways)"
    )
    facts = (
        f"the rollout distribution is {direction} than the trainer's: on tokens the trainer gives p < {UNLIKELY:g} "
        f"the log-ratio old - rollout averages {unlikely.mean:+.3g} nats ({unlikely.z():+.3g} standard errors, "
        f"{int(unlikely.tokens):,} tokens), on tokens with p >= {LIKELY:g} {likely.mean:+.3g} ({likely.z():+.3g} "
        f"standard errors; noise stays within {critical:.2f} with responses as the units); {how}"
    )
    value, threshold = (unlikely.mean, TEMPERATURE_MIN_SHIFT) if sharper else (share_down, FLAT_SHARE_MIN)
    return emit(
        Code.TEMPERATURE_MISMATCH,
        facts,
        more=f"Likely cause: {side}.",
        value=value,
        threshold=threshold,
        evidence=evidence,
    )


# ------------------------------------------------------------------------------------------- truncation


def sampling_truncation(shape: ShapeSums, offset: OffsetSums) -> Finding | None:
    """Rollout log-probs renormalised over a truncated set (top-k, top-p): the mean IS ratio below 1 by the missing
    mass, carried by many tokens, and largest where the trainer is unsure.

    For tokens sampled from the rollout, E[pi_train / pi_rollout] is the trainer's probability mass on the tokens
    the rollout can sample: exactly 1 for any two full distributions (noise, temperature), the kept mass M < 1
    under truncation, where every sampled token's rollout log-prob is the trainer's minus log M (d = log M <= 0),
    and M is smallest at the flat positions, where the sampled tokens are unlikely ones.
    """
    ratio = shape.mean("ratio")
    means = _shape_means(shape)
    if ratio is None or means is None or ratio.tokens < MIN_TOKENS:
        return None
    unlikely, likely = means
    critical = shape_critical(ratio.responses)
    n = float(offset.column("n").sum())
    up, down = float(offset.column("up").sum()), float(offset.column("down").sum())
    net_share = (up - down) / n if n > 0 else 0.0
    deficit = -ratio.mean
    gap = unlikely.mean - likely.mean
    gap_se = math.hypot(unlikely.std_error, likely.std_error)
    concentrated = gap < 0 and (gap_se == 0 or -gap / gap_se >= critical)
    significant = deficit >= TRUNCATION_MIN_DEFICIT and -ratio.z() >= critical
    if not significant or net_share < TRUNCATION_SHARE_MIN or not concentrated:
        return None
    kept = 1.0 - deficit
    evidence = {
        "missing_mass": deficit,
        "mean_capped_ratio": kept,
        "std_error": ratio.std_error,
        "critical": critical,
        "share_rollout_higher": up / n,
        "share_trainer_higher": down / n,
        "log_ratio_unlikely": unlikely.mean,
        "log_ratio_likely": likely.mean,
        "tokens": int(ratio.tokens),
        "ratio_cap": RATIO_CAP,
    }
    facts = (
        f"the rollout's log-probs look renormalised over a truncated set: the mean IS ratio (capped at "
        f"{RATIO_CAP:.3g}) is {kept:.4g} ({-ratio.z():.3g} standard errors below 1, noise stays within "
        f"{critical:.2f}); for tokens sampled from the rollout it is the trainer's mass on what the rollout can "
        f"sample, 1 for two full distributions whatever their noise or temperature, so {deficit:.2%} of it is "
        "missing on average"
    )
    more = (
        f"{net_share:.0%} more tokens are scored higher by the rollout than lower (by more than {SHIFT_TOL} nats), "
        f"most where the trainer is unsure: the log-ratio old - rollout averages {unlikely.mean:+.3g} nats at "
        f"trainer p < {UNLIKELY:g} against {likely.mean:+.3g} at p >= {LIKELY:g}."
    )
    return emit(
        Code.SAMPLING_TRUNCATION,
        facts,
        more=more,
        value=deficit,
        threshold=TRUNCATION_MIN_DEFICIT,
        evidence=evidence,
    )


# ------------------------------------------------------------------------------------------------ offset


def logprob_offset(offset: OffsetSums) -> Finding | None:
    """A systematic shift: the capped mean IS ratio away from 1, carried by a large share of tokens.

    When both sides are proper distributions over the same tokens, the mean IS ratio pi_train/pi_rollout of
    tokens sampled from the rollout is exactly 1 in expectation, whatever the noise or temperature. Log-probs
    renormalised over top-k/top-p on one side are not: the mean ratio is the kept probability mass. Capping
    each ratio at RATIO_CAP keeps a few outlier tokens from moving it.
    """
    n_col, capped, up, down = (offset.column(name) for name in OffsetSums.NAMES)
    n = float(n_col.sum())
    if n < MIN_TOKENS:
        return None
    mean_ratio = float(capped.sum()) / n
    groups = [c / k for c, k in zip(capped, n_col, strict=True) if k > 0]
    if len(groups) < MIN_GROUPS or not math.isfinite(mean_ratio):  # NaN log-ratios (-inf on both sides)
        return None
    se = group_spread(groups)
    share = float(up.sum() - down.sum()) / n
    gap = 1.0 - mean_ratio
    if abs(gap) - Z * se <= OFFSET_MIN or abs(share) < OFFSET_SHARE_MIN or (gap > 0) != (share > 0):
        return None
    estimate = -math.log(mean_ratio) if mean_ratio > 0 else math.inf
    higher = "rollout" if gap > 0 else "trainer"
    evidence = {
        "offset": estimate,
        "mean_capped_ratio": mean_ratio,
        "std_error": se,
        "share_shifted": abs(share),
        "share_rollout_higher": float(up.sum()) / n,
        "share_trainer_higher": float(down.sum()) / n,
        "tokens": int(n),
        "ratio_cap": RATIO_CAP,
    }
    facts = (
        f"the {higher} side's log-probs sit systematically higher: estimated offset {abs(estimate):.3g} nats "
        f"(mean IS ratio, capped at {RATIO_CAP:.3g}, is {mean_ratio:.4g} +- {se:.2g}; it is 1 whenever both sides "
        f"are proper distributions over the same tokens), and {abs(share):.0%} more tokens are shifted up than "
        f"down by more than {SHIFT_TOL} nats"
    )
    return emit(Code.LOGPROB_OFFSET, facts, value=abs(estimate), threshold=OFFSET_MIN, evidence=evidence)


# -------------------------------------------------------------------------------------------- position


def _k3(sums: np.ndarray) -> float | None:
    value = bucket_metrics(sums)["k3_kl"]
    return value if value is not None and value > 0 else None


def position_drift(state: DetectorSums) -> Finding | None:
    """Late positions' k3 KL several times the early positions', in the pooled data and in most hash groups.

    Position-independent mismatch gives every hash group a late/early ratio scattered around 1. Requiring the
    pooled ratio *and* the median group's ratio to reach DRIFT_RATIO_MIN, and DRIFT_GROUP_SHARE of the groups
    to exceed DRIFT_LOWER_MIN, keeps a few outlier tokens (which land in one or two groups) from firing it.
    """
    per_group = state.position_sums  # (GROUPS, buckets, sums)
    early = per_group[:, list(EARLY_BUCKETS)].sum(axis=1)
    late = per_group[:, LATE_FROM:].sum(axis=1)
    k3_early, k3_late = _k3(early.sum(axis=0)), _k3(late.sum(axis=0))
    if k3_early is None or k3_late is None or early[:, 0].sum() < MIN_TOKENS or late[:, 0].sum() < MIN_TOKENS:
        return None
    ratio = k3_late / k3_early
    if not math.isfinite(ratio):  # k3_kl overflows with a log-ratio above ~88 (metric_not_finite says so)
        return None
    group_ratios = []
    for group_early, group_late in zip(early, late, strict=True):
        ke, kl = _k3(group_early), _k3(group_late)
        if ke is not None and kl is not None:
            group_ratios.append(kl / ke)
    if len(group_ratios) < MIN_GROUPS:
        return None
    median = float(np.median(group_ratios))
    share = float(np.mean([r > DRIFT_LOWER_MIN for r in group_ratios]))
    if ratio < DRIFT_RATIO_MIN or median < DRIFT_RATIO_MIN or share < DRIFT_GROUP_SHARE or k3_late < DRIFT_FLOOR:
        return None
    pooled_early, pooled_late = early.sum(axis=0), late.sum(axis=0)
    abs_index = SUMS.index("abs_lr")
    abs_early, abs_late = pooled_early[abs_index] / pooled_early[0], pooled_late[abs_index] / pooled_late[0]
    abs_ratio = abs_late / abs_early if abs_early > 0 else math.inf
    if abs_ratio < DRIFT_ABS_RATIO_MIN:
        return None  # k3 grows but the bulk of the tokens does not: a few huge tokens, not drift
    growth = _growth_per_doubling(per_group.sum(axis=0))
    evidence = {
        "ratio": ratio,
        "median_group_ratio": median,
        "abs_log_ratio_ratio": abs_ratio if math.isfinite(abs_ratio) else None,
        "groups_above": share,
        "k3_kl_early": k3_early,
        "k3_kl_late": k3_late,
        "early_positions": [DOUBLING_EDGES[EARLY_BUCKETS[0]], DOUBLING_EDGES[EARLY_BUCKETS[-1] + 1]],
        "late_from": DOUBLING_EDGES[LATE_FROM],
        "growth_per_doubling": growth,
        "tokens_early": int(early[:, 0].sum()),
        "tokens_late": int(late[:, 0].sum()),
    }
    facts = (
        f"mismatch grows along the response: k3_kl is {k3_late:.3g} at positions >= {DOUBLING_EDGES[LATE_FROM]} "
        f"against {k3_early:.3g} at positions < 64 ({ratio:.3g}x; {median:.3g}x in the median of "
        f"{len(group_ratios)} groups of responses dealt by hash, {share:.0%} of them above {DRIFT_LOWER_MIN:g}x; "
        f"mean |log-ratio| {abs_ratio:.3g}x), "
        f"about {growth:.3g}x per doubling of position"
    )
    return emit(Code.POSITION_DRIFT, facts, value=ratio, threshold=DRIFT_RATIO_MIN, evidence=evidence)


def _growth_per_doubling(position: np.ndarray) -> float:
    """exp of the token-weighted least-squares slope of log k3_kl over position buckets (one per doubling)."""
    xs, ys, ws = [], [], []
    total = position[:, 0].sum()
    for k in range(N_DOUBLING):
        value = _k3(position[k])
        if value is not None and position[k, 0] >= 0.01 * total:
            xs.append(k)
            ys.append(math.log(value))
            ws.append(position[k, 0])
    if len(xs) < 2:
        return math.nan
    slope = np.polyfit(xs, ys, 1, w=np.sqrt(ws))[0]
    return _exp(float(slope))


# -------------------------------------------------------------------------------------------------- trend


def mismatch_trend(steps: Sequence[tuple[int, dict[str, float | None]]]) -> Finding | None:
    """k3_kl growing exponentially across steps: a fitted growth of >= 2x that clears the fit's own scatter."""
    read = [(s, m.get(K3_KL)) for s, m in steps]
    points = [(s, v) for s, v in read if v is not None and v > TREND_K3_FLOOR]
    if len(points) < TREND_MIN_STEPS:
        return None
    _, x = _step_axis([p[0] for p in points])
    line = fit_line(x.tolist(), [math.log(v) for _, v in points])
    slope, se = (line.slope, line.slope_se) if line is not None else (0.0, math.inf)
    span = float(x[-1] - x[0])
    growth = _exp(slope * span)
    t = slope / se if se > 0 else math.inf
    half = len(points) // 2
    values = [v for _, v in points]
    halves = float(np.median(values[-half:]) / np.median(values[:half]))
    if growth < TREND_GROWTH_MIN or t < TREND_T_MIN or halves < TREND_HALVES_MIN:
        return None
    crossing = {
        "kl": _crossing(steps, KL, KL_WARN),
        "chi2_token": _crossing(steps, CHI2_TOKEN, CHI2_WARN),
    }
    evidence = {
        "metric": K3_KL,
        "steps": [int(s) for s, _ in points],
        "values": [float(v) for _, v in points],
        "growth_per_step": _exp(slope),
        "growth_over_run": growth,
        "t": t if math.isfinite(t) else None,
        "halves_ratio": halves,
        "crossing_step": crossing,
    }
    limits = (KL_WARN, CHI2_WARN)
    when = "; ".join(f"{k} > {w} {_when(c)}" for (k, c), w in zip(crossing.items(), limits, strict=True))
    facts = (
        f"mismatch grows across training steps: k3_kl rises {_exp(slope):.3g}x per step ({growth:.3g}x from "
        f"step {points[0][0]} to {points[-1][0]}, {t:.3g} standard errors of the fit)"
    )
    return emit(
        Code.MISMATCH_TREND,
        facts,
        more=f"At this rate verl's warnings trip: {when}.",
        value=_exp(slope),
        threshold=TREND_GROWTH_MIN,
        evidence=evidence,
    )


def _crossing(steps: Sequence[tuple[int, dict[str, float | None]]], key: str, threshold: float) -> dict[str, Any]:
    """When the metric's fit on the log scale (``rcdiag.core.forecast``) reaches ``threshold``: the first step at
    or after the expected one (``already`` if the last step is above it; ``None`` without a slope that clears the
    fit's 90% prediction interval)."""
    read = [(s, m.get(key)) for s, m in steps]
    points = [(s, abs(v)) for s, v in read if v is not None and v != 0]
    if len(points) < TREND_MIN_STEPS:
        return {"step": None, "already": False}
    if beyond(points[-1][1], threshold):
        return {"step": int(points[-1][0]), "already": True}
    origin, x = _step_axis([p[0] for p in points])
    made = forecast(x.tolist(), [p[1] for p in points], threshold, scale="log")
    return {"step": None if made is None else origin + math.ceil(made.expected), "already": False}


def _step_axis(steps: list[int]) -> tuple[int, np.ndarray]:
    """The fit's float64 axis and the step at its 0: the steps as they are while float64 holds them exactly (below
    2**53, every dump's usual steps), else counted from the first (a uint64 step of 2**63 and its neighbours would
    round to one float)."""
    if all(abs(step) < 2**53 for step in steps):
        return 0, np.array(steps, dtype=np.float64)
    return steps[0], np.array([step - steps[0] for step in steps], dtype=np.float64)


def _when(crossing: dict[str, Any]) -> str:
    if crossing["already"]:
        return f"already at step {crossing['step']}"
    return f"around step {crossing['step']}" if crossing["step"] is not None else "not projected"


def _exp(x: float) -> float:
    """``exp`` of a fitted log growth, capped at ``exp(EXP_MAX)`` (finite: reports are JSON without inf); k3_kl
    from 1e-300 to 1e3 over a run is a log growth of 700, and ``math.exp`` raises beyond 709.78."""
    return math.exp(min(x, EXP_MAX))
