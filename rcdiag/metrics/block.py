"""A block: whole sequences of one batch, valid tokens only, on one backend.

Per-token arrays are float32, as in verl, so clamps, exp overflow and threshold comparisons behave the same;
per-row arrays are float64 (there are few rows, and their sums and means are where float32 loses digits).
Expressions that cancel (k3 = e^d - 1 - d, e^(2d) - 1 for chi2) are evaluated in float64 from ``expm1``; the k3
statistic RS compares with its threshold is then rounded once to float32 (the correctly rounded value, where
float32 arithmetic keeps a few digits of a small k3 and so can keep a token whose exact k3 is above the bound).

A block holds the rows' raw tokens and their mask; ``old``, ``rollout`` and everything derived from them are the
valid tokens only (padding dropped on first use), and a row may have zero valid tokens (an empty or fully masked
response, which still counts in verl's all-rows metrics). The per-token passes (``sums``, ``statistic``, ``band``
and the log-ratio's ranges) come from the backend's ``passes`` (``rcdiag.metrics.token_passes``: the compiled kernels on
numpy, numpy's array operations for a small dump, array operations on torch), chosen once per backend; the block
caches what they give. Derived per-token and per-row arrays are computed once, on first use, and shared by every
metric group; a value several accumulators share is computed once per block by ``once``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rcdiag.core.formulas import clamp_log_ratio
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.metrics.backend import Array, Backend, NumpyBackend
from rcdiag.settings.correction import Estimator

if TYPE_CHECKING:
    from rcdiag.metrics.token_passes import BandRejection, Statistic, TokenPasses, TokenSums

T = TypeVar("T")


@dataclass(frozen=True)
class RowContext:
    """What the engine knows about a block's rows beyond their values (``Block.rows``), for the whole-dump
    accumulators (``--explain``'s) that place each token in its response and name each response."""

    lengths: np.ndarray
    """List length of each row (padding included)."""
    mask: np.ndarray | None
    """The rows' boolean mask over all their positions (``None``: every position valid)."""
    rows: np.ndarray
    """Each row's number in reading order (skipped rows included)."""
    ids: np.ndarray | None
    step: int | None
    tokens: np.ndarray | None = None
    """The rows' token ids over all their positions, like ``mask`` (``None``: the dump has none, or not read)."""
    labels: dict[str, np.ndarray] | None = None
    """Each label column's value per row (``Chunk.labels``; ``None``: no label column read)."""


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
        rows: RowContext | None = None,
        tokens: np.ndarray | None = None,
        loss_inputs: dict[str, np.ndarray] | None = None,
    ) -> None:
        """``old``/``rollout`` are host arrays of the rows' tokens; with a boolean ``mask`` they still hold the
        padding (``raw_lengths`` tokens per row, ``lengths`` of them valid), which is dropped only when a
        metric needs the valid tokens one by one (the compiled passes read the raw block)."""
        self.b = backend
        self.passes: TokenPasses = backend.passes
        """The per-token passes of this backend (compiled or array)."""
        self.k1_bands = k1_bands
        """Float32 bounds ``(lo, hi)`` of the configuration's token-level k1 RS options: the compiled token pass
        takes what they reject while it reads the rows (``band``)."""
        self.raw = (old, rollout, mask, lengths if raw_lengths is None else raw_lengths)
        """(old, rollout, mask or ``None``, tokens per row) as given, on the host."""
        self.rows = rows
        """The rows' numbers, lengths, ids, step and token ids (given where a whole-dump accumulator reads them)."""
        self.tokens = tokens
        """The rows' token ids over all their positions, like ``raw``'s arrays, on the host (``None``: the dump has
        none, or they were not read)."""
        self.loss_inputs = loss_inputs or {}
        """The dump's optional loss inputs over all the rows' positions, like ``raw``'s arrays, on the host
        (``Chunk.loss_inputs``: ``"advantages"``, ``"log_prob"``); read only by the framework sections."""
        self.seg = backend.segments(lengths)
        self.row_len: Array = backend.asarray(lengths.astype(np.float64))
        self.n_rows = self.seg.n_rows
        self.n_tokens = self.seg.n_tokens
        self._statistics: dict[str, Statistic] = {}
        self._once: dict[tuple, Any] = {}

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
        """Every per-token sum the off-policy metrics, the extras and the histogram fold in (the token pass)."""
        return self.passes.token_sums(self)

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
        """``old - rollout``: log(pi_train / pi_rollout) per token, float32, unclamped (the compiled token pass
        writes it)."""
        return self.passes.log_ratio(self)

    @cached_property
    def lr_range(self) -> tuple[float, float]:
        """(min, max) of the log-ratio over the block (NaN if any is NaN)."""
        return self.passes.log_ratio_range(self)

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

    def k(self, estimator: Estimator) -> Array:
        """Per-token divergence statistic on the clamped log-ratio d: k1 = -d, k2 = d^2/2, k3 = e^d - 1 - d."""
        return self.statistic(estimator).stat

    def statistic(self, estimator: Estimator) -> Statistic:
        """A k statistic of the valid tokens and its per-row sums and extremes (the statistic pass, once per
        estimator)."""
        if estimator not in self._statistics:
            self._statistics[estimator] = self.passes.statistic(self, estimator)
        return self._statistics[estimator]

    def band(self, estimator: Estimator, lo: float, hi: float) -> BandRejection:
        """What the RS band [lo, hi] (float32 bounds; k1 keeps ``lo <= x <= hi``, k2/k3 ``x <= hi``) does to a
        token statistic, per row (the band pass)."""
        return self.passes.band(self, estimator, lo, hi)

    @cached_property
    def row_lr_range(self) -> tuple[Array, Array]:
        """Per-row (min, max) of the log-ratio (+inf / -inf for empty rows; NaN propagates)."""
        return self.passes.row_log_ratio_range(self)

    def row_sum_k(self, estimator: Estimator) -> Array:
        """Per-row float64 sums of a k statistic (shared by every option that needs them).

        k1 = -clamp(lr): for a row whose log-ratios all lie within the bound, its sum is the negated row sum of
        the log-ratio (already known, exact in float64); other rows sum their clamped values. The choice depends
        on the row alone, never on the block, so no metric depends on how rows fall into blocks.
        """
        if estimator == "k1":
            return self._row_sum_k1
        return self.statistic(estimator).row_sum

    def row_extremes_k(self, estimator: Estimator) -> tuple[Array, Array]:
        """Per-row (max, min) of a k statistic (-inf / +inf for empty rows; NaN propagates)."""
        found = self.statistic(estimator)
        return found.row_max, found.row_min

    def row_max_k(self, estimator: Estimator) -> Array:
        """Per-row maxima of a k statistic (0 for empty rows), shared by every option that needs them."""
        return self.once(_row_max_k, estimator)

    @cached_property
    def _row_sum_k1(self) -> Array:
        if self.within_clamp:
            return -self.row_sum_lr
        return self.b.where(self.passes.rows_inside_clamp(self), -self.row_sum_lr, self.statistic("k1").row_sum)

    def once(self, compute: Callable[..., T], *args: Any) -> T:
        """``compute(self, *args)``, computed once per block (a value several accumulators share, such as what an
        RS option rejects). The cache is keyed by the function itself, so only a caller of that function reads
        it; what it returns must not hold the block (a block is freed as soon as the engine drops it)."""
        key = (compute, *args)
        if key not in self._once:
            self._once[key] = compute(self, *args)
        return self._once[key]


def on_host(block: Block) -> Block:
    """The same rows as a block of the host's backend (itself on the host): for values that must not depend on
    the device, such as per-row sums, whose float64 rounding follows the summation order. Built once per block and
    only when asked for (a device block's tokens are already on the host, in ``raw``)."""
    if isinstance(block.b, NumpyBackend):
        return block
    return block.once(_host_twin)


def _host_twin(block: Block) -> Block:
    old, rollout, mask, raw_lengths = block.raw
    lengths = np.asarray(block.b.to_numpy(block.row_len)).astype(np.int64)
    return Block(
        NumpyBackend(),
        old,
        rollout,
        lengths,
        mask=mask,
        raw_lengths=raw_lengths,
        k1_bands=block.k1_bands,
        rows=block.rows,
        loss_inputs=block.loss_inputs,
    )


def _row_max_k(block: Block, estimator: Estimator) -> Array:
    return block.b.where(block.row_valid, block.statistic(estimator).row_max, 0.0)
