"""The per-token and merge formulas, each written once.

Every function here is plain arithmetic over its arguments, so one definition serves every level: Python floats
(the accumulators), numpy arrays and torch tensors (the array path, ``xp`` being ``numpy`` or an
``rcdiag.metrics.backend.Backend``, which both have ``exp``, ``expm1``, ``clip`` and ``where``) and numba scalars (the
kernels compile these very functions, inlined: ``rcdiag.kernels.scalar``). Scalar selects (``a if c else b``)
are for kernels and Python floats only; their array forms take ``xp``. A function a kernel compiles calls no other
function of this module (numba compiles a call only into a compiled function).

d is the log-ratio ``old - rollout`` (float32, as in verl) and ``em1`` is ``e^d - 1`` taken without cancellation
(float64 ``expm1``): k3 and chi2 are written from it, never as differences of nearly equal numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.core.limits import EXPM1_AT_BOUND, EXPM1_AT_NEG_BOUND, LOG_F32_MAX, SAFETY_BOUND

Array = Any
"""A 1-D numpy array or torch tensor."""
SAFETY_BOUND_F32 = np.float32(SAFETY_BOUND)
"""The clamp's bound as a float32, for clamping float32 log-ratios in float32 (the kernels)."""
HALF32 = np.float32(0.5)
"""k2's 1/2 as a float32, so k2 of a float32 d stays float32 everywhere (numba would widen a Python 0.5)."""
_SIGN_OFF = np.int32(0x7FFFFFFF)


# ------------------------------------------------------------------------------------------------ the clamp


def clamp(x: Any, bound: Any) -> Any:
    """``x`` clamped to ``[-bound, bound]``, NaN kept (a scalar select: kernels pass ``bound`` in ``x``'s type)."""
    return bound if x > bound else (-bound if x < -bound else x)


def clip(x: Any, lo: Any, hi: Any) -> Any:
    """``x`` clipped to ``[lo, hi]``, NaN kept (a scalar select). torch's ``clamp`` of an RS band,
    ``min(max(x, lo), hi)``, is ``clip(x, min(lo, hi), hi)``: ``hi`` everywhere for an inverted band."""
    return lo if x < lo else (hi if x > hi else x)


def clamp_log_ratio(xp: Any, d: Any) -> Any:
    """verl's clamp of log-ratios to ``[-20, 20]`` before ``exp``, on arrays (NaN kept, as torch clamps)."""
    return xp.clip(d, -SAFETY_BOUND, SAFETY_BOUND)


def clamped_expm1(em1: Any, d: Any) -> Any:
    """``e^clamp(d) - 1`` from ``em1 = e^d - 1``: the constants at the clamp's ends, else ``em1`` (scalar)."""
    return EXPM1_AT_BOUND if d > SAFETY_BOUND else (EXPM1_AT_NEG_BOUND if d < -SAFETY_BOUND else em1)


def exp_overflows(d: Any) -> Any:
    """Where verl's float32 ``e^d`` overflows to inf."""
    return d > LOG_F32_MAX


# ------------------------------------------------------------------------------------ the token statistics


def k1(d: Any) -> Any:
    """k1 = -d of the clamped log-ratio."""
    return -d


def k2(d: Any) -> Any:
    """k2 = d^2 / 2 of the clamped log-ratio, in d's float type (``HALF32 * d * d``, left to right)."""
    return HALF32 * d * d


def k3(em1: Any, d: Any) -> Any:
    """k3 = e^d - 1 - d from ``em1 = e^d - 1`` (float64): no cancellation for a small d."""
    return em1 - d


K3_SERIES_MAX = 0.25
"""Below this |d| ``k3_series_parts`` gives k3 (truncation below 1e-19 of k3); at or above it (and for inf and NaN)
k3 is taken from ``expm1``."""
_C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = (1.0 / math.factorial(k) for k in range(2, 14))


def k3_series_parts(d: Any) -> tuple[Any, Any]:
    """The even and odd parts of k3 = e^d - 1 - d for |d| < K3_SERIES_MAX (float64): its Taylor series to d^13/13!,
    split so that e^|d| - 1 - |d| (even part plus |odd part|) costs nothing more (Horner's scheme in d^2). Taking
    k3 directly, not as ``expm1(d) - d``, keeps its digits for a small d. The kernels compile it
    (``rcdiag.kernels.series``); the numpy path evaluates the same operations in the same order."""
    u = d * d
    even = _C2 + u * (_C4 + u * (_C6 + u * (_C8 + u * (_C10 + u * _C12))))
    odd = _C3 + u * (_C5 + u * (_C7 + u * (_C9 + u * (_C11 + u * _C13))))
    return u * even, d * u * odd


def k3_verl(em1: Any, d: Any) -> Any:
    """k3 of the unclamped d as verl's float32 gives it: inf where ``e^d`` overflows (a scalar select; written out,
    not calling ``k3`` and ``exp_overflows``: numba compiles a kernel's call only into a compiled function)."""
    return math.inf if d > LOG_F32_MAX else em1 - d


def k3_verl_array(xp: Any, em1: Any, d: Any) -> Any:
    """``k3_verl`` on arrays."""
    return xp.where(exp_overflows(d), math.inf, k3(em1, d))


def chi2_term(em1: Any) -> Any:
    """chi2's per-token term ``ratio^2 - 1`` as ``(e^d - 1)(e^d + 1)`` from ``em1 = e^d - 1`` (d clamped)."""
    return em1 * (em1 + 2.0)


# ------------------------------------------------------------------------------------------- IS weights


def is_weight(xp: Any, log_ratio: Any) -> Any:
    """An IS weight ``exp(clamp(log_ratio, ±20))`` (a token's d, or a sequence's summed d), on arrays."""
    return xp.exp(clamp_log_ratio(xp, log_ratio))


def truncate(w: Any, cap: Any) -> Any:
    """An IS weight truncated at ``cap`` (TIS: ``min(w, cap)``; a scalar select, NaN kept)."""
    return cap if w > cap else w


def truncate_array(xp: Any, w: Any, cap: Any) -> Any:
    """``truncate`` on arrays (as torch clamps: NaN kept)."""
    return xp.clip(w, None, cap)


def icepop(xp: Any, w: Any, lo: Any, hi: Any) -> Any:
    """IcePop's weights: ``w`` inside ``[lo, hi]`` (inclusive), 0 outside and for NaN (the keep rule's band)."""
    return xp.where(rs_keep(w, lo, hi, True), w, 0.0)


# ---------------------------------------------------------------------------------------- the RS rule


def rs_keep(x: Any, lo: Any, hi: Any, two_sided: Any) -> Any:
    """verl's rejection-sampling keep rule on a statistic (a token's or a sequence's): k1 keeps
    ``lo <= x <= hi``, k2/k3 keep ``x <= hi`` (``two_sided``: k1). Bounds are inclusive, and NaN is never kept.
    ``lo`` and ``hi`` are the float32 roundings of the thresholds (``rcdiag.metrics.rejection.bounds``)."""
    if two_sided:
        return (x >= lo) & (x <= hi)
    return x <= hi


# -------------------------------------------------------------------------------------- the order key


def order_key(bits: Any) -> Any:
    """The int32 key of a float32's bit pattern that orders as the float does (a negative float's bits, all but
    the sign flipped); the map is its own inverse. Integer min/max vectorize where float ones, which must keep
    NaN's meaning, do not; a NaN's key lies beyond the infinities' on its sign's side."""
    return bits ^ ((bits >> 31) & _SIGN_OFF)


def ulp_distance(bits_a: Any, bits_b: Any) -> Any:
    """Float32 ulps between two values given as their int32 bit patterns widened to int64: how many steps of
    ``nextafter`` lead from one to the other, i.e. the distance of their places in the ordered integer
    representation (a float's magnitude bits, negated when its sign bit is set). -0.0 and +0.0 share place 0 (0
    ulps: the same number, though their bits differ); across zero the distance is the sum of both magnitudes' ulps;
    -inf is 1 ulp beyond -FLT_MAX, and -inf to +inf the largest distance, 4,278,190,080 (int64 never overflows). A
    NaN's place lies beyond the infinity of its sign (the value screen keeps NaN out of the valid tokens)."""
    return abs((bits_a & _SIGN_OFF) * ((bits_a >> 31) | 1) - (bits_b & _SIGN_OFF) * ((bits_b >> 31) | 1))


KEY_LOWEST = np.int32(-0x80000000)
"""The least int32 key, beyond every float's: where a search for the greatest key starts."""
KEY_HIGHEST = np.int32(0x7FFFFFFF)
"""The greatest int32 key (a NaN's): where a search for the least key starts."""
POS_INF_KEY = np.int32(0x7F800000)
"""``order_key`` of +inf: its float32 bits (a positive float's key is its bit pattern)."""
NEG_INF_KEY = np.int32(-0x7F800001)
"""``order_key`` of -inf."""


def order_key_floats(keys: np.ndarray) -> np.ndarray:
    """The float32 values of int32 order keys (an array)."""
    return order_key(keys.astype(np.int32)).view(np.float32)


# ------------------------------------------------------------------------------------------ Chan's merge


def chan_merge(n_a: Any, mean_a: Any, m2_a: Any, n_b: Any, mean_b: Any, m2_b: Any) -> tuple[Any, Any, Any]:
    """Chan, Golub & LeVeque's pairwise update of (count, mean, M2): the moments of two parts merged. Both counts
    must be positive (a caller with an empty part keeps the other)."""
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n


def chan_merge_comoment(
    n_a: Any, mean_x_a: Any, mean_y_a: Any, c_a: Any, n_b: Any, mean_x_b: Any, mean_y_b: Any, c_b: Any
) -> Any:
    """The co-moment ``C = sum (x - mean_x)(y - mean_y)`` of two parts merged, the pairwise update ``chan_merge``
    makes of M2 (which is C of x with itself): ``C_a + C_b + dx dy n_a n_b / n``. Both counts must be positive."""
    n = n_a + n_b
    return c_a + c_b + (mean_x_b - mean_x_a) * (mean_y_b - mean_y_a) * n_a * n_b / n


def correlation(m2_x: float, m2_y: float, c_xy: float) -> float:
    """Pearson's r from the centred moments M2_x, M2_y and the co-moment C_xy, clipped to [-1, 1] as
    ``torch.corrcoef`` clips; NaN where either side has no spread (torch's 0/0) or a moment is NaN."""
    scale = math.sqrt(m2_x) * math.sqrt(m2_y) if m2_x >= 0 and m2_y >= 0 else math.nan
    if not scale > 0:
        return math.nan
    return min(max(c_xy / scale, -1.0), 1.0) if c_xy == c_xy else math.nan


def chan_merge_share(n_a: Any, mean_a: Any, m2_a: Any, n_b: Any, mean_b: Any, m2_b: Any) -> tuple[Any, Any, Any]:
    """``chan_merge`` with the second part's share ``n_b / n`` taken first: the sweep's cells (``rcdiag.sweep.cells``
    and its kernel) merge this way. The same update, rounded differently in the last bit: the sweep's saved states
    and reports were made with it, the accumulators' with ``chan_merge``, so each keeps its own."""
    n = n_a + n_b
    delta = mean_b - mean_a
    share = n_b / n
    return n, mean_a + delta * share, m2_a + m2_b + delta * delta * n_a * share
