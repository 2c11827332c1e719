"""TRL 1.16.0's vLLM importance-sampling correction (``GRPOTrainer._generate_and_score_completions``, inline in
the trainer: the ratio at ``trl/trainer/grpo_trainer.py:2660-2707``, its metrics at ``:2860-2896``).

Per token ``d = nan_to_num((old - vllm) * mask)`` in float32 (NaN to 0, +-inf to +-float32's largest); the
sequence modes sum ``d`` over the completion and take ``exp`` of the sum, with no clamp on the log (a sum above
~88.7 overflows to inf); the token modes take ``exp(d)``. ``*_truncate`` clamps the ratio to [clip_min, clip_max],
``*_mask`` sets a ratio outside them to 0. TRL logs ``sampling/sampling_logp_difference/mean|max`` (|old - vllm|
over the completion tokens, NaN left out; 0 for none) and ``sampling/importance_sampling_ratio/min|mean|max``,
over every sequence of the batch in the sequence modes (an empty completion's ratio is exp(0) = 1) and over the
completion tokens in the token modes (0 for none); the masked ratios' zeros are in them.

With the current policy's log-probs and the advantages in the dump (``--current-col``, ``--advantages-col``), the
loss's clip fractions of ``_compute_loss`` (``:3083-3096`` the ratio ``coef_1 = exp(current - old)``, per token or
the exp of a completion's mean log-ratio; ``:3109-3138`` the loss types; ``:3253-3288`` their metrics) are computed
too: ``clip_ratio/low_mean|high_mean|region_mean`` (the share of completion tokens, or of completions at the sequence
level, whose ratio is below ``1 - epsilon`` with a negative advantage, above ``1 + epsilon_high`` (after ``delta``'s
clamp) with a positive one, or either), ``clip_ratio/low_min`` and ``/high_max`` (the least and greatest completion
mean, an empty completion's NaN left out), and ``cispo_clip_ratio`` for ``loss_type`` cispo. TRL's advantages are one
per completion; at the sequence level a completion whose tokens carry different advantages leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.frameworks.base import (
    Framework,
    FrameworkMetrics,
    MetricKey,
    Needs,
    Option,
    TokenRows,
    exp32,
    f32,
    input_constant_per_row,
    weight_keys,
)
from rcdiag.frameworks.correction import UNIT_STATISTIC, Band, Correction, Form, Unit, Weight
from rcdiag.metrics.base import MetricValue, Reduce, VerlCrash
from rcdiag.runtime.errors import ConfigError

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
PREFIX = "sampling/"
DIFF_MEAN = "sampling/sampling_logp_difference/mean"
DIFF_MAX = "sampling/sampling_logp_difference/max"
RATIO_MIN = "sampling/importance_sampling_ratio/min"
RATIO_MEAN = "sampling/importance_sampling_ratio/mean"
RATIO_MAX = "sampling/importance_sampling_ratio/max"
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
"""The loss types that clip the ratio PPO's way and log ``clip_ratio/*``."""
CLIP_KEYS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
)
CISPO_KEY = "cispo_clip_ratio"
LOSS_INPUTS = ("log_prob", "advantages")


@dataclass(frozen=True)
class TRLSettings:
    """``GRPOConfig``'s four fields that shape the correction, after its ``__post_init__``."""

    enabled: bool
    """``vllm_importance_sampling_correction``."""
    mode: str
    clip_max: float | None
    clip_min: float | None
    loss_type: str = "dapo"
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    """As the trainer resolves it: ``epsilon`` where not given."""
    level: str = "token"
    """``importance_sampling_level``."""
    delta: float | None = None

    @property
    def sequence(self) -> bool:
        return self.mode.startswith("sequence")

    @property
    def truncate(self) -> bool:
        return self.mode.endswith("truncate")

    def new_metrics(self) -> TRLMetrics | None:
        return TRLMetrics(self) if self.enabled else None

    def loss_keys(self) -> tuple[str, ...]:
        """The loss's clip keys these settings log (from the current policy and the advantages)."""
        if self.loss_type in CLIPPED_TYPES:
            return CLIP_KEYS
        return (CISPO_KEY,) if self.loss_type == "cispo" else ()

    def needs(self) -> tuple[Needs, ...]:
        keys = self.loss_keys()
        return (Needs(keys, LOSS_INPUTS),) if keys and self.enabled else ()

    def notes(self) -> tuple[str, ...]:
        if not self.enabled:
            return ("vllm_importance_sampling_correction is false: TRL computes no ratio and logs no sampling/* key",)
        unit = "sequence" if self.sequence else "completion token"
        return (
            f"sampling/importance_sampling_ratio/* are over every {unit} of a step, the ratios the "
            f"{'truncation' if self.truncate else 'mask'} left (a masked one counts as 0); rcdiag/trl/* weigh each "
            "token's loss by its ratio, token by token",
            "a dump step is one generation batch on one process: TRL logs the mean over processes of each process's "
            "mean (the min of the minima, the max of the maxima), and averages the batches of one optimizer step "
            "(steps_per_generation > 1)",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "vllm_importance_sampling_correction": self.enabled,
            "vllm_importance_sampling_mode": self.mode,
            "vllm_importance_sampling_clip_max": self.clip_max,
            "vllm_importance_sampling_clip_min": self.clip_min,
            "loss_type": self.loss_type,
            "epsilon": self.epsilon,
            "epsilon_high": self.epsilon_high,
            "importance_sampling_level": self.level,
            "delta": self.delta,
        }

    def correction(self) -> Correction:
        if not self.enabled:
            return Correction(Weight("one", label="vllm_importance_sampling_correction: false"))
        unit: Unit = "product" if self.sequence else "token"
        bounds = f"[C_min, C_max] = [{_bound(self.clip_min)}, {_bound(self.clip_max)}]"
        quirk = "does not clamp the log-ratio" + (" sum (above ~88.7 its exp is inf)" if self.sequence else "")
        what = "the product of a completion's ratios" if self.sequence else "each token's ratio"
        if self.truncate:
            weight = Weight(unit, self.clip_min, self.clip_max, label=f"{self.mode} {bounds}: {what} clamped")
            return Correction(weight, quirks=(quirk,)).normal()
        label = f"{self.mode} {bounds}: {what}, set to 0 outside"
        band = Band(UNIT_STATISTIC[unit], self.clip_min, self.clip_max, label=label)
        return Correction(Weight(unit, label=label), (band,), quirks=(quirk,)).normal()

    def apply(self, ratio: np.ndarray) -> np.ndarray:
        """The ratios after the mode's truncation or mask (float32, bounds rounded to float32 as torch does)."""
        low, high = f32(self.clip_min), f32(self.clip_max)
        if self.truncate:
            if low is not None:
                ratio = np.maximum(ratio, low)  # NaN propagates, as in torch.clamp
            return np.minimum(ratio, high) if high is not None else ratio
        outside = np.zeros(ratio.shape, dtype=bool)
        if low is not None:
            outside |= ratio < low
        if high is not None:
            outside |= ratio > high
        return np.where(outside, np.float32(0.0), ratio)


class TRLMetrics(FrameworkMetrics):
    """One step's ``sampling/*`` keys and rcdiag's token-weighted reading of the correction."""

    NAME = "trl"
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "diff_sum": "sum",
        "diff_n": "sum",
        "diff_max": "max",
        "ratio_sum": "sum",
        "ratio_n": "sum",
        "ratio_min": "min",
        "ratio_max": "max",
        "clip_seen": "sum",
        "clip_units": "sum",
        "clip_low": "sum",
        "clip_high": "sum",
        "clip_region": "sum",
        "clip_low_min": "min",
        "clip_high_max": "max",
        "clip_means": "sum",
        "clip_varies": "sum",
    }
    settings: TRLSettings

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        diff = rows.diff
        delta = np.abs(diff)
        delta = delta[~np.isnan(delta)]
        safe = np.nan_to_num(diff, nan=0.0)  # +-inf to +-float32's largest, as torch.nan_to_num
        units = exp32(rows.row_sum(safe).astype(np.float32) if self.settings.sequence else safe)
        ratio = self.settings.apply(units)
        weight = rows.per_token(ratio) if self.settings.sequence else ratio
        changed = None
        if self.settings.truncate:  # where the clamp moved the ratio (NaN stays NaN: not moved)
            moved = (ratio != units) & ~np.isnan(units)
            changed = rows.per_token(moved) if self.settings.sequence else moved
        self.add_spread("diff", delta)
        self.add_spread("ratio", ratio)
        self.add_weights(weight, rows, changed)
        if rows.current is not None and rows.advantages is not None and self.settings.loss_keys():
            self._clip(rows, rows.current, rows.advantages)

    def _clip(self, rows: TokenRows, current: np.ndarray, advantages: np.ndarray) -> None:
        """The loss's clip flags: per token (token level), or per completion (sequence level, ``coef_1`` of shape
        (B, 1) and TRL's (B,) advantages)."""
        s = self.settings
        log_ratio = current - rows.old
        if s.level == "sequence":
            coef = exp32(rows.row_mean(log_ratio))
            advantages, varies = input_constant_per_row(rows, advantages)
            self.add(clip_varies=float(varies))
        else:
            coef = exp32(log_ratio)
        if s.loss_type == "cispo":
            low = high = (coef > f32(s.epsilon_high)) & (advantages > 0)
        else:
            delta = f32(s.delta)
            if delta is not None:
                coef = np.minimum(coef, delta)
            low = (coef < f32(1 - s.epsilon)) & (advantages < 0)
            high = (coef > f32(1 + s.epsilon_high)) & (advantages > 0)
        region = low | high
        if s.level == "sequence":
            low_means, high_means, units = low.astype(np.float64), high.astype(np.float64), rows.n_rows
            seen = np.ones(rows.n_rows, dtype=bool)
        else:
            n = np.maximum(rows.counts, 1)
            low_means = rows.row_sum(low) / n
            high_means = rows.row_sum(high) / n
            units, seen = rows.n_tokens, rows.counts > 0  # an empty completion's mean is NaN: left out
        self.add(
            clip_seen=float(rows.n_rows),  # rows, not blocks: a state is the same however the rows were cut
            clip_units=float(units),
            clip_low=float(np.count_nonzero(low)),
            clip_high=float(np.count_nonzero(high)),
            clip_region=float(np.count_nonzero(region)),
            clip_low_min=float(low_means[seen].min()) if seen.any() else np.inf,
            clip_high_max=float(high_means[seen].max()) if seen.any() else -np.inf,
            clip_means=float(np.count_nonzero(seen)),
        )

    def keys(self) -> list[str]:
        return [DIFF_MEAN, DIFF_MAX, RATIO_MIN, RATIO_MEAN, RATIO_MAX, *self.settings.loss_keys(), *self.weight_keys()]

    def _loss_values(self) -> dict[str, MetricValue]:
        """The clip keys, where every block had the current policy and the advantages (and, at the sequence level,
        one advantage per completion): TRL's 0 for a step without a unit, NaN (``None``) for min/max without a
        completion mean."""
        st = self.state
        if not st["clip_seen"] or st["clip_varies"]:
            return {}
        units, means = max(st["clip_units"], 1.0), st["clip_means"]
        if self.settings.loss_type == "cispo":
            return {CISPO_KEY: st["clip_high"] / units}
        return {
            CLIP_KEYS[0]: st["clip_low"] / units,
            CLIP_KEYS[1]: st["clip_high"] / units,
            CLIP_KEYS[2]: st["clip_region"] / units,
            CLIP_KEYS[3]: st["clip_low_min"] if means else None,
            CLIP_KEYS[4]: st["clip_high_max"] if means else None,
        }

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """TRL's values (0 where it has nothing to reduce, as it logs) and rcdiag's (``None`` without a token)."""
        st = self.state
        diff, ratio = st["diff_n"], st["ratio_n"]
        return {
            DIFF_MEAN: st["diff_sum"] / diff if diff else 0.0,
            DIFF_MAX: st["diff_max"] if diff else 0.0,
            RATIO_MIN: st["ratio_min"] if ratio else 0.0,
            RATIO_MEAN: st["ratio_sum"] / ratio if ratio else 0.0,
            RATIO_MAX: st["ratio_max"] if ratio else 0.0,
            **self._loss_values(),
            **self.weight_values(),
        }, []


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> TRLSettings:
    """``GRPOConfig.__post_init__``'s checks and its deprecated cap; TRL's own messages."""
    clip_max = values["vllm_importance_sampling_clip_max"]
    if values["vllm_importance_sampling_cap"] is not None:
        clip_max = values["vllm_importance_sampling_cap"]
    clip_min = values["vllm_importance_sampling_clip_min"]
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ConfigError(
            f"vllm_importance_sampling_clip_min ({clip_min}) must be less than vllm_importance_sampling_clip_max "
            f"({clip_max})."
        )
    mode = values["vllm_importance_sampling_mode"]
    correction = values["vllm_importance_sampling_correction"]
    if correction and mode.endswith("truncate") and clip_min is None and clip_max is None:
        raise ConfigError(
            f"vllm_importance_sampling_mode={mode} with neither clip_min nor clip_max: TRL 1.16.0 crashes at its "
            "first batch (torch.clamp needs a bound); set vllm_importance_sampling_clip_max"
        )
    epsilon = values["epsilon"]
    high = values["epsilon_high"]
    return TRLSettings(
        correction,
        mode,
        clip_max,
        clip_min,
        loss_type=values["loss_type"],
        epsilon=epsilon,
        epsilon_high=epsilon if high is None else high,
        level=values["importance_sampling_level"],
        delta=values["delta"],
    )


def _bound(value: float | None) -> str:
    return "null" if value is None else f"{value:g}"


def _mode(mode: str) -> Callable[[float | None, float | None], dict[str, Any]]:
    def options(low: float | None, high: float | None) -> dict[str, Any]:
        return {
            "vllm_importance_sampling_mode": mode,
            "vllm_importance_sampling_clip_min": low,
            "vllm_importance_sampling_clip_max": high,
        }

    return options


FORMS = (
    Form("one", "none", lambda low, high: {"vllm_importance_sampling_correction": False}),
    Form("token", "clamp", _mode("token_truncate")),
    Form("token", "band", _mode("token_mask"), statistic="ratio"),
    Form("token", "none", _mode("token_mask")),
    Form("product", "clamp", _mode("sequence_truncate")),
    Form("product", "band", _mode("sequence_mask"), statistic="product"),
    Form("product", "none", _mode("sequence_mask")),
)
"""Each mode, its bounds from the setting translated (TRL's own check refuses a truncation without a bound)."""

FRAMEWORK = Framework(
    name="trl",
    title="TRL",
    release="1.16.0",
    source="trl/trainer/grpo_trainer.py:2660-2707 (ratio), 2860-2896 (metrics); trl/trainer/utils.py:1124-1156",
    options=(
        Option("vllm_importance_sampling_correction", "bool", True, "apply the IS correction (and log sampling/*)"),
        Option(
            "vllm_importance_sampling_mode",
            "choice",
            "sequence_mask",
            "token or sequence ratio; truncate (clamp) or mask (zero outside the bounds)",
            choices=MODES,
        ),
        Option("vllm_importance_sampling_clip_max", "number", 3.0, "upper bound C_max", nullable=True),
        Option("vllm_importance_sampling_clip_min", "number", None, "lower bound C_min", nullable=True),
        Option("vllm_importance_sampling_cap", "number", None, "deprecated: sets clip_max", nullable=True),
        Option("loss_type", "choice", "dapo", "the loss; which clip keys it logs", choices=LOSS_TYPES),
        Option("epsilon", "number", 0.2, "PPO clip: a ratio below 1 - epsilon is clipped (negative advantage)"),
        Option("epsilon_high", "number", None, "PPO clip above 1 + epsilon_high (null: epsilon)", nullable=True),
        Option(
            "importance_sampling_level",
            "choice",
            "token",
            "the PPO ratio per token, or per completion (exp of its mean log-ratio)",
            choices=("token", "sequence"),
        ),
        Option("delta", "number", None, "two-sided clip: the ratio clamped to at most delta", nullable=True),
    ),
    keys=(
        MetricKey(DIFF_MEAN, "mean |old - vllm| over the completion tokens (NaN left out)"),
        MetricKey(DIFF_MAX, "largest |old - vllm|"),
        MetricKey(RATIO_MIN, "smallest ratio after truncation or mask (per sequence or per token)"),
        MetricKey(RATIO_MEAN, "mean ratio after truncation or mask; a masked ratio counts as 0"),
        MetricKey(RATIO_MAX, "largest ratio after truncation or mask"),
        MetricKey(
            CLIP_KEYS[0],
            "share of completion tokens (completions at the sequence level) whose ratio current/old is below "
            "1 - epsilon with a negative advantage",
            "loss_type grpo/bnpo/dr_grpo/dapo/luspo, with the current policy and the advantages",
        ),
        MetricKey(CLIP_KEYS[1], "share whose ratio (after delta) is above 1 + epsilon_high with a positive advantage"),
        MetricKey(CLIP_KEYS[2], "share clipped either way"),
        MetricKey(CLIP_KEYS[3], "least completion's share of low-clipped tokens"),
        MetricKey(CLIP_KEYS[4], "greatest completion's share of high-clipped tokens"),
        MetricKey(
            CISPO_KEY,
            "share whose ratio is above epsilon_high with a positive advantage",
            "loss_type cispo, with the current policy and the advantages",
        ),
        *weight_keys("trl", "TRL", "completion token", "TRL's mask"),
    ),
    settings=settings,
    left_out=(
        "left out: kl (the reference model's log-probs), entropy (the current policy's entropies), policy_loss and "
        "vespo/phi_seq_mean (the whole loss), and the off-policy sequence mask (off_policy_mask_threshold), which "
        "TRL logs no key of"
    ),
    batching="one generation batch (_generate_and_score_completions) on one process",
    forms=FORMS,
)
