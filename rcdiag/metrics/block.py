"""A block: whole sequences of one batch, valid tokens only, on one backend.

Per-token arrays are float32, as in verl, so clamps, exp overflow and threshold comparisons behave the same;
per-row arrays are float64 (there are few rows, and their sums and means are where float32 loses digits).
Expressions that cancel (k3 = e^d - 1 - d, e^(2d) - 1 for chi2) are evaluated in float64 from ``expm1``; the k3
statistic RS compares with its threshold is then rounded once to float32 (the correctly rounded value, where
float32 arithmetic keeps a few digits of a small k3 and so can keep a token whose exact k3 is above the bound).

A block holds the rows' raw tokens and their mask; ``old``, ``rollout`` and everything derived from them are the
valid tokens only (padding dropped on first use), and a row may have zero valid tokens (an empty or fully masked
response, which still counts in verl's all-rows metrics). Two paths, chosen by the backend (``fused``): on the
numpy backend the compiled kernels read the raw block once (``sums``: every token sum, the compacted log-ratio
``lr`` and the configuration's k1 bands, ``rcdiag.kernels.tokens``), and the RS statistics and their bands come
from ``statistic`` and ``band`` (``rcdiag.kernels.statistics``); on torch the same quantities are derived from
the per-token arrays. Derived per-token and per-row arrays are computed once, on first use, and shared by every
metric group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rcdiag.backend import Array, Backend, NumpyBackend
from rcdiag.core.formulas import clamp_log_ratio, k1, k2, k3
from rcdiag.core.limits import SAFETY_BOUND

if TYPE_CHECKING:
    from rcdiag.metrics.tokens import Band, Statistic, TokenSums


class Block:
    """Flat float32 log-probs of valid tokens plus per-row token counts."""

    def __init__(
        self,
        backend: Backend,
        old: np.ndarray,
        rollout: np.ndarray,
        lengths: np.ndarray,
        *,
        mask: np.ndarray | None = None,
        raw_lengths: np.ndarray | None = None,
        k1_bands: tuple[tuple[float, float], ...] = (),
    ) -> None:
        """``old``/``rollout`` are host arrays of the rows' tokens; with a boolean ``mask`` they still hold the
        padding (``raw_lengths`` tokens per row, ``lengths`` of them valid), which is dropped only when a
        metric needs the valid tokens one by one (the fused CPU pass reads the raw block)."""
        self.b = backend
        self.k1_bands = k1_bands
        """Float32 bounds ``(lo, hi)`` of the configuration's token-level k1 RS options: the fused CPU pass
        takes what they reject while it reads the rows (``band``)."""
        self.raw = (old, rollout, mask, lengths if raw_lengths is None else raw_lengths)
        """(old, rollout, mask or ``None``, tokens per row) as given, on the host."""
        self.seg = backend.segments(lengths)
        self.row_len: Array = backend.asarray(lengths.astype(np.float64))
        self.n_rows = self.seg.n_rows
        self.n_tokens = self.seg.n_tokens

    @cached_property
    def _valid(self) -> tuple[Array, Array]:
        old, rollout, mask, _ = self.raw
        if mask is not None:
            old, rollout = old[mask], rollout[mask]
        return self.b.asarray(old), self.b.asarray(rollout)

    @property
    def old(self) -> Array:
        """Trainer log-probs of the valid tokens (float32, on the backend)."""
        return self._valid[0]

    @property
    def rollout(self) -> Array:
        """Rollout log-probs of the valid tokens (float32, on the backend)."""
        return self._valid[1]

    @cached_property
    def sums(self) -> TokenSums:
        """Every per-token sum the off-policy metrics, the extras and the histogram fold in (one fused pass on
        CPU)."""
        from rcdiag.metrics.tokens import token_sums

        return token_sums(self)

    @cached_property
    def row_valid(self) -> Array:
        """Rows with at least one valid token (verl's ``seq_valid_mask``)."""
        return self.row_len > 0

    @cached_property
    def n_valid_rows(self) -> int:
        return self.b.count(self.row_valid)

    def row_mean(self, row_sums: Array) -> Array:
        """Per-row masked mean (float64), 0 for empty rows (verl's ``masked_mean(..., axis=-1)``)."""
        return row_sums / self.b.clip(self.row_len, 1.0, None)

    @cached_property
    def lr(self) -> Array:
        """``old - rollout``: log(pi_train / pi_rollout) per token, float32, unclamped (on CPU, the fused pass
        has written it)."""
        if self.fused:
            return self.sums.lr
        return self.old - self.rollout

    @cached_property
    def lr_range(self) -> tuple[float, float]:
        """(min, max) of the log-ratio over the block (NaN if any is NaN)."""
        if self.fused:
            return self.sums.lr_min, self.sums.lr_max
        return self.b.min(self.lr), self.b.max(self.lr)

    @property
    def fused(self) -> bool:
        """Whether the token sums come from the fused CPU pass (numpy backend) rather than from the per-token
        arrays (which the generic path derives them from)."""
        return isinstance(self.b, NumpyBackend)

    @cached_property
    def within_clamp(self) -> bool:
        """Every log-ratio is a number within [-20, 20], so verl's clamps change nothing in this block."""
        low, high = self.lr_range
        return low >= -SAFETY_BOUND and high <= SAFETY_BOUND

    @cached_property
    def lr_safe(self) -> Array:
        """The log-ratio clamped to [-20, 20] (the log-ratio itself when no value is beyond the bound)."""
        return self.lr if self.within_clamp else clamp_log_ratio(self.b, self.lr)

    @cached_property
    def lr_safe64(self) -> Array:
        """The clamped log-ratio in float64, for the statistics that cancel in float32."""
        return self.b.to_float64(self.lr_safe)

    @cached_property
    def ratio_minus_one(self) -> Array:
        """``e^d - 1`` of the clamped log-ratio, float64 ``expm1``: exact where ``ratio - 1`` would cancel. k3 is
        ``ratio_minus_one - d`` and chi2's ``ratio^2 - 1`` is ``ratio_minus_one * (ratio_minus_one + 2)``."""
        return self.b.expm1(self.lr_safe64)

    @cached_property
    def ratio(self) -> Array:
        """Token IS ratio ``exp(clamp(lr))``."""
        return self.b.exp(self.lr_safe)

    @cached_property
    def row_sum_lr(self) -> Array:
        """Per-row sum of the unclamped log-ratio, float64: the difference of the rows' log-prob sums, which
        is exact in float64 where summing float32 per-token differences would round each of them."""
        return self.row_sum_old - self.row_sum_rollout

    @property
    def row_sum_old(self) -> Array:
        return self.sums.row_sum_old

    @property
    def row_sum_rollout(self) -> Array:
        return self.sums.row_sum_rollout

    @property
    def seq_log_ratio(self) -> Array:
        """verl's sequence log-ratio S_i: the per-row sum of the unclamped log-ratio (0 for empty rows)."""
        return self.row_sum_lr

    @cached_property
    def row_mean_old(self) -> Array:
        return self.row_mean(self.row_sum_old)

    @cached_property
    def row_mean_rollout(self) -> Array:
        return self.row_mean(self.row_sum_rollout)

    def k(self, estimator: Literal["k1", "k2", "k3"]) -> Array:
        """Per-token divergence statistic on the clamped log-ratio d: k1 = -d, k2 = d^2/2, k3 = e^d - 1 - d."""
        if self.fused:
            return self.statistic(estimator).stat
        return self.memo(("k", estimator), lambda: _k_stat(self, estimator))

    def statistic(self, estimator: Literal["k1", "k2", "k3"]) -> Statistic:
        """A k statistic of the valid tokens and its per-row sums and extremes, from one fused CPU pass over the
        raw block (numpy backend only)."""
        from rcdiag.metrics.tokens import Statistic

        return self.memo(
            ("statistic", estimator), lambda: Statistic(self.lr, self.seg.lengths, estimator, self.row_lr_range)
        )

    def band(self, estimator: Literal["k1", "k2", "k3"], lo: float, hi: float) -> Band:
        """What the RS band [lo, hi] (float32 bounds; k1 keeps ``lo <= x <= hi``, k2/k3 ``x <= hi``) does to a
        token statistic, per row (fused CPU path only)."""
        found = self.sums.bands.get((lo, hi)) if estimator == "k1" else None
        if found is not None:
            return found
        from rcdiag.metrics.tokens import band

        return band(self.statistic(estimator), self.seg.lengths, lo, hi, estimator == "k1")

    @cached_property
    def row_lr_range(self) -> tuple[Array, Array]:
        """Per-row (min, max) of the log-ratio (+inf / -inf for empty rows; NaN propagates)."""
        if self.fused:
            return self.sums.row_lr_min, self.sums.row_lr_max
        return self.seg.min(self.lr, math.inf), self.seg.max(self.lr, -math.inf)

    def row_sum_k(self, estimator: Literal["k1", "k2", "k3"]) -> Array:
        """Per-row float64 sums of a k statistic (shared by every option that needs them).

        k1 = -clamp(lr): for a row whose log-ratios all lie within the bound, its sum is the negated row sum of
        the log-ratio (already known, exact in float64); other rows sum their clamped values. The choice depends
        on the row alone, never on the block, so no metric depends on how rows fall into blocks.
        """
        if estimator == "k1":
            return self.memo(("row_sum_k", "k1"), self._row_sum_k1)
        if self.fused:
            return self.statistic(estimator).row_sum
        return self.memo(("row_sum_k", estimator), lambda: self.seg.sum(self.k(estimator)))

    def row_extremes_k(self, estimator: Literal["k1", "k2", "k3"]) -> tuple[Array, Array]:
        """Per-row (max, min) of a k statistic (-inf / +inf for empty rows; NaN propagates)."""
        if self.fused:
            found = self.statistic(estimator)
            return found.row_max, found.row_min
        return self.memo(
            ("row_extremes_k", estimator),
            lambda: (self.seg.max(self.k(estimator), -math.inf), self.seg.min(self.k(estimator), math.inf)),
        )

    def row_max_k(self, estimator: Literal["k1", "k2", "k3"]) -> Array:
        """Per-row maxima of a k statistic (0 for empty rows), shared by every option that needs them."""
        if self.fused:
            return self.memo(
                ("row_max_k", estimator), lambda: np.where(self.row_valid, self.statistic(estimator).row_max, 0.0)
            )
        return self.memo(("row_max_k", estimator), lambda: self.seg.max(self.k(estimator), 0.0))

    def _row_sum_k1(self) -> Array:
        if self.within_clamp:
            return -self.row_sum_lr
        b, seg = self.b, self.seg
        if self.fused:
            # no clamped token in a row whose k1 = -clamp(lr) stays strictly inside (-20, 20)
            found = self.statistic("k1")
            inside = (found.row_min > -SAFETY_BOUND) & (found.row_max < SAFETY_BOUND)
            return np.where(inside, -self.row_sum_lr, found.row_sum)
        inside = (seg.max(self.lr, 0.0) <= SAFETY_BOUND) & (seg.min(self.lr, 0.0) >= -SAFETY_BOUND)
        return b.where(inside, -self.row_sum_lr, seg.sum(self.k("k1")))

    def memo(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per block and ``key`` (values several metric groups share)."""
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            cache[key] = compute()
        return cache[key]


def _k_stat(block: Block, estimator: str) -> Array:
    d = block.lr_safe
    if estimator == "k1":
        return k1(d)
    if estimator == "k2":
        return k2(d)
    # float64 expm1(d) - d, rounded once: float32 exp(d) - 1 - d keeps about 3 digits at d = 0.04
    return block.b.to_float32(k3(block.ratio_minus_one, block.lr_safe64))
