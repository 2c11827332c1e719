"""The per-token passes over a block, behind one interface (``TokenPasses``) with two implementations, chosen once
per backend (``rcdiag.metrics.backend.Backend.passes``):

* ``CompiledPasses`` (the numpy backend): numba kernels read the raw block (``rcdiag.kernels.metric_pass``: every token
  sum, the compacted log-ratio and the configuration's k1 bands in one pass, 1-2 ns a token, where a pass per numpy
  operation cost about 7; ``rcdiag.kernels.statistics``: the RS statistics and their bands);
* ``ArrayPasses`` (torch, and any backend): the backend's elementwise operations and segment reductions over the
  valid tokens, from the formulas of ``rcdiag.core.formulas``.
* ``NumpyPasses`` (the numpy backend on a small dump, ``rcdiag.kernels.small``: no numba is imported): the array
  passes on numpy, with the kernels' own k3 series (``rcdiag.core.formulas.k3_series_parts``), so the k3 statistic
  is the kernel's bit for bit and the sums agree to float64 rounding.

Three passes, each giving one record whatever the device: the token pass (``TokenSums``: every per-token quantity
verl's off-policy metrics, rcdiag's extras and the log-ratio histogram fold in), the statistic pass (``Statistic``:
an RS option's k1/k2/k3 per token with its per-row sums and extremes) and the band pass (``BandRejection``: what an RS
threshold band rejects, per row). Both implementations give the same numbers up to float64 rounding (tested,
tests/engine/test_token_kernel.py). The passes read a block (``rcdiag.metrics.block.Block``, named here only as the
``TokenBlock`` protocol: the block imports this module's records).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from rcdiag.core.bins import EDGES, bin_table
from rcdiag.core.formulas import (
    K3_SERIES_MAX,
    Array,
    chi2_term,
    clamp_log_ratio,
    exp_overflows,
    k1,
    k2,
    k3,
    k3_series_parts,
    k3_verl_array,
    rs_keep,
)
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.settings.correction import Estimator


class TokenBlock(Protocol):
    """What the passes read of a block (``rcdiag.metrics.block.Block``)."""

    b: Any
    seg: Any
    raw: tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]
    k1_bands: tuple[tuple[float, float], ...]

    # read-only here: ``Block`` computes these once (cached properties)
    @property
    def old(self) -> Array: ...
    @property
    def rollout(self) -> Array: ...
    @property
    def lr(self) -> Array: ...
    @property
    def lr_safe(self) -> Array: ...
    @property
    def lr_safe64(self) -> Array: ...
    @property
    def ratio_minus_one(self) -> Array: ...
    @property
    def within_clamp(self) -> bool: ...
    @property
    def sums(self) -> TokenSums: ...

    def statistic(self, estimator: Estimator) -> Statistic: ...


@dataclass(frozen=True)
class BitDifferences:
    """Per row of a block: its valid tokens whose two float32 log-probs differ in any bit (their bit patterns), the
    greatest distance between the two in float32 ulps (``rcdiag.core.formulas.ulp_distance``: 0 for none, and for
    signed zeros, which differ in bits but not in value) and the
    list position (padding included, 0-based) of the first such token (-1 for none). int64, on the host: the
    exact-match section's input (``rcdiag.sections.exact``) and the ``--sequences`` file's."""

    tokens: np.ndarray
    max_ulp: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, table: np.ndarray) -> BitDifferences:
        """From a ``[rows, 3]`` table of (tokens, max_ulp, first)."""
        return cls(table[:, 0], table[:, 1], table[:, 2])


def bit_differences(
    old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray, compiled: bool
) -> BitDifferences:
    """``BitDifferences`` of a raw block on the host (float32 ``old``/``rollout`` with padding, boolean ``mask`` or
    ``None``, raw tokens per row): the kernel's pass (``compiled``), or its numpy form on a small dump's path."""
    if not compiled:
        from rcdiag.kernels.small import row_differences

        return BitDifferences.of(row_differences(old, rollout, mask, lengths))
    from rcdiag.kernels.metric_pass import N_DIFFERENCES, differences_pass

    inputs = _kernel_inputs(old, rollout, mask, lengths)
    table = np.empty((inputs[3].shape[0], N_DIFFERENCES), dtype=np.int64)
    differences_pass(*inputs, table)
    return BitDifferences.of(table)


@dataclass(frozen=True)
class TokenSums:
    """Per-row and per-block sums over a block's valid tokens, d = float32(old - rollout)."""

    lr: Array | None
    """d of every valid token (float32, compacted) where the fused pass wrote it (CPU), else ``None``."""
    row_lr_min: Array | None
    """Per-row least d (float64; +inf for an empty row, NaN where the row holds a NaN d); CPU only."""
    row_lr_max: Array | None
    row_sum_old: Array
    """float64 per-row sums of ``old`` (0 for an empty row), on the block's backend."""
    row_sum_rollout: Array
    lr_min: float
    """Least d (NaN if any d is NaN; +inf for a block without tokens)."""
    lr_max: float
    nan: int
    """Tokens whose d is NaN (both log-probs -inf)."""
    abs_sum: float
    """Sum of |d|."""
    exp_abs_sum: float
    """Sum of e^|d| (inf where |d| overflows float32's exp, as in verl's float32 arithmetic)."""
    k3_sum: float
    """Sum of e^d - 1 - d, unclamped (inf where e^d overflows float32)."""
    chi2_sum: float
    """Sum of e^(2 clamp(d, ±20)) - 1."""
    clamped: int
    """Tokens with |d| beyond verl's safety bound."""
    log_ratio_counts: np.ndarray
    """int64 counts of d in the ``len(EDGES) + 1`` bins of ``rcdiag.metrics.histogram`` (NaN in none)."""
    differences: BitDifferences
    """Each row's valid tokens whose two log-probs differ in any bit (CPU: taken in the same pass)."""
    bands: dict[tuple[float, float], BandRejection] = field(default_factory=dict)
    """What each token-level k1 RS band the block was asked for does (CPU: taken in the same pass)."""


def fused_token_sums(
    old: np.ndarray,
    rollout: np.ndarray,
    mask: np.ndarray | None,
    lengths: np.ndarray,
    bands: tuple[tuple[float, float], ...] = (),
) -> TokenSums:
    """``TokenSums`` of a raw block: float32 ``old``/``rollout`` with padding, boolean ``mask`` (``None``: every
    token valid) and each row's raw token count; with the ``BandRejection`` of each token-level k1 RS band ``(lo, hi)``
    (float32 bounds), taken in the same pass."""
    from rcdiag.core.formulas import order_key_floats
    from rcdiag.kernels.metric_pass import N_COUNTS, N_DIFFERENCES, N_SUMS, token_pass

    table = bin_table(EDGES)
    assert table is not None  # EDGES are float32 numbers, at most one per table cell
    base, edge = table
    n_rows = lengths.shape[0]
    lr = np.empty(old.shape[0], dtype=np.float32)
    row_sums = np.empty((n_rows, 2), dtype=np.float64)
    row_keys = np.empty((n_rows, 2), dtype=np.int32)
    row_counts = np.empty((n_rows, 2), dtype=np.int64)
    sums = np.empty(N_SUMS, dtype=np.float64)
    counts = np.empty(N_COUNTS, dtype=np.int64)
    hist = np.zeros((4, EDGES.shape[0] + 1), dtype=np.int64)
    band_lo = np.array([lo for lo, _ in bands], dtype=np.float32)
    band_hi = np.array([hi for _, hi in bands], dtype=np.float32)
    band_rows = np.empty((len(bands), n_rows), dtype=np.int64)
    band_out = np.zeros((len(bands), 5), dtype=np.float64)
    row_diff = np.empty((n_rows, N_DIFFERENCES), dtype=np.int64)
    inputs = _kernel_inputs(old, rollout, mask, lengths)
    token_pass(
        *inputs,
        base,
        edge,
        band_lo,
        band_hi,
        lr,
        row_sums,
        row_keys,
        row_counts,
        sums,
        counts,
        hist,
        band_rows,
        band_out,
        row_diff,
    )
    empty, has_nan = row_counts[:, 0] == 0, row_counts[:, 1] > 0
    row_min = np.where(empty, math.inf, np.where(has_nan, math.nan, order_key_floats(row_keys[:, 0])))
    row_max = np.where(empty, -math.inf, np.where(has_nan, math.nan, order_key_floats(row_keys[:, 1])))
    nan = int(counts[0])
    lo, hi = (float(np.min(row_min)), float(np.max(row_max))) if n_rows else (math.inf, -math.inf)
    return TokenSums(
        lr=lr[: int(counts[3])],
        row_lr_min=row_min,
        row_lr_max=row_max,
        row_sum_old=row_sums[:, 0].copy(),
        row_sum_rollout=row_sums[:, 1].copy(),
        lr_min=lo,
        lr_max=hi,
        nan=nan,
        abs_sum=float(sums[0]),
        exp_abs_sum=float(sums[1]),
        k3_sum=float(sums[2]),
        chi2_sum=float(sums[3]),
        clamped=int(counts[1]),
        log_ratio_counts=hist.sum(axis=0),
        differences=BitDifferences.of(row_diff),
        bands={band: BandRejection.of(rows, out) for band, rows, out in zip(bands, band_rows, band_out, strict=True)},
    )


def generic_token_sums(block: TokenBlock, term_sums: tuple[float, float, float] | None = None) -> TokenSums:
    """``TokenSums`` from the backend's elementwise operations over the compacted block (the array path; on numpy,
    the reference the fused pass is tested against). ``term_sums``: the sums of e^|d|, k3 and chi2 terms, where the
    caller takes them its own way (``series_token_sums``)."""
    b, seg, lr = block.b, block.seg, block.lr
    abs_lr = b.abs(lr)
    lo, hi = b.min(lr), b.max(lr)
    if term_sums is None:
        term_sums = (b.sum(b.exp(abs_lr)), b.sum(_k3_terms(block)), b.sum(chi2_term(block.ratio_minus_one)))
    exp_abs_sum, k3_sum, chi2_sum = term_sums
    return TokenSums(
        lr=None,
        row_lr_min=None,
        row_lr_max=None,
        row_sum_old=seg.sum(block.old),
        row_sum_rollout=seg.sum(block.rollout),
        lr_min=lo,
        lr_max=hi,
        nan=b.count(lr != lr),
        abs_sum=b.sum(abs_lr),
        exp_abs_sum=exp_abs_sum,
        k3_sum=k3_sum,
        chi2_sum=chi2_sum,
        clamped=b.count(abs_lr > SAFETY_BOUND),
        log_ratio_counts=b.bin_counts(lr, EDGES),
        differences=bit_differences(*block.raw, compiled=b.compiled),
    )


def series_token_sums(block: TokenBlock) -> TokenSums:
    """``generic_token_sums`` on numpy with the kernels' per-token terms (``fused_token_sums``): e^|d|, k3 and chi2
    in float64 by k3's Taylor series below ``K3_SERIES_MAX``, and by ``exp``/``expm1`` with verl's float32 overflow
    and clamp rules above, so the sums agree with the kernels' to float64 rounding (float32 ``exp`` and
    ``expm1(d) - d`` would move them by 1e-9 and, for a tiny d, lose k3's digits)."""
    d = block.lr.astype(np.float64)
    a = np.abs(d)
    small = a < K3_SERIES_MAX  # False for NaN
    ds = np.where(small, d, 0.0)
    even, odd = k3_series_parts(ds)
    k3_terms = even + odd
    chi2_terms = chi2_term(ds + k3_terms)
    exp_terms = 1.0 + np.abs(ds) + even + np.abs(odd)
    if not small.all():
        large = ~small
        dl, al = d[large], a[large]
        k3_terms[large] = k3_verl_array(np, np.expm1(dl), dl)
        exp_terms[large] = np.where(exp_overflows(al), math.inf, np.exp(al))
        chi2_terms[large] = chi2_term(np.expm1(clamp_log_ratio(np, dl)))
    b = block.b
    return generic_token_sums(block, (b.sum(exp_terms), b.sum(k3_terms), b.sum(chi2_terms)))


def _k3_terms(block: TokenBlock) -> Array:
    """Per token, e^lr - 1 - lr, unclamped as in verl, in float64 from ``expm1``; inf for a log-ratio whose e^lr
    overflows float32, as in verl. When no log-ratio reaches the clamp, ``e^d - 1`` is the one already computed
    for the block; the values are the same either way, so no sum depends on how rows fall into blocks."""
    b = block.b
    if block.within_clamp:
        return k3(block.ratio_minus_one, block.lr_safe64)
    lr = b.to_float64(block.lr)
    return k3_verl_array(b, b.expm1(lr), lr)


class Statistic(ABC):
    """A k statistic over a block's valid tokens (``Block.k``) with its per-row reductions: ``stat`` (float32, one
    per valid token, in order), ``row_sum`` (float64, 0 for an empty row), ``row_max`` / ``row_min`` (-inf / +inf
    for an empty row; NaN where the row holds a NaN)."""

    estimator: Estimator
    stat: Array
    row_sum: Array
    row_max: Array
    row_min: Array


class ArrayStatistic(Statistic):
    """The statistic from the backend's elementwise operations on the clamped log-ratio; its row reductions taken
    when first asked for."""

    def __init__(self, block: TokenBlock, estimator: Estimator) -> None:
        self.estimator = estimator
        self._seg = block.seg
        self.stat = self._statistic(block, estimator)

    @staticmethod
    def _statistic(block: TokenBlock, estimator: Estimator) -> Array:
        d = block.lr_safe
        if estimator == "k1":
            return k1(d)
        if estimator == "k2":
            return k2(d)
        # float64 expm1(d) - d, rounded once: float32 exp(d) - 1 - d keeps about 3 digits at d = 0.04
        return block.b.to_float32(k3(block.ratio_minus_one, block.lr_safe64))

    @cached_property
    def row_sum(self) -> Array:
        return self._seg.sum(self.stat)

    @cached_property
    def row_max(self) -> Array:
        return self._seg.max(self.stat, -math.inf)

    @cached_property
    def row_min(self) -> Array:
        return self._seg.min(self.stat, math.inf)


class SeriesStatistic(ArrayStatistic):
    """``ArrayStatistic`` on numpy with the kernel's k3 (``rcdiag.kernels.statistics``): float64 k3 by its Taylor
    series below ``K3_SERIES_MAX`` and ``expm1(d) - d`` above, rounded once to float32, in the kernel's order of
    operations: the very float32 values, so an RS band keeps and rejects the same tokens on both paths."""

    @staticmethod
    def _statistic(block: TokenBlock, estimator: Estimator) -> Array:
        if estimator != "k3":
            return ArrayStatistic._statistic(block, estimator)
        x = block.lr_safe64
        small = np.abs(x) < K3_SERIES_MAX  # False for NaN
        even, odd = k3_series_parts(np.where(small, x, 0.0))
        out = (even + odd).astype(np.float32)
        if not small.all():
            large = ~small
            out[large] = k3(np.expm1(x[large]), x[large]).astype(np.float32)
        return out


class CompiledStatistic(Statistic):
    """The statistic from the log-ratios the fused token pass compacted (``rcdiag.kernels.statistics``). k1's
    per-row extremes follow from the rows' log-ratio extremes (k1 = -clamp(d) is monotone), so k1 needs no pass
    over the rows unless its row sums are asked for."""

    def __init__(
        self, lr: np.ndarray, valid_lengths: np.ndarray, estimator: Estimator, row_range: tuple[np.ndarray, np.ndarray]
    ) -> None:
        self.lr = lr
        self.estimator = estimator
        self._lengths = np.ascontiguousarray(valid_lengths, dtype=np.int64)
        if estimator == "k1":
            row_lo, row_hi = row_range
            empty = self._lengths == 0
            self.row_max = np.where(empty, -math.inf, k1(clamp_log_ratio(np, row_lo)))
            """float64 per-row maxima (-inf for an empty row; NaN where the row holds a NaN)."""
            self.row_min = np.where(empty, math.inf, k1(clamp_log_ratio(np, row_hi)))
            """float64 per-row minima (+inf for an empty row; NaN where the row holds a NaN)."""
        else:
            self._reduce()

    @cached_property
    def stat(self) -> np.ndarray:
        """float32, one per valid token, in order (k1 is built only when asked for: its band reads the
        log-ratios)."""
        from rcdiag.kernels.statistics import ESTIMATORS, statistic

        out = np.empty(self.lr.shape[0], dtype=np.float32)
        statistic(self.lr, ESTIMATORS[self.estimator], out)
        return out

    def _reduce(self) -> None:
        from rcdiag.kernels.statistics import row_reductions

        n_rows = self._lengths.shape[0]
        row_sum, row_max, row_min = (np.empty(n_rows, dtype=np.float64) for _ in range(3))
        row_reductions(self.stat, self._lengths, row_sum, row_max, row_min)
        self._row_sum = row_sum
        if not hasattr(self, "row_max"):  # k1 has them already, from the log-ratio extremes
            self.row_max, self.row_min = row_max, row_min

    @property
    def row_sum(self) -> np.ndarray:
        """float64 per-row sums (0 for an empty row)."""
        if not hasattr(self, "_row_sum"):
            self._reduce()
        return self._row_sum


def compiled_band(
    stat: CompiledStatistic, valid_lengths: np.ndarray, lo: float, hi: float, two_sided: bool
) -> BandRejection:
    """What the band ``[lo, hi]`` (``two_sided``: k1; else only ``<= hi``) does to a statistic, per row."""
    from rcdiag.kernels.metric_pass import k1_band_pass
    from rcdiag.kernels.statistics import threshold_pass

    lengths = np.ascontiguousarray(valid_lengths, dtype=np.int64)
    if stat.estimator == "k1":  # the token pass's own band kernel, on the log-ratios (no k1 array is built)
        rows = np.empty((1, lengths.shape[0]), dtype=np.int64)
        out = np.zeros((1, 5), dtype=np.float64)
        k1_band_pass(stat.lr, lengths, lo, hi, rows, out)
        return BandRejection.of(rows[0], out[0])
    rejected = np.empty(lengths.shape[0], dtype=np.int64)
    summary = np.empty(5, dtype=np.float64)
    threshold_pass(stat.stat, lengths, lo, hi, two_sided, rejected, summary)
    return BandRejection.of(rejected, summary)


@dataclass(frozen=True)
class BandRejection:
    """What an RS band does to a token statistic: the tokens it rejects and the rows they lie in, its strict
    above/below counts and the moments of the statistic clipped to it."""

    masked_tokens: float
    """Rejected valid tokens (NaN statistics are rejected)."""
    rows_hit: Array
    """Rows with a rejected token (bool)."""
    above: int
    below: int
    clipped: tuple[float, float, float]
    """(n, mean, M2) of the statistic clipped to the band."""
    row_rejected: np.ndarray | None = None
    """float64 per-row rejected tokens where the pass counts them (compiled), so the RS aggregate needs no token
    mask; ``None`` on the array path."""

    @classmethod
    def of(cls, rejected: np.ndarray, summary: np.ndarray) -> BandRejection:
        """From a kernel's per-row rejected counts and its (above, below, n, mean, M2)."""
        above, below, n, mean, m2 = summary.tolist()
        row_rejected = rejected.astype(np.float64)
        return cls(float(row_rejected.sum()), row_rejected > 0, int(above), int(below), (n, mean, m2), row_rejected)


def _kernel_inputs(
    old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.ascontiguousarray(old, dtype=np.float32),
        np.ascontiguousarray(rollout, dtype=np.float32),
        _all_valid(old.shape[0]) if mask is None else np.ascontiguousarray(mask, dtype=np.bool_),
        np.ascontiguousarray(lengths, dtype=np.int64),
    )


_ONES = np.ones(0, dtype=np.bool_)


def _all_valid(n: int) -> np.ndarray:
    """A read-only all-true mask of ``n`` tokens: a view of one array kept for every block."""
    global _ONES
    if _ONES.shape[0] < n:
        _ONES = np.ones(max(n, 1 << 17), dtype=np.bool_)
        _ONES.setflags(write=False)
    return _ONES[:n]


class TokenPasses(ABC):
    """The per-token passes over a block; one implementation per kind of backend (``Backend.passes``). The block
    caches what they return (``rcdiag.metrics.block.Block``)."""

    @abstractmethod
    def token_sums(self, block: TokenBlock) -> TokenSums:
        """Every per-token sum the off-policy metrics, the extras and the histogram fold in."""

    @abstractmethod
    def log_ratio(self, block: TokenBlock) -> Array:
        """d = ``old - rollout`` of the valid tokens, float32, unclamped."""

    @abstractmethod
    def log_ratio_range(self, block: TokenBlock) -> tuple[float, float]:
        """(min, max) of d over the block (NaN if any is NaN)."""

    @abstractmethod
    def row_log_ratio_range(self, block: TokenBlock) -> tuple[Array, Array]:
        """Per-row (min, max) of d (+inf / -inf for empty rows; NaN propagates)."""

    @abstractmethod
    def statistic(self, block: TokenBlock, estimator: Estimator) -> Statistic:
        """The k1/k2/k3 statistic of the clamped d per token, with its per-row reductions."""

    @abstractmethod
    def rows_inside_clamp(self, block: TokenBlock) -> Array:
        """Rows whose k1 row sum is the negated row sum of d (no token clamped): ``Block.row_sum_k``."""

    @abstractmethod
    def band(self, block: TokenBlock, estimator: Estimator, lo: float, hi: float) -> BandRejection:
        """What the RS band [lo, hi] (float32 bounds; k1 keeps ``lo <= x <= hi``, k2/k3 ``x <= hi``) does to the
        estimator's statistic."""


class CompiledPasses(TokenPasses):
    """The numba kernels over the raw block (numpy backend)."""

    def token_sums(self, block: TokenBlock) -> TokenSums:
        return fused_token_sums(*block.raw, block.k1_bands)

    def log_ratio(self, block: TokenBlock) -> Array:
        return block.sums.lr

    def log_ratio_range(self, block: TokenBlock) -> tuple[float, float]:
        return block.sums.lr_min, block.sums.lr_max

    def row_log_ratio_range(self, block: TokenBlock) -> tuple[Array, Array]:
        return block.sums.row_lr_min, block.sums.row_lr_max

    def statistic(self, block: TokenBlock, estimator: Estimator) -> Statistic:
        return CompiledStatistic(block.lr, block.seg.lengths, estimator, self.row_log_ratio_range(block))

    def rows_inside_clamp(self, block: TokenBlock) -> Array:
        # no clamped token in a row whose k1 = -clamp(lr) stays strictly inside (-20, 20)
        found = block.statistic("k1")
        return (found.row_min > -SAFETY_BOUND) & (found.row_max < SAFETY_BOUND)

    def band(self, block: TokenBlock, estimator: Estimator, lo: float, hi: float) -> BandRejection:
        found = block.sums.bands.get((lo, hi)) if estimator == "k1" else None
        if found is not None:
            return found
        statistic = block.statistic(estimator)
        assert isinstance(statistic, CompiledStatistic)
        return compiled_band(statistic, block.seg.lengths, lo, hi, estimator == "k1")


class ArrayPasses(TokenPasses):
    """The backend's elementwise operations and segment reductions over the valid tokens (torch; any backend)."""

    def token_sums(self, block: TokenBlock) -> TokenSums:
        return generic_token_sums(block)

    def log_ratio(self, block: TokenBlock) -> Array:
        return block.old - block.rollout

    def log_ratio_range(self, block: TokenBlock) -> tuple[float, float]:
        return block.b.min(block.lr), block.b.max(block.lr)

    def row_log_ratio_range(self, block: TokenBlock) -> tuple[Array, Array]:
        return block.seg.min(block.lr, math.inf), block.seg.max(block.lr, -math.inf)

    def statistic(self, block: TokenBlock, estimator: Estimator) -> Statistic:
        return ArrayStatistic(block, estimator)

    def rows_inside_clamp(self, block: TokenBlock) -> Array:
        seg, lr = block.seg, block.lr
        return (seg.max(lr, 0.0) <= SAFETY_BOUND) & (seg.min(lr, 0.0) >= -SAFETY_BOUND)

    def band(self, block: TokenBlock, estimator: Estimator, lo: float, hi: float) -> BandRejection:
        """In as few passes as possible: the per-row extremes give the global extremes and the rows with a
        rejected token; the two strict counts give the rejected tokens, since a token is rejected exactly when it
        lies below the lower or above the upper bound (NaN and an inverted band take the token mask)."""
        b, seg = block.b, block.seg
        statistic = block.statistic(estimator)
        stat, row_max, row_min = statistic.stat, statistic.row_max, statistic.row_min
        two_sided = estimator == "k1"
        above = b.count(stat > hi)
        below = b.count(stat < lo) if two_sided else 0
        if not b.count(stat != stat) and lo <= hi:  # (an inverted k1 band, accepted by verl <= 0.8.0, rejects all)
            masked_tokens: float = above + below
            rows_hit = (row_max > hi) | (row_min < lo) if two_sided else row_max > hi
        else:  # NaN statistics fail every comparison: verl rejects them
            reject = ~rs_keep(stat, lo, hi, two_sided)
            masked_tokens = b.count(reject)
            rows_hit = seg.count(reject) > 0
        no_clamp = lo <= b.min(row_min) and b.max(row_max) <= hi
        return BandRejection(
            masked_tokens, rows_hit, above, below, b.moments(stat if no_clamp else b.clip(stat, lo, hi))
        )


class NumpyPasses(ArrayPasses):
    """The array passes on numpy with the kernels' series (``series_token_sums``, ``SeriesStatistic``): a small
    dump's passes, which never import numba (``rcdiag.kernels.small``); the same numbers as ``CompiledPasses`` to
    float64 rounding, and the same float32 statistics, so the same RS decisions."""

    def token_sums(self, block: TokenBlock) -> TokenSums:
        return series_token_sums(block)

    def statistic(self, block: TokenBlock, estimator: Estimator) -> Statistic:
        return SeriesStatistic(block, estimator)
