"""Rejection sampling: per-option masks and metrics, and the two aggregates (verl's
``compute_rollout_rejection_mask`` / ``compute_rs_metrics``).

Statistics on the clamped log-ratio d = clamp(old - rollout, ±20): k1 = -d, k2 = d²/2, k3 = e^d - 1 - d, taken
per token (``token_*``) or per row as the sum, mean or max over the row's valid tokens. k1 keeps
``log(L) <= stat <= log(U)``, which is ``1/U <= ratio <= 1/L`` (the reverse of what verl's docs say for
asymmetric bounds); k2/k3 keep ``stat <= U``. Bounds are inclusive, fractions strict, NaN is rejected. Options
combine with AND. Per-option ``seq_*`` metrics and ``seq_masked_fraction`` run over rows with a valid token;
the aggregate ``rollout_rs_seq_masked_fraction`` runs over all rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rcdiag.core.formulas import rs_keep
from rcdiag.core.limits import f32
from rcdiag.metrics.backend import Array
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash
from rcdiag.metrics.block import Block
from rcdiag.settings.correction import Estimator, RSOption

_SUFFIXES = (
    "mean",
    "max",
    "min",
    "fraction_high",
    "fraction_low",
    "std",
    "seq_mean",
    "seq_std",
    "seq_max",
    "seq_min",
    "seq_max_deviation",
    "seq_fraction_high",
    "seq_fraction_low",
    "masked_fraction",
    "seq_masked_fraction",
)
AGGREGATE_KEYS = ("rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction")


@dataclass
class Rejection:
    """What one option finds in one block: what it rejects, and the values its accumulator folds in.

    ``masked_tokens`` counts rejected valid tokens and ``rows_hit`` marks rows with a rejected token; token
    options give ``token_mask`` (built only if the aggregate needs it), sequence options give ``rows``.
    ``states`` holds the option's accumulator values for this block.
    """

    masked_tokens: float
    rows_hit: Array
    states: dict[str, float | tuple]
    token_mask: Callable[[], Array] | None = None
    rows: Array | None = None
    seq_value: Array | None = None
    """The per-row statistic (for token options: the row mean of the token statistic), float64."""
    row_counts: Array | None = None
    """Token options on CPU: rejected tokens per row (float64), so the aggregate needs no token mask."""


def row_statistic(block: Block, option: RSOption) -> Array:
    """verl's per-row value of an option: the row's sum, mean or max of the token statistic (0 for an empty
    row); for token options, the row mean (what the ``seq_*`` metrics of a token option describe)."""
    return _row_statistic(block, option.agg, option.estimator)


def _row_statistic(block: Block, agg: str, estimator: Estimator) -> Array:
    if agg == "sum":
        return block.row_sum_k(estimator)
    if agg == "max":
        return block.row_max_k(estimator)
    return block.row_mean(block.row_sum_k(estimator))


def rejection(block: Block, option: RSOption) -> Rejection:
    """What ``option`` rejects in ``block``, computed once per block: the option's own metrics and the RS
    aggregates both read it, so every accumulator's ``update`` takes only the block."""
    return block.once(_reject, option)


def bounds(option: RSOption) -> tuple[float, float]:
    """``(lower, upper)`` bounds on the statistic as verl compares them: Python floats against float32 tensors,
    i.e. rounded to float32."""
    return f32(option.thr_lo), f32(option.thr_hi)


def _keep(option: RSOption, stat: Array) -> Array:
    lo, hi = bounds(option)
    return rs_keep(stat, lo, hi, option.is_k1)


def _reject(block: Block, opt: RSOption) -> Rejection:
    b = block.b
    lo, hi = bounds(opt)
    valid = block.row_valid
    if opt.level == "token":
        result = _reject_tokens(block, opt)
    else:
        seq_value = row_statistic(block, opt)
        reject = ~_keep(opt, seq_value) & valid
        n = block.row_len
        masked_tokens = b.sum(b.where(reject, n, 0.0))
        states: dict[str, float | tuple] = {
            "clamped": b.moments(b.clip(seq_value, lo, hi), n),
            "masked_tokens": masked_tokens,
            "masked_rows": b.count(reject),
        }
        result = Rejection(masked_tokens=masked_tokens, rows_hit=reject, states=states, rows=reject)
    v, row_states = _row_value_states(block, opt)
    result.seq_value = row_statistic(block, opt)
    result.states.update(row_states, v_hi=b.count(v > hi), v_lo=b.count(v < lo) if opt.is_k1 else 0.0)
    return result


def threshold_free_states(block: Block, option: RSOption) -> dict[str, float | tuple]:
    """The states of an option that do not depend on its threshold (the statistic's sum and extremes, the per-row
    values' moments and extremes), computed once per block: ``rcdiag sweep`` folds them in once for all of an
    option's thresholds."""
    states = dict(_row_value_states(block, option)[1])
    if option.level == "token":
        states.update(_token_value_states(block, option))
    return states


def _token_value_states(block: Block, opt: RSOption) -> dict[str, float | tuple]:
    """Token options: the statistic's sum and extremes (the extremes from the per-row ones), once per block and
    estimator."""
    return block.once(_token_values, opt.estimator)


def _token_values(block: Block, estimator: Estimator) -> dict[str, float | tuple]:
    b = block.b
    row_max, row_min = block.row_extremes_k(estimator)
    stat_sum = b.sum(block.row_sum_k("k1")) if estimator == "k1" else b.sum(block.k(estimator))
    return {"stat_sum": stat_sum, "tok_max": b.max(row_max), "tok_min": b.min(row_min)}


def _row_value_states(block: Block, opt: RSOption) -> tuple[Array, dict[str, float | tuple]]:
    """The threshold-free states of the per-row values (once per block, whatever the number of thresholds), and
    the valid rows' values."""
    return block.once(_row_values, opt.agg, opt.estimator, opt.level)


def _row_values(block: Block, agg: str, estimator: Estimator, level: str) -> tuple[Array, dict[str, float | tuple]]:
    b, seq_value = block.b, _row_statistic(block, agg, estimator)
    v = seq_value[block.row_valid] if block.n_valid_rows < block.n_rows else seq_value
    states: dict[str, float | tuple] = {
        "tokens": block.n_tokens,
        "valid_rows": block.n_valid_rows,
        "v": b.moments(v),
        "v_max": b.max(v),
        "v_min": b.min(v),
        "v_abs_max": b.max(b.abs(v)),
    }
    if level != "token":
        states["stat_sum"] = b.dot(block.row_len, seq_value)
    return v, states


def _reject_tokens(block: Block, opt: RSOption) -> Rejection:
    """Token options: the band pass gives the per-row rejections, both strict counts and the clipped moments."""
    lo, hi = bounds(opt)
    found = block.band(opt.estimator, lo, hi)
    statistic = block.statistic(opt.estimator)  # (not the block: a closure over it would be a cycle)
    states = {
        **_token_value_states(block, opt),
        "tok_hi": found.above,
        "tok_lo": found.below if opt.is_k1 else 0,
        "clamped": found.clipped,
        "masked_tokens": found.masked_tokens,
        "masked_rows": block.b.count(found.rows_hit),
    }
    return Rejection(
        found.masked_tokens,
        found.rows_hit,
        states,
        token_mask=lambda: ~_keep(opt, statistic.stat),
        row_counts=found.row_rejected,
    )


class RSOptionMetrics(Accumulator):
    """The 15 (k1) or 14 (k2/k3) ``rollout_rs_<option>_*`` metrics of one option."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "tokens": "sum",
        "valid_rows": "sum",
        "stat_sum": "sum",
        "tok_max": "max",
        "tok_min": "min",
        "tok_hi": "sum",
        "tok_lo": "sum",
        "clamped": "moments",
        "v": "moments",
        "v_max": "max",
        "v_min": "min",
        "v_abs_max": "max",
        "v_hi": "sum",
        "v_lo": "sum",
        "masked_tokens": "sum",
        "masked_rows": "sum",
    }
    THRESHOLD_STATES: ClassVar[frozenset[str]] = frozenset(
        {"tok_hi", "tok_lo", "clamped", "v_hi", "v_lo", "masked_tokens", "masked_rows"}
    )
    """The states that depend on the option's threshold; the others are ``threshold_free_states``'s, which
    ``rcdiag sweep`` folds in once for all of an option's thresholds (and computes these per threshold)."""
    TOKEN_ONLY: ClassVar[frozenset[str]] = frozenset({"tok_max", "tok_min", "tok_hi", "tok_lo"})
    """The states a sequence option leaves empty (statistics of single tokens)."""

    def __init__(self, option: RSOption) -> None:
        super().__init__()
        self.option = option
        self.prefix = f"rollout_rs_{option.name}"

    def signature(self) -> tuple:
        return (type(self).__name__, self.option)

    def filled_states(self) -> frozenset[str]:
        states = frozenset(self.STATES)
        return states if self.option.level == "token" else states - self.TOKEN_ONLY

    def update(self, block: Block) -> None:
        self.add(**rejection(block, self.option).states)

    def keys(self) -> list[str]:
        return list(_option_keys(self.option))

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st, opt = self.state, self.option
        n_tok, n_valid = st["tokens"], st["valid_rows"]
        if n_tok == 0:
            return dict.fromkeys(self.keys()), []
        std = math.sqrt(st["clamped"].variance) if n_tok > 1 else 0.0
        seq_std = math.sqrt(st["v"].unbiased_variance) if n_valid > 1 else 0.0
        if opt.level == "token":
            extremes = (st["tok_max"], st["tok_min"], st["tok_hi"] / n_tok, st["tok_lo"] / n_tok)
        else:
            extremes = (st["v_max"], st["v_min"], st["v_hi"] / n_valid, st["v_lo"] / n_valid)
        values: dict[str, MetricValue] = {
            "mean": st["stat_sum"] / n_tok,
            "max": extremes[0],
            "min": extremes[1],
            "fraction_high": extremes[2],
            "fraction_low": extremes[3] if opt.is_k1 else 0.0,
            "std": std,
            "seq_mean": st["v"].mean,
            "seq_std": seq_std,
            "seq_max": st["v_max"],
            "seq_min": st["v_min"],
            "seq_max_deviation": st["v_abs_max"],
            "seq_fraction_high": st["v_hi"] / n_valid,
            "seq_fraction_low": st["v_lo"] / n_valid,
            "masked_fraction": st["masked_tokens"] / n_tok,
            "seq_masked_fraction": st["masked_rows"] / n_valid,
        }
        return {key: values[suffix] for key, suffix in _option_suffixes(opt)}, []


@functools.cache
def _option_suffixes(option: RSOption) -> tuple[tuple[str, str], ...]:
    """(key, suffix) of each metric of an option, in verl's order (the sweep's report asks thousands of times)."""
    return tuple(
        (f"rollout_rs_{option.name}_{suffix}", suffix)
        for suffix in _SUFFIXES
        if suffix != "seq_fraction_low" or option.is_k1
    )


def _option_keys(option: RSOption) -> tuple[str, ...]:
    return tuple(key for key, _ in _option_suffixes(option))


class RSAggregateMetrics(Accumulator):
    """``rollout_rs_masked_fraction`` (valid tokens rejected by any of ``options``) and
    ``rollout_rs_seq_masked_fraction`` (rows, of all rows, with a rejected valid token)."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "tokens": "sum",
        "rows": "sum",
        "masked_tokens": "sum",
        "masked_rows": "sum",
    }

    def __init__(self, options: tuple[RSOption, ...]) -> None:
        super().__init__()
        self.options = options

    def signature(self) -> tuple:
        return (type(self).__name__, self.options)

    def update(self, block: Block) -> None:
        b = block.b
        rejections = [rejection(block, option) for option in self.options]
        if len(rejections) == 1:
            only = rejections[0]
            self.add(
                tokens=block.n_tokens,
                rows=block.n_rows,
                masked_tokens=only.masked_tokens,
                masked_rows=b.count(only.rows_hit),
            )
            return
        token_options = [r for r in rejections if r.token_mask is not None]
        row_reject = _any([r.rows for r in rejections if r.rows is not None])
        if len(token_options) == 1 and row_reject is not None:
            only = token_options[0]
            if not b.count(only.rows_hit & row_reject):
                # No row is hit by both kinds: the token option's rejections and the rejected rows' tokens add up.
                self.add(
                    tokens=block.n_tokens,
                    rows=block.n_rows,
                    masked_tokens=only.masked_tokens + b.sum(b.where(row_reject, block.row_len, 0.0)),
                    masked_rows=b.count(only.rows_hit | row_reject),
                )
                return
        if len(token_options) == 1 and token_options[0].row_counts is not None:
            per_row = token_options[0].row_counts
            if row_reject is None:
                masked_tokens, masked_rows = token_options[0].masked_tokens, b.count(per_row > 0)
            else:
                masked_tokens = b.sum(b.where(row_reject, block.row_len, per_row))
                masked_rows = b.count(row_reject | (per_row > 0))
            self.add(tokens=block.n_tokens, rows=block.n_rows, masked_tokens=masked_tokens, masked_rows=masked_rows)
            return
        token_reject = _any([r.token_mask() for r in token_options if r.token_mask is not None])
        if token_reject is None:
            masked_tokens = b.sum(b.where(row_reject, block.row_len, 0.0))
            masked_rows = b.count(row_reject)
        else:
            per_row = block.seg.count(token_reject)
            if row_reject is None:
                masked_tokens = b.count(token_reject)
                masked_rows = b.count(per_row > 0)
            else:
                masked_tokens = b.sum(b.where(row_reject, block.row_len, per_row))
                masked_rows = b.count(row_reject | (per_row > 0))
        self.add(tokens=block.n_tokens, rows=block.n_rows, masked_tokens=masked_tokens, masked_rows=masked_rows)

    def keys(self) -> list[str]:
        return list(AGGREGATE_KEYS)

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st = self.state
        if st["tokens"] == 0:
            return dict.fromkeys(AGGREGATE_KEYS), []
        return {
            "rollout_rs_masked_fraction": st["masked_tokens"] / st["tokens"],
            "rollout_rs_seq_masked_fraction": st["masked_rows"] / st["rows"],
        }, []


def _any(arrays: list[Array]) -> Array | None:
    if not arrays:
        return None
    out = arrays[0]
    for other in arrays[1:]:
        out = out | other
    return out


def rejected_tokens(block: Block, options: tuple[RSOption, ...]) -> np.ndarray | None:
    """Which valid tokens of a numpy ``block`` the options reject together (verl's modified mask is the rest);
    ``None`` without RS. A sequence option rejects every token of a rejected row."""
    rejected: np.ndarray | None = None
    lengths = np.asarray(block.row_len).astype(np.int64)
    for option in options:
        found = rejection(block, option)
        tokens = found.token_mask() if found.token_mask is not None else np.repeat(np.asarray(found.rows), lengths)
        rejected = tokens if rejected is None else rejected | tokens
    return rejected
