"""RS statistics per token on CPU: k1 = -d, k2 = d^2/2, k3 = e^d - 1 - d of the clamped log-ratio
d = clamp(float32(old - rollout), ±20), and what the RS options reduce them to.

``statistic`` computes the statistic of every valid token from the log-ratios the token pass compacted
(``Block.lr``; float32, the values the array path's ``_k_stat`` gives on torch), ``row_reductions`` its per-row
float64 sums and NaN-propagating extremes, and ``threshold_pass`` counts what a k2/k3 band rejects per row and takes
the moments of the statistic clipped to it (k1 bands are counted on the log-ratios by ``rcdiag.kernels.metric_pass``:
in the token pass for the configuration's bands, else by ``k1_band_pass``). The statistic itself is computed by a
kernel without fast-math flags, so k1 and k2 are the very float32 operations numpy does (0.5 * d * d, left to
right); k3 is the float64 value rounded once to float32, from ``rcdiag.kernels.series.k3_series`` below its
edge and ``math.expm1`` above.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from rcdiag.core.formulas import K3_SERIES_MAX, SAFETY_BOUND_F32
from rcdiag.kernels import JIT, JitOptions, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.scalar import clamp, clip, k1, k2, k3, rs_keep
from rcdiag.kernels.series import k3_series

ESTIMATORS = {"k1": 1, "k2": 2, "k3": 3}
"""The estimator codes the kernels take."""

_STRICT: JitOptions = {**JIT, "fastmath": False}


@njit(**_STRICT)
def _statistic_row(lr, estimator, out):
    """The statistic of every log-ratio in ``lr``, into ``out`` (no fast-math: the float32 operations numpy
    does, in its order). One loop per estimator, each without a branch, so each vectorizes; k3 takes the series
    everywhere, then ``math.expm1`` where |d| >= K3_SERIES_MAX (a second, scalar pass, only when there is one)."""
    if estimator == 1:
        for i in range(lr.shape[0]):
            out[i] = k1(clamp(lr[i], SAFETY_BOUND_F32))
    elif estimator == 2:
        for i in range(lr.shape[0]):
            out[i] = k2(clamp(lr[i], SAFETY_BOUND_F32))
    else:
        large = 0
        for i in range(lr.shape[0]):
            x = np.float64(clamp(lr[i], SAFETY_BOUND_F32))
            small = abs(x) < K3_SERIES_MAX  # False for NaN
            out[i] = np.float32(k3_series(x if small else 0.0))
            large += np.int64(not small)
        if large:
            for i in range(lr.shape[0]):
                x = np.float64(clamp(lr[i], SAFETY_BOUND_F32))
                if not abs(x) < K3_SERIES_MAX:
                    out[i] = np.float32(k3(math.expm1(x), x))


@njit(**JIT)
def _row_reduce(stat):
    """(float64 sum, max, min, NaN count) of one row's valid statistics."""
    s = 0.0
    hi = -np.inf
    lo = np.inf
    nan = 0
    for i in range(stat.shape[0]):
        x = np.float64(stat[i])
        s += x
        hi = x if x > hi else hi
        lo = x if x < lo else lo
        nan += np.int64(x != x)
    return s, hi, lo, nan


@njit(**_STRICT)
def statistic(lr, estimator, stat):
    """The statistic of every valid token's log-ratio ``lr``, into ``stat``."""
    _statistic_row(lr, estimator, stat)


@njit(**JIT)
def row_reductions(stat, lengths, row_sum, row_max, row_min):
    """Per-row ``row_sum``, ``row_max`` (-inf for an empty row) and ``row_min`` (+inf) of a compacted
    statistic, extremes NaN where a row holds a NaN."""
    t = 0
    for r in range(lengths.shape[0]):
        n = lengths[r]
        s, hi, lo, nan = _row_reduce(stat[t : t + n])
        row_sum[r] = s
        row_max[r] = np.nan if nan else hi
        row_min[r] = np.nan if nan else lo
        t += n


@njit(**JIT)
def _row_band(stat, lo, hi, two_sided):
    """One row: (rejected, above hi, below lo, float64 sum of the statistic clipped to [lo, hi]). A token is
    kept when ``lo <= x <= hi`` (k1) or ``x <= hi`` (k2, k3); NaN is rejected, counted neither above nor below,
    and clips to NaN. Clipped as torch clamps, ``min(max(x, lo), hi)``: ``hi`` everywhere for an inverted band."""
    rejected = 0
    above = 0
    below = 0
    s = 0.0
    floor = min(lo, hi)  # the clip's floor: torch's clamp gives hi everywhere for an inverted band
    for i in range(stat.shape[0]):
        x = stat[i]
        keep = rs_keep(x, lo, hi, two_sided)
        rejected += np.int64(not keep)
        above += np.int64(x > hi)
        below += np.int64(x < lo)
        c = clip(x, floor, hi)
        s += np.float64(c)
    return rejected, above, below, s


@njit(**JIT)
def _centred_squares(stat, lo, hi, mean):
    m2 = 0.0
    floor = min(lo, hi)
    for i in range(stat.shape[0]):
        x = stat[i]
        c = np.float64(clip(x, floor, hi)) - mean
        m2 += c * c
    return m2


@njit(**JIT)
def threshold_pass(stat, lengths, lo, hi, two_sided, row_rejected, out):
    """Per-row rejected counts into ``row_rejected``; ``out`` = (above, below, n, mean, M2) of the statistic
    clipped to [lo, hi] (float32 bounds; moments centred on this block's mean, as ``Backend.moments``). k1
    bands take the token pass's kernel instead (``rcdiag.kernels.metric_pass.k1_band_pass``)."""
    lo32 = np.float32(lo)
    hi32 = np.float32(hi)
    above = 0
    below = 0
    s = 0.0
    t = 0
    for r in range(lengths.shape[0]):
        n = lengths[r]
        rej, a, b, rs = _row_band(stat[t : t + n], lo32, hi32, two_sided)
        row_rejected[r] = rej
        above += a
        below += b
        s += rs
        t += n
    count = stat.shape[0]
    mean = s / count if count else 0.0
    out[0] = above
    out[1] = below
    out[2] = count
    out[3] = mean
    out[4] = _centred_squares(stat, lo32, hi32, mean) if count else 0.0
