"""Importance-sampling weights and their metrics (verl's ``compute_rollout_correction_weights``).

Weights: token level ``exp(clamp(lr, ±20))`` per token; sequence level ``exp(clamp(S_i, ±20))`` per row with
``S_i`` the row sum of the *unclamped* log-ratio, broadcast to the row's tokens. TIS clamps them from above at
``U``; IcePop zeroes those outside ``[L, U]`` (inclusive) and never touches the mask. Metrics describe the
applied weights before batch normalization, except the ``*_fraction_*`` metrics, which look at the raw ones.
The ``seq_*`` metrics and the sequence-level ratio fractions run over **all** rows (an empty row has mean
weight 0, so it always counts as ``seq_fraction_low``); the batch-normalization factor at sequence level
averages over rows with a valid token only.

Two releases differ (``rcdiag.settings.versions``), each a flag here rather than a second accumulator: up to v0.7.1 the
metrics describe the *raw* weights (truncation came after them) and std/ESS clamp them to ``[1/U, U]``; v0.8.0
took ``rollout_is_seq_fraction_*`` from the per-row mean of the applied weights.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from rcdiag.core.formulas import icepop, is_weight, truncate_array
from rcdiag.core.limits import f32
from rcdiag.metrics.backend import Array, Backend
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash
from rcdiag.metrics.block import Block
from rcdiag.settings.correction import SAFETY_BOUND, ISSpec
from rcdiag.settings.versions import VerlVersion

_SEQ_KEYS = (
    "rollout_is_seq_mean",
    "rollout_is_seq_std",
    "rollout_is_seq_max",
    "rollout_is_seq_min",
    "rollout_is_seq_max_deviation",
    "rollout_is_seq_fraction_high",
    "rollout_is_seq_fraction_low",
)
TOKEN_KEYS = (
    "rollout_is_mean",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_std",
    "rollout_is_eff_sample_size",
    *_SEQ_KEYS,
)
SEQUENCE_KEYS = (
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_mean",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_std",
    "rollout_is_eff_sample_size",
    *_SEQ_KEYS,
)


class ISMetrics(Accumulator):
    """The 14 IS metrics, plus ``rollout_is_oob_ratio`` (IcePop) and ``rollout_is_batch_norm_factor``."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        # token-weighted moments of the applied weights w
        "w": "moments",
        "w_max": "max",
        "w_min": "min",
        # raw ratio beyond the bounds: tokens (token level) or rows (sequence level)
        "raw_hi": "sum",
        "raw_lo": "sum",
        "oob_tokens": "sum",
        # sequence level: extremes of the row log-ratio S_i over all rows
        "s_max": "max",
        "s_min": "min",
        # moments of the per-row mean applied weight a_i over all rows
        "a": "moments",
        "a_max": "max",
        "a_min": "min",
        "a_max_dev": "max",
        "rawmean_hi": "sum",
        "rawmean_lo": "sum",
        # verl <= 0.7.1 only: the raw weights clamped to [1/U, U] (std, ESS), and the applied weights' sum over
        # tokens (token level) or valid rows (sequence level) for the batch-norm factor
        "clamped": "moments",
        "applied_sum": "sum",
    }

    def __init__(self, spec: ISSpec, version: VerlVersion) -> None:
        super().__init__()
        self.spec = spec
        self.raw_metrics = version.is_metrics_on_raw_weights
        self.seq_fraction_applied = version.seq_fraction_on_applied_weights
        self.upper = f32(spec.upper)
        self.lower = f32(spec.lower) if spec.lower is not None else None
        self.metric_lower = f32(spec.metric_lower)
        # verl takes the log of a float32 tensor holding the bound.
        with np.errstate(divide="ignore"):
            self.log_upper = float(np.log(np.float32(spec.upper)))
            self.log_lower = float(np.log(np.float32(spec.metric_lower)))

    def signature(self) -> tuple:
        return (type(self).__name__, self.spec, self.raw_metrics, self.seq_fraction_applied)

    def filled_states(self) -> frozenset[str]:
        unfilled = {"s_max", "s_min"} if self.spec.level == "token" else {"w_max", "w_min"}
        if self.lower is None:
            unfilled.add("oob_tokens")
        if not self.raw_metrics:
            unfilled |= {"clamped", "applied_sum"}
        return frozenset(self.STATES) - unfilled

    def apply(self, b: Backend, raw: Array) -> Array:
        """TIS: clamp at U; IcePop: zero outside [L, U]."""
        if self.lower is None:
            return truncate_array(b, raw, self.upper)
        return icepop(b, raw, self.lower, self.upper)

    def update(self, block: Block) -> None:
        b = block.b
        legacy: dict[str, object] = {}
        if self.spec.level == "token":
            raw = block.ratio
            w = self.apply(b, raw)
            m = raw if self.raw_metrics else w  # the weights the metrics describe
            a = block.row_mean(block.seg.sum(m))
            raw_mean = a if self.raw_metrics else block.row_mean(block.seg.sum(raw))
            token_stats = {
                "w": b.moments(m),
                "w_max": b.max(m),
                "w_min": b.min(m),
                "raw_hi": b.count(raw > self.upper),
                "raw_lo": b.count(raw < self.metric_lower),
            }
            if self.lower is not None:
                token_stats["oob_tokens"] = b.count((raw < self.lower) | (raw > self.upper))
            if self.raw_metrics:
                legacy = {"clamped": b.moments(b.clip(raw, self.metric_lower, self.upper)), "applied_sum": b.sum(w)}
        else:
            s = block.seq_log_ratio
            raw_row = is_weight(b, s)
            w_row = self.apply(b, raw_row)
            m_row = raw_row if self.raw_metrics else w_row
            n = block.row_len
            valid = block.row_valid
            a = b.where(valid, m_row, 0.0)
            raw_mean = b.where(valid, raw_row, 0.0)
            token_stats = {
                "w": b.moments(m_row, n),
                "s_max": b.max(s),
                "s_min": b.min(s),
                "raw_hi": b.count(s > self.log_upper),
                "raw_lo": b.count(s < self.log_lower),
            }
            if self.lower is not None:
                oob = (raw_row < self.lower) | (raw_row > self.upper)
                token_stats["oob_tokens"] = b.sum(b.where(oob, n, 0.0))
            if self.raw_metrics:
                legacy = {
                    "clamped": b.moments(b.clip(raw_row, self.metric_lower, self.upper), n),
                    "applied_sum": b.sum(b.where(valid, w_row, 0.0)),
                }
        self.add(**self.row_states(b, block, a, raw_mean), **token_stats, **legacy)

    def row_states(self, b: Backend, block: Block, a: Array, raw_mean: Array) -> dict[str, float | tuple]:
        """The block's counts and the states of the per-row mean weights ``a`` and raw mean ratios (the sweep
        computes ``a`` for many thresholds at once and folds it in here). verl 0.8.0 compared the mean of the
        applied weights, ``a``, where the others compare the raw mean."""
        if self.seq_fraction_applied:
            raw_mean = a
        return {
            "tokens": block.n_tokens,
            "rows": block.n_rows,
            "valid_rows": block.n_valid_rows,
            "a": b.moments(a),
            "a_max": b.max(a),
            "a_min": b.min(a),
            "a_max_dev": b.max(b.abs(a - 1.0)),
            "rawmean_hi": b.count(raw_mean > self.upper),
            "rawmean_lo": b.count(raw_mean < self.metric_lower),
        }

    def keys(self) -> list[str]:
        keys = list(TOKEN_KEYS if self.spec.level == "token" else SEQUENCE_KEYS)
        if self.spec.icepop:
            keys.append("rollout_is_oob_ratio")
        if self.spec.batch_normalize:
            keys.append("rollout_is_batch_norm_factor")
        return keys

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st = self.state
        n_tok, n_rows = st["tokens"], st["rows"]
        if n_tok == 0:
            return dict.fromkeys(self.keys()), []
        crashes: list[VerlCrash] = []
        w, a = st["w"], st["a"]
        mean = w.mean
        # std and ESS use the weights clamped to [0, U] (a no-op on applied weights) or, up to verl 0.7.1, the raw
        # weights clamped to [1/U, U]
        spread = st["clamped"] if self.raw_metrics else w
        std = math.sqrt(spread.variance) if n_tok > 1 else 0.0
        # ESS = 1 / E[(w / (E[w] + 1e-8))^2]; verl divides a Python float by it, so all-zero weights crash.
        # verl adds the 1e-8 to a float32 mean, where it vanishes unless the mean is tiny: so here too (equal
        # weights give an ESS of exactly 1, not 1 + 2e-8/mean).
        spread_mean = spread.mean
        guard = 1e-8 if np.float32(spread_mean) + np.float32(1e-8) != np.float32(spread_mean) else 0.0
        second = spread.second_moment / (spread_mean + guard) ** 2
        ess: MetricValue
        if second == 0.0:
            ess = None
            crashes.append(
                VerlCrash(
                    "verl_crash_ess_zero_division",
                    "rollout_is_eff_sample_size",
                    "every applied IS weight in this batch is 0 (IcePop rejected all of them), so verl's "
                    "ESS computes 1.0 / 0.0 and the trainer dies with ZeroDivisionError",
                )
            )
        else:
            ess = 1.0 / second
        seq_std = math.sqrt(a.unbiased_variance) if n_rows > 1 else 0.0
        values: dict[str, MetricValue] = {
            "rollout_is_mean": mean,
            "rollout_is_ratio_fraction_high": st["raw_hi"] / (n_tok if self.spec.level == "token" else n_rows),
            "rollout_is_ratio_fraction_low": st["raw_lo"] / (n_tok if self.spec.level == "token" else n_rows),
            "rollout_is_std": std,
            "rollout_is_eff_sample_size": ess,
            "rollout_is_seq_mean": a.mean,
            "rollout_is_seq_std": seq_std,
            "rollout_is_seq_max": st["a_max"],
            "rollout_is_seq_min": st["a_min"],
            "rollout_is_seq_max_deviation": st["a_max_dev"],
            "rollout_is_seq_fraction_high": st["rawmean_hi"] / n_rows,
            "rollout_is_seq_fraction_low": st["rawmean_lo"] / n_rows,
        }
        if self.spec.level == "token":
            values["rollout_is_max"] = st["w_max"]
            values["rollout_is_min"] = st["w_min"]
        else:
            with np.errstate(over="ignore", under="ignore"):
                values["rollout_is_max"] = float(np.exp(min(st["s_max"], SAFETY_BOUND)))
                values["rollout_is_min"] = float(np.exp(np.float64(st["s_min"])))
        if self.spec.icepop:
            values["rollout_is_oob_ratio"] = st["oob_tokens"] / n_tok
        if self.spec.batch_normalize:  # over the applied (truncated) weights, in every release
            if self.raw_metrics:
                factor = st["applied_sum"] / (n_tok if self.spec.level == "token" else max(st["valid_rows"], 1e-8))
            else:
                factor = mean if self.spec.level == "token" else a.mean * a.n / max(st["valid_rows"], 1e-8)
            values["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
        return {key: values[key] for key in self.keys()}, crashes
