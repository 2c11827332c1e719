"""A block's token sums: every per-token quantity verl's off-policy metrics, rcdiag's extras and the log-ratio
histogram fold in, reduced once per block.

On CPU they come from one fused pass over the raw block (``rcdiag.kernels.tokens``: 1-2 ns a token, where a pass
per numpy operation cost about 7); on other backends (torch) from the backend's elementwise operations
(``generic_token_sums``). Both give the same numbers up to float64 rounding (tested), so the accumulators read
one record whatever the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


def token_sums(block: Block) -> TokenSums:
    """The block's token sums, from the fused CPU pass on the numpy backend."""
    if block.fused:
        return fused_token_sums(*block.raw)
    return generic_token_sums(block)


def fused_token_sums(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray) -> TokenSums:
    """``TokenSums`` of a raw block: float32 ``old``/``rollout`` with padding, boolean ``mask`` (``None``: every
    token valid) and each row's raw token count."""
    from rcdiag.kernels.tokens import N_COUNTS, N_SUMS, token_pass

    table = bin_table(EDGES)
    assert table is not None  # EDGES are float32 numbers, at most one per table cell
    base, edge = table
    n_rows = lengths.shape[0]
    row_sums = np.empty((n_rows, 2), dtype=np.float64)
    sums = np.empty(N_SUMS, dtype=np.float64)
    counts = np.empty(N_COUNTS, dtype=np.int64)
    hist = np.zeros((4, EDGES.shape[0] + 1), dtype=np.int64)
    token_pass(
        np.ascontiguousarray(old, dtype=np.float32),
        np.ascontiguousarray(rollout, dtype=np.float32),
        _all_valid(old.shape[0]) if mask is None else np.ascontiguousarray(mask, dtype=np.bool_),
        np.ascontiguousarray(lengths, dtype=np.int64),
        base,
        edge,
        row_sums,
        sums,
        counts,
        hist,
    )
    nan = int(counts[0])
    lo, hi = (math.nan, math.nan) if nan else (float(sums[4]), float(sums[5]))
    return TokenSums(
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
    )


def generic_token_sums(block: Block) -> TokenSums:
    """``TokenSums`` from the backend's elementwise operations over the compacted block (the torch path; on
    numpy, the reference the fused pass is tested against)."""
    from rcdiag.metrics.offpolicy import chi2_terms, k3_terms

    b, seg, lr = block.b, block.seg, block.lr
    abs_lr = b.abs(lr)
    lo, hi = b.min(lr), b.max(lr)
    return TokenSums(
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


_ONES = np.ones(0, dtype=np.bool_)


def _all_valid(n: int) -> np.ndarray:
    """A read-only all-true mask of ``n`` tokens: a view of one array kept for every block."""
    global _ONES
    if _ONES.shape[0] < n:
        _ONES = np.ones(max(n, 1 << 17), dtype=np.bool_)
        _ONES.setflags(write=False)
    return _ONES[:n]
