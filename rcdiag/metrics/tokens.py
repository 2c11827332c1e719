"""A block's token sums: every per-token quantity verl's off-policy metrics, rcdiag's extras and the log-ratio
histogram fold in, reduced once per block.

On CPU they come from one fused pass over the raw block (``rcdiag.kernels.tokens``: 1-2 ns a token, where a pass
per numpy operation cost about 7); on other backends (torch) from the backend's elementwise operations
(``generic_token_sums``). Both give the same numbers up to float64 rounding (tested), so the accumulators read
one record whatever the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from rcdiag.backend import Array, bin_table
from rcdiag.config import SAFETY_BOUND
from rcdiag.metrics.histogram import EDGES

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block


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
    bands: dict[tuple[float, float], Band] = field(default_factory=dict)
    """What each token-level k1 RS band the block was asked for does (CPU: taken in the same pass)."""


def token_sums(block: Block) -> TokenSums:
    """The block's token sums, from the fused CPU pass on the numpy backend."""
    if block.fused:
        return fused_token_sums(*block.raw, block.k1_bands)
    return generic_token_sums(block)


def fused_token_sums(
    old: np.ndarray,
    rollout: np.ndarray,
    mask: np.ndarray | None,
    lengths: np.ndarray,
    bands: tuple[tuple[float, float], ...] = (),
) -> TokenSums:
    """``TokenSums`` of a raw block: float32 ``old``/``rollout`` with padding, boolean ``mask`` (``None``: every
    token valid) and each row's raw token count; with the ``Band`` of each token-level k1 RS band ``(lo, hi)``
    (float32 bounds), taken in the same pass."""
    from rcdiag.kernels.tokens import N_COUNTS, N_SUMS, order_key, token_pass

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
    )
    empty, has_nan = row_counts[:, 0] == 0, row_counts[:, 1] > 0
    row_min = np.where(empty, math.inf, np.where(has_nan, math.nan, order_key(row_keys[:, 0])))
    row_max = np.where(empty, -math.inf, np.where(has_nan, math.nan, order_key(row_keys[:, 1])))
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
        bands={band: Band.of(rows, out) for band, rows, out in zip(bands, band_rows, band_out, strict=True)},
    )


def generic_token_sums(block: Block) -> TokenSums:
    """``TokenSums`` from the backend's elementwise operations over the compacted block (the torch path; on
    numpy, the reference the fused pass is tested against)."""
    from rcdiag.metrics.offpolicy import chi2_terms, k3_terms

    b, seg, lr = block.b, block.seg, block.lr
    abs_lr = b.abs(lr)
    lo, hi = b.min(lr), b.max(lr)
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
        exp_abs_sum=b.sum(b.exp(abs_lr)),
        k3_sum=b.sum(k3_terms(block)),
        chi2_sum=b.sum(chi2_terms(block)),
        clamped=b.count(abs_lr > SAFETY_BOUND),
        log_ratio_counts=b.bin_counts(lr, EDGES),
    )


class Statistic:
    """A k statistic over a block's valid tokens (``Block.k``) with its per-row reductions, from the log-ratios
    the fused token pass compacted. k1's per-row extremes follow from the rows' log-ratio extremes (k1 = -clamp(d)
    is monotone), so k1 needs no pass over the rows unless its row sums are asked for."""

    def __init__(
        self, lr: np.ndarray, valid_lengths: np.ndarray, estimator: str, row_range: tuple[np.ndarray, np.ndarray]
    ) -> None:
        self.lr = lr
        self.estimator = estimator
        self._lengths = np.ascontiguousarray(valid_lengths, dtype=np.int64)
        if estimator == "k1":
            row_lo, row_hi = row_range
            empty = self._lengths == 0
            self.row_max = np.where(empty, -math.inf, -np.clip(row_lo, -SAFETY_BOUND, SAFETY_BOUND))
            """float64 per-row maxima (-inf for an empty row; NaN where the row holds a NaN)."""
            self.row_min = np.where(empty, math.inf, -np.clip(row_hi, -SAFETY_BOUND, SAFETY_BOUND))
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


def band(stat: Statistic, valid_lengths: np.ndarray, lo: float, hi: float, two_sided: bool) -> Band:
    """What the band ``[lo, hi]`` (``two_sided``: k1; else only ``<= hi``) does to a statistic, per row."""
    from rcdiag.kernels.statistics import threshold_pass
    from rcdiag.kernels.tokens import k1_band_pass

    lengths = np.ascontiguousarray(valid_lengths, dtype=np.int64)
    if stat.estimator == "k1":  # the token pass's own band kernel, on the log-ratios (no k1 array is built)
        rows = np.empty((1, lengths.shape[0]), dtype=np.int64)
        out = np.zeros((1, 5), dtype=np.float64)
        k1_band_pass(stat.lr, lengths, lo, hi, rows, out)
        return Band.of(rows[0], out[0])
    rejected = np.empty(lengths.shape[0], dtype=np.int64)
    summary = np.empty(5, dtype=np.float64)
    threshold_pass(stat.stat, lengths, lo, hi, two_sided, rejected, summary)
    return Band.of(rejected, summary)


@dataclass(frozen=True)
class Band:
    """Per-row rejections of a band, its strict above/below counts and the moments of the clipped statistic."""

    row_rejected: np.ndarray
    """float64 per-row rejected tokens (NaN statistics are rejected)."""
    above: int
    below: int
    clipped: tuple[float, float, float]
    """(n, mean, M2) of the statistic clipped to the band."""

    @classmethod
    def of(cls, rejected: np.ndarray, summary: np.ndarray) -> Band:
        """From a kernel's per-row rejected counts and its (above, below, n, mean, M2)."""
        above, below, n, mean, m2 = summary.tolist()
        return cls(rejected.astype(np.float64), int(above), int(below), (n, mean, m2))


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
