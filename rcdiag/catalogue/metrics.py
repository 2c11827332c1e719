"""Every metric rcdiag reports: its key, table group, reading, and the thresholds that judge it.

Each key is spelled once, in ``rcdiag.catalogue.keys`` (``Key.KL`` is ``rollout_corr/kl``; verl's debug metrics and
rcdiag's own under ``training/`` and ``rcdiag/``); the specs and every module that computes or reads a metric name it
from there. A per-option RS key is declared once as a template, ``rollout_rs_{option}_<suffix>``, and stands for that
suffix of every RS option (``rs_key`` builds one); a framework's readings of its weights are one family per framework
(``framework_key``). Each ``Threshold`` is a
health check: with a ``finding`` code, ``analyze`` warns when it fails; with ``packs``, ``rcdiag check --pack``
turns it into rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Literal

from rcdiag.catalogue.keys import DEBUG_PREFIX, EXTRA_PREFIX, PREFIX, Key
from rcdiag.settings.correction import RS_OPTIONS

Group = Literal["offpolicy", "is", "rs_option", "rs_aggregate", "extras", "debug"]
ThresholdKind = Literal["min", "max", "max_abs", "range"]
StepTable = Literal["analyze", "compare", "compare_trend"]
"""Per-step views: analyze's step table, compare's step table, compare's trend of b - a."""

GROUP_NEEDS: dict[Group, str] = {
    "offpolicy": "always computed",
    "is": "IS metrics need --is token|sequence",
    "rs_option": "RS metrics need --rs with that option and --rs-threshold",
    "rs_aggregate": "RS metrics need --rs and --rs-threshold",
    "extras": "always computed",
    "debug": "verl's debug metrics are logged in decoupled mode only (bypass_mode false)",
}
"""What a group's metrics need, for the hint when a rule names a metric the configuration lacks."""


PACKS: dict[str, str] = {
    "verl": "verl's documented health thresholds (docs/algo/rollout_corr.md)",
    "nemo-rl": "NeMo-RL's acceptance levels (token_mult_prob_error, generation k3 KL)",
    "miles-dense": "upper end of the k3 KL range Miles reports for dense models (1e-5..1e-3)",
    "miles-moe": "upper end of the k3 KL range Miles reports for MoE models (1e-3..1e-1)",
}
"""``rcdiag check --pack`` names and where their thresholds come from; the thresholds say which packs hold them."""


@dataclass(frozen=True)
class Threshold:
    """A health bound on a metric: ``min`` (value >= bound), ``max`` (<=), ``max_abs`` (|value| <=) or
    ``range`` (lo <= value <= hi), every bound inclusive (the value on the bound holds)."""

    kind: ThresholdKind
    bound: float | tuple[float, float]
    finding: str | None = None
    """``analyze``'s finding code when it fails (docs/findings.md)."""
    packs: tuple[str, ...] = ()
    """``rcdiag check`` rule packs holding it."""

    def holds(self, value: float) -> bool:
        if self.kind == "range":
            lo, hi = self.bounds
            return lo <= value <= hi
        if self.kind == "min":
            return value >= self.limit
        return (abs(value) if self.kind == "max_abs" else value) <= self.limit

    def badness(self, value: float) -> float:
        """Larger is worse: the distance in log space for a range, else the value in the failing direction."""
        if self.kind == "range":
            return abs(math.log(max(value, 1e-300)))
        if self.kind == "min":
            return -value
        return abs(value) if self.kind == "max_abs" else value

    @property
    def bounds(self) -> tuple[float, float]:
        assert isinstance(self.bound, tuple)
        return self.bound

    @property
    def limit(self) -> float:
        assert not isinstance(self.bound, tuple)
        return self.bound

    def rules(self) -> tuple[tuple[Literal["min", "max", "max_abs"], float], ...]:
        """As ``rcdiag check`` rule kinds: a range is two rules."""
        if self.kind == "range":
            return (("min", self.bounds[0]), ("max", self.bounds[1]))
        return ((self.kind, self.limit),)

    def describe(self, name: str) -> str:
        """``kl`` -> ``|kl| <= 0.1``; ``rollout_is_mean in [0.5, 2]``."""
        if self.kind == "range":
            return f"{name} in [{self.bounds[0]:g}, {self.bounds[1]:g}]"
        if self.kind == "min":
            return f"{name} >= {self.limit:g}"
        return f"|{name}| <= {self.limit:g}" if self.kind == "max_abs" else f"{name} <= {self.limit:g}"


@dataclass(frozen=True)
class Band:
    """A reading for values below ``below`` (the first band that fits is used)."""

    below: float
    text: str


@dataclass(frozen=True)
class MetricSpec:
    """One metric (or, for a ``{option}`` template, one suffix of every RS option)."""

    key: str
    group: Group
    reading: str
    bands: tuple[Band, ...] = ()
    """Value-dependent addition to the reading."""
    bands_on_abs: bool = False
    thresholds: tuple[Threshold, ...] = ()
    breach: str = ""
    """Reading addition when a threshold with a finding fails."""
    per_step: tuple[StepTable, ...] = ()
    """Step tables that show it as a column."""
    needs: str | None = None
    """What computes it, when more than its group needs."""
    k1_only: bool = False
    """A template suffix that only k1 options have."""

    @property
    def name(self) -> str:
        """The key as reported (prefixed)."""
        return full_key(self.key)

    @property
    def short(self) -> str:
        return short_key(self.key)

    def how_to_compute(self) -> str:
        return self.needs or GROUP_NEEDS[self.group]


KL_BANDS = (
    Band(1e-4, "tiny: engines nearly agree"),
    Band(1e-3, "small: typical of dense models"),
    Band(1e-2, "moderate: typical of MoE or low-precision rollout"),
    Band(math.inf, "large: correction matters"),
)
NEGATIVE_CHI2 = Band(
    0.0,
    "negative: E[ratio^2] < 1 forces the mean ratio below 1, a systematic shift (kl_k3_disagree says whether it "
    "is beyond noise), not a small spread",
)
KL_NOISE_SIGMAS = 2.0
"""A kl within this many standard errors of 0 reads "within noise of 0" (no magnitude band)."""
SHIFT_CODES = frozenset({"kl_k3_disagree", "logprob_offset", "sampling_truncation"})
"""Findings that establish a systematic shift beyond noise (a negative chi2 reads as one only with them)."""


@dataclass(frozen=True)
class ReadingContext:
    """What a reading needs beyond the value: whether it is distinguishable from 0 (docs/findings.md)."""

    kl_std_error: float | None
    """Standard error of kl (``rcdiag/kl_std_error``)."""
    fired: frozenset[str]
    """Codes of the findings the report gives: a reading never contradicts them."""


def _noise_band(key: str, value: float, context: ReadingContext) -> str | None:
    """The reading of kl and chi2 that depends on whether the value is beyond noise; ``None``: use the bands."""
    short = short_key(key)
    if short == "kl":
        if value < 0:
            if "kl_negative" in context.fired:
                return "negative beyond noise: impossible for tokens sampled by the rollout engine (kl_negative)"
            return "negative but within noise of 0 (KL itself is >= 0)"
        se = context.kl_std_error
        if se is not None and value <= KL_NOISE_SIGMAS * se:
            return f"within noise of 0 (at most {KL_NOISE_SIGMAS:g} standard errors, rcdiag/kl_std_error)"
        if "sparse_outliers" in context.fired:
            return "carried by a few outlier tokens (sparse_outliers), not by noise across the tokens"
        return None
    if short == "rollout_is_eff_sample_size" and "is_saturated" in context.fired:
        return "meaningless: truncation made (nearly) every weight the same constant (is_saturated)"
    if short in ("chi2_token", "chi2_seq") and value < 0:
        if context.fired & SHIFT_CODES:
            return (
                "negative: E[ratio^2] < 1 forces the mean ratio below 1, and the mean ratio is below 1 beyond noise "
                f"({', '.join(sorted(context.fired & SHIFT_CODES))}): a systematic shift, not a small spread"
            )
        if short == "chi2_token":
            return (
                "negative but within noise of 0: the mean ratio is 1 within noise (kl_k3_disagree holds), so the "
                "true value is a variance >= 0 too small to measure"
            )
        return (
            "negative although the mean token ratio is 1 within noise: the sequence weights are too heavy-tailed "
            "for this sample to estimate their variance (>= 0); see seq_is_hopeless"
        )
    return None


_OPT = "rollout_rs_{option}_"

METRICS: tuple[MetricSpec, ...] = (
    # verl's off-policy metrics (always present)
    MetricSpec(Key.TRAINING_PPL, "offpolicy", "mean per-response perplexity under the trainer"),
    MetricSpec(Key.TRAINING_LOG_PPL, "offpolicy", "mean per-response log-perplexity under the trainer"),
    MetricSpec(
        Key.KL,
        "offpolicy",
        "~KL(rollout||train) per token",
        bands=KL_BANDS,
        bands_on_abs=True,
        thresholds=(Threshold("max_abs", 0.1, finding="kl_high", packs=("verl",)),),
        breach="likely a bug: temperature, sampling filters, checkpoint",
        per_step=("analyze", "compare", "compare_trend"),
    ),
    MetricSpec(
        Key.K3_KL,
        "offpolicy",
        "low-variance estimate of the same KL (should match kl)",
        bands=KL_BANDS,
        bands_on_abs=True,
        thresholds=(
            Threshold("max", 1e-3, packs=("nemo-rl", "miles-dense")),
            Threshold("max", 1e-1, packs=("miles-moe",)),
        ),
        per_step=("analyze", "compare", "compare_trend"),
    ),
    MetricSpec(Key.ROLLOUT_PPL, "offpolicy", "mean per-response perplexity under the rollout engine"),
    MetricSpec(Key.ROLLOUT_LOG_PPL, "offpolicy", "mean per-response log-perplexity under the rollout engine"),
    MetricSpec(
        Key.LOG_PPL_DIFF,
        "offpolicy",
        "mean log-PPL(train) - log-PPL(rollout)",
        bands=(
            Band(-1e-3, "the rollout engine finds responses less likely"),
            Band(1e-3, "no systematic gap"),
            Band(math.inf, "the trainer finds responses less likely"),
        ),
    ),
    MetricSpec(
        Key.LOG_PPL_ABS_DIFF,
        "offpolicy",
        "mean |log-PPL gap| per response: size of the gap regardless of sign",
        per_step=("analyze", "compare_trend"),
    ),
    MetricSpec(
        Key.LOG_PPL_DIFF_MAX, "offpolicy", "largest per-response log-PPL gap (trainer finds this response least likely)"
    ),
    MetricSpec(Key.LOG_PPL_DIFF_MIN, "offpolicy", "most negative per-response log-PPL gap"),
    MetricSpec(Key.PPL_RATIO, "offpolicy", "mean of PPL_train/PPL_rollout per response; 1 = no gap"),
    MetricSpec(
        Key.CHI2_TOKEN,
        "offpolicy",
        "E[ratio^2] - 1 per token",
        bands=(NEGATIVE_CHI2, Band(0.1, "small spread"), Band(math.inf, "wide spread of token ratios")),
        thresholds=(Threshold("max", 1.0, finding="chi2_token_high", packs=("verl",)),),
        breach="some tokens have ratios far above 1",
        per_step=("analyze", "compare", "compare_trend"),
    ),
    MetricSpec(
        Key.CHI2_SEQ,
        "offpolicy",
        "E[(prod ratio)^2] - 1 per response: the variance a sequence-level IS weight would have; grows with length",
        bands=(NEGATIVE_CHI2,),
    ),
    # verl's IS metrics
    MetricSpec(
        Key.ROLLOUT_IS_MEAN,
        "is",
        "mean applied IS weight; ~1 when the mismatch is noise",
        thresholds=(Threshold("range", (0.5, 2.0), finding="is_mean_out_of_range", packs=("verl",)),),
        breach="systematic shift",
    ),
    MetricSpec(Key.ROLLOUT_IS_RATIO_FRACTION_HIGH, "is", "share with raw ratio above the upper bound"),
    MetricSpec(Key.ROLLOUT_IS_RATIO_FRACTION_LOW, "is", "share with raw ratio below the lower bound (1/U for TIS)"),
    MetricSpec(Key.ROLLOUT_IS_MAX, "is", "largest applied IS weight"),
    MetricSpec(Key.ROLLOUT_IS_MIN, "is", "smallest applied IS weight"),
    MetricSpec(
        Key.ROLLOUT_IS_STD,
        "is",
        "spread of applied IS weights",
        thresholds=(Threshold("max", 1.0, finding="is_std_high", packs=("verl",)),),
        breach="high variance",
    ),
    MetricSpec(
        Key.ROLLOUT_IS_EFF_SAMPLE_SIZE,
        "is",
        "effective share of the batch after weighting",
        bands=(Band(0.5, "low"), Band(math.inf, "healthy")),
        thresholds=(Threshold("min", 0.3, finding="is_ess_low", packs=("verl",)),),
        breach="too low",
        per_step=("analyze",),
    ),
    MetricSpec(Key.ROLLOUT_IS_SEQ_MEAN, "is", "mean over responses of the per-response mean weight"),
    MetricSpec(Key.ROLLOUT_IS_SEQ_STD, "is", "spread of per-response mean weights"),
    MetricSpec(Key.ROLLOUT_IS_SEQ_MAX, "is", "largest per-response mean weight"),
    MetricSpec(Key.ROLLOUT_IS_SEQ_MIN, "is", "smallest per-response mean weight (0 for empty responses)"),
    MetricSpec(Key.ROLLOUT_IS_SEQ_MAX_DEVIATION, "is", "largest |per-response mean weight - 1|"),
    MetricSpec(
        Key.ROLLOUT_IS_SEQ_FRACTION_HIGH, "is", "share of responses whose mean raw weight exceeds the upper bound"
    ),
    MetricSpec(
        Key.ROLLOUT_IS_SEQ_FRACTION_LOW,
        "is",
        "share of responses whose mean raw weight is below the lower bound (empty responses count here)",
    ),
    MetricSpec(
        Key.ROLLOUT_IS_OOB_RATIO,
        "is",
        "share of tokens IcePop zeroed (raw ratio outside [L, U])",
        needs="it needs an IcePop --is-threshold L_U",
    ),
    MetricSpec(
        Key.ROLLOUT_IS_BATCH_NORM_FACTOR,
        "is",
        "the mean weight the batch is divided by to normalise it to 1",
        needs="it needs --batch-normalize",
    ),
    # verl's per-option RS metrics, one template per suffix
    MetricSpec(_OPT + "mean", "rs_option", "token-weighted mean of the statistic (ideal 0)"),
    MetricSpec(_OPT + "max", "rs_option", "largest value"),
    MetricSpec(_OPT + "min", "rs_option", "smallest value"),
    MetricSpec(_OPT + "fraction_high", "rs_option", "share above the upper bound"),
    MetricSpec(_OPT + "fraction_low", "rs_option", "share below the lower bound"),
    MetricSpec(_OPT + "std", "rs_option", "spread of the statistic clamped to the bounds"),
    MetricSpec(_OPT + "seq_mean", "rs_option", "mean over responses of the per-response value"),
    MetricSpec(_OPT + "seq_std", "rs_option", "spread over responses"),
    MetricSpec(_OPT + "seq_max", "rs_option", "largest per-response value"),
    MetricSpec(_OPT + "seq_min", "rs_option", "smallest per-response value"),
    MetricSpec(_OPT + "seq_max_deviation", "rs_option", "largest |per-response value| (ideal 0)"),
    MetricSpec(_OPT + "seq_fraction_high", "rs_option", "share of responses above the upper bound"),
    MetricSpec(_OPT + "seq_fraction_low", "rs_option", "share of responses below the lower bound", k1_only=True),
    MetricSpec(_OPT + "masked_fraction", "rs_option", "share of valid tokens this option rejects"),
    MetricSpec(
        _OPT + "seq_masked_fraction", "rs_option", "share of responses (with a valid token) this option touches"
    ),
    # verl's RS aggregates
    MetricSpec(
        Key.ROLLOUT_RS_MASKED_FRACTION,
        "rs_aggregate",
        "share of valid tokens rejected by any RS option",
        thresholds=(Threshold("max", 0.2, finding="rs_rejects_most_tokens"),),
        breach="more than an outlier filter should remove",
        per_step=("analyze",),
    ),
    MetricSpec(
        Key.ROLLOUT_RS_SEQ_MASKED_FRACTION, "rs_aggregate", "share of all responses with at least one rejected token"
    ),
    # verl's debug metrics (calculate_debug_metrics, decoupled mode), under their own prefix
    MetricSpec(
        Key.ROLLOUT_PROBS_DIFF_VALID,
        "debug",
        "1 when the batch has a valid token (0 without one, verl >= 0.8.0; verl 0.7.1 raises)",
    ),
    MetricSpec(Key.ROLLOUT_PROBS_DIFF_MAX, "debug", "largest |p_train - p_rollout| of any token"),
    MetricSpec(
        Key.ROLLOUT_PROBS_DIFF_MEAN,
        "debug",
        "mean |p_train - p_rollout| per token: the gap in probability space, where log-prob gaps at p ~ 0 weigh little",
    ),
    MetricSpec(Key.ROLLOUT_PROBS_DIFF_STD, "debug", "spread of |p_train - p_rollout| (unbiased, torch.std)"),
    MetricSpec(
        Key.ROLLOUT_ACTOR_PROBS_PEARSON_CORR,
        "debug",
        "Pearson correlation of the token probabilities of both engines; 1 = they agree up to a linear map",
    ),
    # rcdiag's own diagnostics
    MetricSpec(
        Key.ABS_LOG_RATIO_MEAN,
        "extras",
        "mean |log-prob gap| per token (TRL/slime/SkyRL's abs-diff metric)",
        per_step=("compare_trend",),
    ),
    MetricSpec(Key.ABS_LOG_RATIO_MAX, "extras", "largest |log-prob gap| of any token"),
    MetricSpec(
        Key.TOKEN_MULT_PROB_ERROR,
        "extras",
        "mean exp(|gap|) per token (NeMo-RL's metric; its gate is 1.05)",
        thresholds=(Threshold("max", 1.05, packs=("nemo-rl",)),),
    ),
    MetricSpec(Key.KL_STD_ERROR, "extras", "standard error of kl (responses as independent units)"),
    MetricSpec(
        Key.KL_STD_ERROR_DOF,
        "extras",
        "effective responses behind kl_std_error (its degrees of freedom + 1); few when a few long responses dominate",
    ),
    MetricSpec(Key.CLAMPED_TOKEN_FRACTION, "extras", "share of tokens with |gap| > 20, where verl's clamps bite"),
    # the signature statistics the verdict tells noise from bugs by (rcdiag/metrics/signatures.py)
    MetricSpec(
        Key.CAPPED_RATIO_MEAN,
        "extras",
        "mean IS ratio capped at e^3: at most 1 when the rollout's log-probs are those it sampled from",
    ),
    MetricSpec(Key.CAPPED_RATIO_STD_ERROR, "extras", "standard error of capped_ratio_mean (responses)"),
    MetricSpec(Key.REVERSE_RATIO_MEAN, "extras", "the same with the columns exchanged (at most 1 if swapped)"),
    MetricSpec(Key.REVERSE_RATIO_STD_ERROR, "extras", "standard error of reverse_ratio_mean (responses)"),
    MetricSpec(Key.SHAPE_CORR, "extras", "correlation of the log-ratio with the log-prob (temperature-like shapes)"),
    MetricSpec(Key.WITHIN_ROW_SHARE, "extras", "share of the log-ratio's energy within responses (about 0: offset)"),
    MetricSpec(Key.SHIFTED_AHEAD_RATIO, "extras", "mean |old[t] - rollout[t+1]| over mean |old[t] - rollout[t]|"),
    MetricSpec(Key.SHIFTED_BEHIND_RATIO, "extras", "mean |old[t+1] - rollout[t]| over mean |old[t] - rollout[t]|"),
    MetricSpec(
        Key.ROLLOUT_ZERO_FRACTION,
        "extras",
        "share of valid tokens the rollout scores exactly 0.0 where the trainer does not (tokens never sampled)",
    ),
    MetricSpec(Key.BOTH_ZERO_FRACTION, "extras", "share of valid tokens exactly 0.0 on both sides (padding)"),
    MetricSpec(Key.IDENTICAL_FRACTION, "extras", "share of valid tokens bit-identical on both sides"),
    MetricSpec(Key.CERTAIN_DROP, "extras", "mean log-ratio over the tokens the trainer gives p >= 0.99 (soft-capping)"),
    MetricSpec(Key.CERTAIN_DROP_STD_ERROR, "extras", "standard error of certain_drop (responses)"),
    MetricSpec(Key.CERTAIN_SHARE, "extras", "share of the tokens the trainer gives p >= 0.99"),
    MetricSpec(Key.CERTAIN_LOWERED_SHARE, "extras", "share of those the rollout scores more than 0.1 nats lower"),
    MetricSpec(Key.ROLLOUT_CERTAIN_DROP, "extras", "mean -log-ratio over the tokens the rollout gives p >= 0.99"),
    MetricSpec(Key.ROLLOUT_CERTAIN_DROP_STD_ERROR, "extras", "standard error of rollout_certain_drop"),
    MetricSpec(Key.ROLLOUT_CERTAIN_SHARE, "extras", "share of the tokens the rollout gives p >= 0.99"),
    MetricSpec(
        Key.ROLLOUT_CERTAIN_LOWERED_SHARE,
        "extras",
        "share of those the trainer scores more than 0.1 nats lower",
    ),
    MetricSpec(
        Key.ROLLOUT_FAR_HIGHER_SHARE,
        "extras",
        "share of the tokens the rollout scores more than 2 nats above the trainer (another token's log-prob)",
    ),
    MetricSpec(
        Key.ROLLOUT_FAR_HIGHER_TOP1_SHARE,
        "extras",
        "share of those the rollout gives p >= 1/2 (its most likely token)",
    ),
    MetricSpec(Key.TRAINER_FAR_HIGHER_SHARE, "extras", "share of the tokens the trainer scores 2 nats above"),
    MetricSpec(
        Key.REPEAT_DROP,
        "extras",
        "how much more the rollout lowers tokens repeated within a response than first occurrences (token ids)",
    ),
    MetricSpec(Key.REPEAT_DROP_STD_ERROR, "extras", "standard error of repeat_drop (responses)"),
    MetricSpec(Key.REPEAT_SHARE, "extras", "share of the tokens whose id occurred earlier in the response"),
)
"""Every metric, in the order the docs list them (reports keep verl's insertion order)."""


def full_key(key: str) -> str:
    """``kl`` -> ``rollout_corr/kl``; an ``rcdiag/``, ``training/`` or already prefixed key is unchanged."""
    return key if key.startswith((PREFIX, EXTRA_PREFIX, DEBUG_PREFIX)) else PREFIX + key


def short_key(key: str) -> str:
    """``rollout_corr/kl`` -> ``kl`` (how tables and rules name verl's keys)."""
    return key.removeprefix(PREFIX)


def _options_for(spec: MetricSpec) -> tuple[str, ...]:
    return tuple(o for o in RS_OPTIONS if not spec.k1_only or o.endswith("k1"))


@cache
def _index() -> dict[str, tuple[MetricSpec, str | None]]:
    """Full key -> (spec, RS option or None), templates expanded over every RS option."""
    out: dict[str, tuple[MetricSpec, str | None]] = {}
    for spec in METRICS:
        if "{option}" in spec.key:
            out.update({full_key(spec.key.format(option=o)): (spec, o) for o in _options_for(spec)})
        else:
            out[spec.name] = (spec, None)
    return out


def metric(key: str) -> MetricSpec | None:
    """The spec of a reported key (full or short), or ``None`` for a key the catalogue does not know."""
    found = _index().get(full_key(key))
    return found[0] if found else None


def rs_option(key: str) -> str | None:
    """The RS option a per-option key belongs to (``rollout_rs_token_k1_mean`` -> ``token_k1``)."""
    found = _index().get(full_key(key))
    return found[1] if found else None


def every_key() -> list[str]:
    """Every full key the catalogue declares, templates expanded option by option."""
    return list(_index())


def reading(key: str, value: float | None, context: ReadingContext | None = None) -> str:
    """A short plain-language reading of one metric's value; ``""`` for an unknown key. With ``context``, kl and
    chi2 read by whether they are distinguishable from 0, consistently with the report's findings."""
    spec = metric(key)
    if spec is None:
        return ""
    text = spec.reading
    if value is None:
        return text
    measured = abs(value) if spec.bands_on_abs else value
    band = _noise_band(spec.name, value, context) if context is not None else None
    if band is None:
        band = next((b.text for b in spec.bands if measured < b.below), "")
    if band:
        text += f"; {band}"
    failed = [t for t in spec.thresholds if t.finding is not None and not t.holds(value)]
    if failed and spec.breach:
        text += f" (fails {failed[0].describe(spec.short)}: {spec.breach})"
    return text


def known_key(key: str) -> str:
    """The full key of a metric the catalogue declares (``kl`` -> ``rollout_corr/kl``); ``KeyError`` for one it
    does not, so that a renamed metric fails where it is read instead of reading ``None``."""
    full = full_key(key)
    if full not in _index():
        raise KeyError(f"{key!r} is not a metric of the catalogue (rcdiag.catalogue.metrics)")
    return full


def rs_key(option: str, suffix: str) -> str:
    """The full key of RS option ``option``'s ``suffix`` (``token_k1``, ``masked_fraction`` ->
    ``rollout_corr/rollout_rs_token_k1_masked_fraction``); ``KeyError`` for an option or suffix the catalogue lacks."""
    return known_key(_OPT.format(option=option) + suffix)


FRAMEWORK_STATS = ("weight_mean", "zeroed_fraction", "zeroed_response_fraction", "truncated_fraction", "ess")
"""rcdiag's readings of a framework's correction weights, the same for every framework (``rcdiag/<name>/<stat>``)."""
EVERY_STAT = "*"
"""``framework_key(name, EVERY_STAT)``: the whole family, as the docs and a framework's notes name it."""


def framework_key(framework: str, stat: str) -> str:
    """The key of rcdiag's reading ``stat`` of framework ``framework``'s weights (``slime``, ``ess`` ->
    ``rcdiag/slime/ess``; ``EVERY_STAT``: ``rcdiag/slime/*``); ``KeyError`` for a stat not in ``FRAMEWORK_STATS``."""
    if stat != EVERY_STAT and stat not in FRAMEWORK_STATS:
        raise KeyError(f"{stat!r} is not one of rcdiag's framework readings {FRAMEWORK_STATS}")
    return f"{EXTRA_PREFIX}{framework}/{stat}"


def framework_note(framework: str, what: str) -> str:
    """The note under a framework's report that says which of its keys are rcdiag's readings, and of what."""
    return f"{framework_key(framework, EVERY_STAT)} are rcdiag's: {what}"


def finding_threshold(code: str) -> Threshold:
    """The threshold whose failure is finding ``code`` (``kl_high``: ``|kl| <= 0.1``): its one place."""
    return next(t for _, t in thresholds_with_findings() if t.finding == code)


def thresholds_with_findings() -> list[tuple[MetricSpec, Threshold]]:
    """Every (metric, threshold) pair that ``analyze`` checks, in catalogue order."""
    return [(spec, t) for spec in METRICS for t in spec.thresholds if t.finding is not None]


def pack_rules(pack: str) -> list[tuple[str, Literal["min", "max", "max_abs"], float]]:
    """(short metric name, rule kind, bound) of every threshold in a rule pack, in catalogue order."""
    return [
        (spec.short, kind, bound)
        for spec in METRICS
        for t in spec.thresholds
        if pack in t.packs
        for kind, bound in t.rules()
    ]


def step_columns(table: StepTable) -> list[str]:
    """Full keys shown as columns of a per-step table, in catalogue order."""
    return [spec.name for spec in METRICS if table in spec.per_step]


def packs_help() -> str:
    """Every pack with its rules, for ``--pack``'s help: ``verl`` (rollout_is_mean in [0.5, 2], ...)."""
    parts = []
    for name in PACKS:
        rules = [t.describe(spec.short) for spec in METRICS for t in spec.thresholds if name in t.packs]
        parts.append(f"`{name}` ({', '.join(rules)})")
    return ", ".join(parts)
