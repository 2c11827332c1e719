"""NeMo-RL's mismatch metrics and importance-sampling correction (NVIDIA-NeMo/RL 7ea279abf: ``ClippedPGLossFn``,
``nemo_rl/algorithms/loss/loss_functions.py:180-789``, with ``masked_mean`` and ``calculate_kl`` of
``nemo_rl/algorithms/utils.py``; the sequence-level error metrics and masking of
``compute_and_apply_seq_logprob_error_masking``, ``nemo_rl/algorithms/grpo.py:2513-2640``; logged as
``train/KEY``, each loss metric the sum over micro-batches of values normalised by the step's global counts).

With ``d = prev - gen`` (rcdiag's ``old - rollout``), float32: ``token_mult_prob_error`` is the token mean of
``exp(|d|)``; ``gen_kl_error`` and ``policy_kl_error`` the token means of the configured estimator (k3 by
default: ``exp(logr) - 1 - logr``) with ``logr = d`` and ``logr = -d``; ``js_divergence_error`` the token mean of
the k3-form KL of each side to the mixture ``log(0.5 e^prev + 0.5 e^gen)``. The importance weight is
``exp(d)`` per token, or ``exp(sum of d)`` per sample with ``sequence_level_importance_ratios`` (a non-finite
weight set to 0); ``tis`` clamps it to [min or 0, max], ``icepop`` zeroes it outside [min, max], ``seq-mask-tis``
zeroes every token of a sample whose geometric-mean ratio is outside. ``sampling_importance_ratio`` is the token
mean of the weights after that (for sequence-level weights, NeMo-RL's broadcast gives the sum of every sample's
weight times the kept samples over their count: the sum), ``is_oob_ratio`` the share out of bounds (of samples for
seq-mask-tis). Every token mean divides by the step's valid tokens plus 1e-8 (0 for none). The GRPO trainer logs
each sample's ``exp(|d|)`` mean (max, mean and min over samples with a valid token) before and after its optional
``seq_logprob_error_threshold`` masking, which takes the masked samples out of the loss and its metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
from rcdiag.core import formulas
from rcdiag.frameworks.base import Framework, FrameworkMetrics, MetricKey, Option, TokenRows, exp32, weight_keys
from rcdiag.frameworks.correction import NO_CLAMP_QUIRK, UNIT_STATISTIC, Band, Correction, Form, Unit, Weight
from rcdiag.metrics.base import MetricValue, Reduce, VerlCrash
from rcdiag.runtime.errors import ConfigError

NAME = "nemo-rl"
P = "train/"
CORRECTION = "loss_fn.use_importance_sampling_correction"
TYPE = "loss_fn.truncated_importance_sampling_type"
RATIO = "loss_fn.truncated_importance_sampling_ratio"
RATIO_MIN = "loss_fn.truncated_importance_sampling_ratio_min"
SEQUENCE = "loss_fn.sequence_level_importance_ratios"
TOKEN_LOSS = "loss_fn.token_level_loss"
KL_TYPE = "loss_fn.reference_policy_kl_type"
THRESHOLD = "grpo.seq_logprob_error_threshold"
LOSS_KEYS = tuple(
    P + k for k in ("token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
                    "sampling_importance_ratio", "num_valid_samples")
)  # fmt: skip
OOB = P + "is_oob_ratio"
SEQ_KEYS = tuple(f"{P}{s}_seq_mult_prob_error{after}" for after in ("", "_after_mask") for s in ("max", "mean", "min"))
MASKED = P + "num_masked_seqs_by_logprob_error"
EPS = np.float32(1e-8)


@dataclass(frozen=True)
class NemoRLSettings:
    applied: bool
    """``use_importance_sampling_correction``."""
    kind: str | None
    high: float | None
    low: float | None
    sequence: bool
    token_loss: bool
    kl_type: str
    threshold: float | None

    def new_metrics(self) -> NemoRLMetrics:
        return NemoRLMetrics(self)

    def notes(self) -> tuple[str, ...]:
        notes = [
            "the loss metrics are NeMo-RL's sums over a step's micro-batches of values normalised by the step's "
            "global token (or sample) counts: the step's token means; a step of several global batches (several "
            "optimizer steps) sums their means, which rcdiag does not reproduce",
            "a dump row is a sample of the step, every one in the loss (sample_mask 1) unless "
            "seq_logprob_error_threshold masks it",
        ]
        if self.sequence:
            notes.append(
                "sampling_importance_ratio with sequence-level weights is NeMo-RL's masked_mean of (B, 1) weights "
                "with a (B,) sample mask: it broadcasts to the sum of the weights times the kept samples over their "
                "count, on each micro-batch: rcdiag gives the step as one micro-batch"
            )
        if not self.applied:
            notes.append(f"{CORRECTION} is false (NeMo-RL's default): the weights are logged, not applied")
        notes.append(
            framework_note(
                NAME,
                "the importance weight NeMo-RL applies to each valid token's loss (1 without the correction), "
                "0 for a sample the threshold masks",
            )
        )
        return tuple(notes)

    def correction(self) -> Correction:
        """Its importance weight (per token, or per sample: the product) truncated (tis: clamped to [min or 0,
        max]) or masked (icepop: a band on it; seq-mask-tis: a band on each sample's geometric mean), applied only
        with the correction on; and the GRPO trainer's threshold on each sample's mean e^|d|, applied either way."""
        bands = []
        if self.threshold is not None:
            label = f"{THRESHOLD} {self.threshold:g}: a sample whose mean e^|prev - gen| is above it masked"
            bands.append(Band("mean_exp_abs", None, self.threshold, label=label))
        quirks = ("sets a non-finite weight to 0", NO_CLAMP_QUIRK)
        if not self.applied:
            weight = Weight("one", label=f"{CORRECTION}: false (the weights are logged, not applied)")
            return Correction(weight, tuple(bands), quirks=quirks).normal()
        unit: Unit = "product" if self.sequence else "token"
        label = f"{CORRECTION}: true, {TYPE}: {self.kind}, [{_g(self.low)}, {_g(self.high)}]" + (
            ", one weight per sample" if self.sequence else ""
        )
        weight = Weight(unit, self.low, self.high, label=label) if self.kind == "tis" else Weight(unit, label=label)
        if self.kind in ("icepop", "seq-mask-tis"):
            statistic = UNIT_STATISTIC[unit] if self.kind == "icepop" else "geomean"
            bands.append(Band(statistic, self.low, self.high, label=label))
        other = (OVERFLOW,) if self.sequence else ()
        return Correction(weight, tuple(bands), other=other, quirks=quirks).normal()

    def to_dict(self) -> dict[str, Any]:
        return {
            CORRECTION: self.applied,
            TYPE: self.kind,
            RATIO: self.high,
            RATIO_MIN: self.low,
            SEQUENCE: self.sequence,
            TOKEN_LOSS: self.token_loss,
            KL_TYPE: self.kl_type,
            THRESHOLD: self.threshold,
        }


def _kl(kind: str, logr: np.ndarray) -> np.ndarray:
    """``calculate_kl`` without clamps, in float32."""
    if kind == "k1":
        return -logr
    if kind == "k2":
        return np.square(logr) / np.float32(2.0)
    return (exp32(logr) - np.float32(1.0)) - logr


def _to_mixture(x: np.ndarray) -> np.ndarray:
    """The JS divergence's KL to the mixture, ``exp(x) - x - 1`` in that order (float32)."""
    return (exp32(x) - x) - np.float32(1.0)


class NemoRLMetrics(FrameworkMetrics):
    """One step's ``train/*`` mismatch keys: token sums of the loss's per-token values, per-sample error
    statistics and counts."""

    NAME = NAME
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "kept_tokens": "sum",
        "samples": "sum",
        "kept_samples": "sum",
        "mult": "sum",
        "gen_kl": "sum",
        "policy_kl": "sum",
        "js": "sum",
        "weight": "sum",
        "seq_weight": "sum",
        "oob": "sum",
        "err_n": "sum",
        "err_sum": "sum",
        "err_max": "max",
        "err_min": "min",
        "kept_n": "sum",
        "kept_sum": "sum",
        "kept_max": "max",
        "kept_min": "min",
    }
    settings: NemoRLSettings

    def update(self, block: Any) -> None:
        s = self.settings
        rows = TokenRows(block)
        d = rows.diff
        count = rows.counts.astype(np.float64)
        mult = exp32(np.abs(d))
        err = (rows.row_sum(mult).astype(np.float32) / np.maximum(count, 1.0).astype(np.float32)).astype(np.float32)
        valid = count > 0
        kept_row = np.ones(rows.n_rows, dtype=bool) if s.threshold is None else err <= np.float32(s.threshold)
        self._errors(err, valid, kept_row)
        kept = rows.per_token(kept_row)
        old, gen = rows.old, rows.rollout
        mixture = np.log(((np.float32(0.5) * exp32(old)) + (np.float32(0.5) * exp32(gen))).astype(np.float64))
        mixture = mixture.astype(np.float32)
        js = np.float32(0.5) * _to_mixture(old - mixture) + np.float32(0.5) * _to_mixture(gen - mixture)
        weight, oob = self._weights(rows, d, kept_row)
        token_weight = weight if weight.shape[0] == rows.n_tokens else rows.per_token(weight)
        self.add(
            kept_tokens=float(np.count_nonzero(kept)),
            samples=float(rows.n_rows),
            kept_samples=float(np.count_nonzero(kept_row)),
            mult=_kept_sum(mult, kept),
            gen_kl=_kept_sum(_kl(s.kl_type, d), kept),
            policy_kl=_kept_sum(_kl(s.kl_type, -d), kept),
            js=_kept_sum(js, kept),
            weight=_kept_sum(token_weight, kept),
            seq_weight=float(weight.astype(np.float64).sum()) if s.sequence else 0.0,
            oob=oob,
        )
        applied = token_weight if s.applied else np.ones(rows.n_tokens, dtype=np.float32)
        moved = None
        if s.applied and s.kind == "tis":  # where the clamp moved a kept token's weight
            raw = self._raw(rows, d, kept_row)
            moved = (token_weight != (raw if raw.shape[0] == rows.n_tokens else rows.per_token(raw))) & kept
        self.add_weights(np.where(kept, applied, np.float32(0.0)), rows, moved)

    def _errors(self, err: np.ndarray, valid: np.ndarray, kept_row: np.ndarray) -> None:
        """``compute_and_apply_seq_logprob_error_masking``'s per-sample statistics, before and after masking."""
        for prefix, rows in (("err", valid), ("kept", valid & kept_row)):
            self.add_spread(prefix, err[rows].astype(np.float64))

    def _weights(self, rows: TokenRows, d: np.ndarray, kept_row: np.ndarray) -> tuple[np.ndarray, float]:
        """The importance weights after truncation (per token, or per sample) and the out-of-bounds count (tokens,
        or samples for seq-mask-tis), over what the loss keeps."""
        s = self.settings
        zero = np.float32(0.0)
        weight = self._raw(rows, d, kept_row)
        if s.sequence:
            tokens = rows.counts * kept_row
        else:
            tokens = np.ones(rows.n_tokens, dtype=np.int64) * rows.per_token(kept_row)
        if s.high is None:
            return weight, 0.0
        high = np.float32(s.high)
        low = np.float32(s.low if s.low is not None else 0.0)
        if s.kind == "tis":
            out = (weight > high) | (weight < low)
            return np.minimum(np.maximum(weight, low), high), float((out * tokens).sum())
        if s.kind == "icepop":
            inside = formulas.rs_keep(weight, low, high, True)
            return np.where(inside, weight, zero), float((~inside * tokens).sum())
        log = np.where(np.isfinite(d), d, zero)
        geo = exp32((rows.row_sum(log).astype(np.float32) / (rows.counts.astype(np.float32) + EPS)).astype(np.float32))
        inside = formulas.rs_keep(geo, low, high, True)
        return weight * rows.per_token(inside.astype(np.float32)), float(np.count_nonzero(~inside & kept_row))

    def _raw(self, rows: TokenRows, d: np.ndarray, kept_row: np.ndarray) -> np.ndarray:
        """The importance weight before truncation: per token, or per sample over the samples kept."""
        if self.settings.sequence:
            kept_d = np.where(rows.per_token(kept_row), d, np.float32(0.0))
            return _nan_to_zero(exp32(rows.row_sum(kept_d).astype(np.float32)))
        return _nan_to_zero(exp32(d))

    def keys(self) -> list[str]:
        oob = [OOB] if self.settings.high is not None else []
        return [*LOSS_KEYS, *oob, *SEQ_KEYS, MASKED, *self.weight_keys()]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st, s = self.state, self.settings
        toks = st["kept_tokens"] + 1e-8
        seqs = st["kept_samples"] + 1e-8
        ratio = st["seq_weight"] * st["kept_samples"] / seqs if s.sequence else st["weight"] / toks
        values: dict[str, MetricValue] = dict(
            zip(LOSS_KEYS, (st["mult"] / toks, st["gen_kl"] / toks, st["policy_kl"] / toks, st["js"] / toks, ratio,
                            st["kept_samples"]), strict=True)
        )  # fmt: skip
        if s.high is not None:
            values[OOB] = st["oob"] / (seqs if s.kind == "seq-mask-tis" else toks)
        for prefix, keys in (("err", SEQ_KEYS[:3]), ("kept", SEQ_KEYS[3:])):
            n = st[f"{prefix}_n"]
            stats = (st[f"{prefix}_max"], st[f"{prefix}_sum"] / n, st[f"{prefix}_min"]) if n else (0.0, 0.0, 0.0)
            values.update(zip(keys, stats, strict=True))
        values[MASKED] = st["samples"] - st["kept_samples"]
        return {**values, **self.weight_values()}, []


OVERFLOW = (
    "a sample whose product of ratios overflows float32 (log-ratio sum above ~88.7) gets weight 0, where a clamp "
    "(verl's, TRL's truncation) gives it the upper bound"
)
"""What NeMo-RL's per-sample weight does that the shared vocabulary cannot say: its nan_to_num before truncation."""


def _g(value: float | None) -> str:
    return "null" if value is None else f"{value:g}"


def _type(kind: str | None, sequence: bool) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """The correction applied with this truncation type (``None``: none), per token or per sample."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        base = {CORRECTION: True, SEQUENCE: sequence, TOKEN_LOSS: not sequence, TYPE: kind}
        if kind is None:
            return {**base, RATIO: None, RATIO_MIN: None}
        if kind == "tis":
            return None if high is None else {**base, RATIO: high, RATIO_MIN: low}
        return {**base, RATIO: high or OPEN_HIGH, RATIO_MIN: low or 0.0}

    return options


OPEN_HIGH = 1e30
"""An upper bound no finite weight NeMo-RL computes in practice reaches: a band with none written."""
FORMS = (
    Form("one", "none", lambda low, high: {CORRECTION: False, TYPE: None, RATIO: None, RATIO_MIN: None}),
    Form("token", "none", _type(None, False)),
    Form("token", "clamp", _type("tis", False)),
    Form("token", "band", _type("icepop", False), statistic="ratio"),
    Form("token", "band", _type("seq-mask-tis", False), statistic="geomean"),
    Form("product", "none", _type(None, True)),
    Form("product", "clamp", _type("tis", True)),
    Form("product", "band", _type("icepop", True), statistic="product"),
    Form("one", "band", lambda low, high: None if high is None else {THRESHOLD: high}, statistic="mean_exp_abs"),
)
"""Each truncation type, per token or per sample, and the GRPO trainer's threshold (which combines with them)."""


def _nan_to_zero(weights: np.ndarray) -> np.ndarray:
    """``torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)``."""
    return np.where(np.isfinite(weights), weights, np.float32(0.0)).astype(np.float32)


def _kept_sum(values: np.ndarray, kept: np.ndarray) -> float:
    return float(np.where(kept, values, np.float32(0.0)).astype(np.float64).sum())


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> NemoRLSettings:
    """``ClippedPGLossFn.__init__``'s assertions and ``__call__``'s error, in NeMo-RL's words."""
    kind, high, low = values[TYPE], values[RATIO], values[RATIO_MIN]
    if values[SEQUENCE] and values[TOKEN_LOSS]:
        raise ConfigError(
            "sequence-level importance sampling (e.g. GSPO) is mutually exclusive with token-level loss "
            f"(set {TOKEN_LOSS}=false)"
        )
    if kind is not None:
        if not values[CORRECTION]:
            raise ConfigError(
                "truncated importance sampling is only supported when use_importance_sampling_correction is True"
            )
        if high is None or high <= 0:
            raise ConfigError("truncated_importance_sampling_ratio should be positive")
        if low is not None and low > high:
            raise ConfigError("truncated_importance_sampling_ratio_min must be <= truncated_importance_sampling_ratio")
        if kind in ("icepop", "seq-mask-tis") and low is None:
            raise ConfigError(
                "truncated_importance_sampling_ratio_min should be set when truncated_importance_sampling_type is "
                "'icepop' or 'seq-mask-tis'"
            )
        if kind == "seq-mask-tis" and values[SEQUENCE]:
            raise ConfigError(
                "seq-mask-tis uses token-level IS correction with sequence-level masking, and is incompatible with "
                "sequence_level_importance_ratios=True"
            )
    elif high is not None:
        raise ConfigError(
            "Invalid truncated importance sampling type: None (NeMo-RL raises it at its first step when "
            "truncated_importance_sampling_ratio is set without a type)"
        )
    return NemoRLSettings(
        applied=values[CORRECTION],
        kind=kind,
        high=high,
        low=low,
        sequence=values[SEQUENCE],
        token_loss=values[TOKEN_LOSS],
        kl_type=values[KL_TYPE],
        threshold=values[THRESHOLD],
    )


FRAMEWORK = Framework(
    name=NAME,
    title="NeMo-RL",
    release="7ea279abf",
    source=(
        "nemo_rl/algorithms/loss/loss_functions.py:111-789; nemo_rl/algorithms/utils.py:42-101, 213-224; "
        "nemo_rl/algorithms/grpo.py:2513-2640, 3466-3494; examples/configs/grpo_math_1B.yaml:50, 79-110"
    ),
    options=(
        Option(CORRECTION, "bool", False, "apply the importance weights to the loss"),
        Option(
            TYPE,
            "choice",
            None,
            "tis (clamp), icepop (zero outside), seq-mask-tis (zero samples by geometric mean); null: none",
            choices=("tis", "icepop", "seq-mask-tis"),
            nullable=True,
        ),
        Option(RATIO, "number", None, "upper bound", nullable=True),
        Option(RATIO_MIN, "number", None, "lower bound (tis: null is 0)", nullable=True),
        Option(SEQUENCE, "bool", False, "one weight per sample: exp of the sum of its log-ratios (GSPO)"),
        Option(TOKEN_LOSS, "bool", True, "token-level loss (false: sequence-level, needed for sequence weights)"),
        Option(
            KL_TYPE, "choice", "k3", "the estimator of gen_kl_error and policy_kl_error", choices=("k1", "k2", "k3")
        ),
        Option(THRESHOLD, "number", None, "mask samples whose mean exp(|d|) exceeds this; null: off", nullable=True),
    ),
    keys=(
        MetricKey(LOSS_KEYS[0], "token mean of exp(|prev - gen|): 1 = no mismatch (the nemo-rl pack gates it)"),
        MetricKey(LOSS_KEYS[1], "token mean of the KL estimator with logr = prev - gen: KL(gen || train)"),
        MetricKey(LOSS_KEYS[2], "token mean of the KL estimator with logr = gen - prev: KL(train || gen)"),
        MetricKey(LOSS_KEYS[3], "token mean of the Jensen-Shannon divergence to the mixture (k3 form)"),
        MetricKey(LOSS_KEYS[4], "token mean of the importance weight after truncation (sequence weights: their sum)"),
        MetricKey(LOSS_KEYS[5], "samples in the loss"),
        MetricKey(OOB, "share of tokens (seq-mask-tis: samples) whose weight is out of bounds", "a truncation type"),
        MetricKey(SEQ_KEYS[0], "largest per-sample mean exp(|d|)"),
        MetricKey(SEQ_KEYS[1], "mean over samples of it"),
        MetricKey(SEQ_KEYS[2], "smallest"),
        MetricKey(SEQ_KEYS[3], "largest, over the samples the threshold keeps"),
        MetricKey(SEQ_KEYS[4], "mean, over the samples kept"),
        MetricKey(SEQ_KEYS[5], "smallest, over the samples kept"),
        MetricKey(MASKED, "samples masked by seq_logprob_error_threshold"),
        *weight_keys(NAME, "NeMo-RL", "loss token", "NeMo-RL's correction"),
    ),
    settings=settings,
    left_out=(
        "left out: probs_ratio*, approx_entropy, loss and kl_penalty compare the current policy with the old one "
        "(and need advantages), and masked_correct_pct needs the rewards: a dump of the two engines holds neither"
    ),
    batching="one GRPO step (one global batch; its micro-batches normalised by its global counts)",
    forms=FORMS,
)
