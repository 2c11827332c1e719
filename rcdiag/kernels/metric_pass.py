"""The CPU engine's per-token pass: everything verl's off-policy metrics, rcdiag's extras and the log-ratio
histogram need from a block's tokens, in one vectorized pass over the raw (padded) block plus one histogram pass.

Per token, with d = float32(old - rollout) over valid tokens (mask 1):

* per-row float64 sums of ``old`` and ``rollout`` (and the valid count);
* d itself, compacted to the valid tokens, and the number of NaN d (both log-probs ``-inf``);
* float64 sums of |d|, of e^|d|, of k3 = e^d - 1 - d (unclamped) and of chi2 terms e^(2 clamp(d)) - 1;
* the number of |d| above verl's safety bound, and the log-ratio histogram's bin counts;
* per row, the valid tokens whose two float32 values differ in any bit, their greatest distance in ulps and the
  list position of the first (``_row_differences``: the exact-match section, ``rcdiag.sections.exact``).

For |d| < ``K3_SERIES_MAX`` (nearly every token of a real dump) k3 is its Taylor series to d^13/13!, whose truncation
error is below 1e-19 of k3 there: more accurate than ``expm1(d) - d``, and a polynomial LLVM vectorizes, where a
call to ``expm1`` per token costs 5 ns. e^d - 1 is then d + k3 and e^|d| is 1 + (e^d - 1) or its reciprocal.
Other tokens (large, infinite or NaN d; a handful in a healthy dump) take a second, scalar pass over their rows
with ``math.expm1`` and verl's float32 overflow and clamp rules.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from rcdiag.core.formulas import K3_SERIES_MAX, KEY_HIGHEST, KEY_LOWEST, SAFETY_BOUND_F32
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.scalar import (
    chan_merge,
    chi2_term,
    clamp,
    clip,
    exp_overflows,
    k1,
    k3_verl,
    order_key,
    rs_keep,
    ulp_distance,
)
from rcdiag.kernels.series import k3_series_parts

N_SUMS = 4
"""Block sums in ``sums``: |d|, e^|d|, k3, chi2 terms."""
N_COUNTS = 4
"""Block counts in ``counts``: NaN d, |d| beyond the safety bound, tokens left to the scalar pass, valid tokens."""
N_DIFFERENCES = 3
"""Per-row columns of ``row_diff``: valid tokens whose bits differ, their greatest ulp distance, the list position of
the first (-1: none)."""


@njit(**JIT)
def _row(old, rollout, mask, lr, old_valid, rollout_valid):
    """One row, its valid d written compacted to ``lr`` (as long as the row): (sum old, sum
    rollout, |d|, e^|d|, k3, chi2, valid, NaN, left for the scalar pass, least and greatest d's keys).

    Simple loops over the row (in L1 cache by then) rather than one: LLVM vectorizes each, and not their fusion
    (measured 1.5 against 4.5 ns a token). Every step is a select, never a branch (a branch on the sign of d cost
    6 ns a token in mispredictions, one on the mask 3).
    """
    so, sr, valid = _row_compact(old, rollout, mask, lr, old_valid, rollout_valid)
    d = lr[:valid]
    s_abs, nan, big, lo, hi = _row_counts(d)
    s_k3, s_chi2, s_exp = _row_series(d)
    return so, sr, s_abs, s_exp, s_k3, s_chi2, valid, nan, big, lo, hi


@njit(**JIT)
def _row_compact(old, rollout, mask, lr, old_valid, rollout_valid):
    """The row's valid d compacted into ``lr`` and the sums of its valid old and rollout log-probs; returns
    (sum old, sum rollout, valid tokens). A row without padding takes plain vectorized loops; one with padding
    is compacted without a branch (every value is written, the next one overwrites a masked one: a branch on the
    mask cost 3 ns a token) into ``old_valid``/``rollout_valid`` first, so the sums add the same numbers in the
    same order wherever the padding was (bit for bit)."""
    valid = 0
    for i in range(mask.shape[0]):
        valid += np.int64(mask[i])
    if valid == mask.shape[0]:
        for i in range(old.shape[0]):
            lr[i] = old[i] - rollout[i]
        so, sr = _sums(old, rollout)
        return so, sr, valid
    j = 0
    for i in range(old.shape[0]):
        o = old[i]
        q = rollout[i]
        lr[j] = o - q
        old_valid[j] = o
        rollout_valid[j] = q
        j += np.int64(mask[i])
    so, sr = _sums(old_valid[:j], rollout_valid[:j])
    return so, sr, j


@njit(**JIT)
def _sums(old, rollout):
    """float64 sums of two float32 arrays."""
    so = 0.0
    sr = 0.0
    for i in range(old.shape[0]):
        so += np.float64(old[i])
        sr += np.float64(rollout[i])
    return so, sr


@njit(**JIT)
def _row_counts(d32):
    """Sum of |d|, the counts of NaN d and of tokens left to the scalar pass, and the least and greatest d as
    order-preserving int32 keys (``rcdiag.core.formulas.order_key``): integer min/max vectorize, float ones stayed
    scalar (0.04 against 0.4 ns a token). A NaN d has a key beyond +-inf; the caller reports such a row's extremes
    as NaN."""
    s_abs = 0.0
    nan = 0
    big = 0
    bits = d32.view(np.int32)
    lo = KEY_HIGHEST
    hi = KEY_LOWEST
    for i in range(d32.shape[0]):
        x = d32[i]
        a = abs(np.float64(x))
        s_abs += a
        nan += np.int64(x != x)
        big += np.int64(not (a < K3_SERIES_MAX))  # NaN included
        k = order_key(bits[i])
        lo = k if k < lo else lo
        hi = k if k > hi else hi
    return s_abs, nan, big, lo, hi


@njit(**JIT)
def _row_series(d32):
    """Sums of k3, chi2 terms and e^|d| by the Taylor series over tokens with |d| < K3_SERIES_MAX; every other token
    adds 0, 0 and exactly 1."""
    s_k3 = 0.0
    s_chi2 = 0.0
    s_exp = 0.0
    for i in range(d32.shape[0]):
        d = np.float64(d32[i])
        a = abs(d)
        take = a < K3_SERIES_MAX
        ds = d if take else 0.0
        even, odd = k3_series_parts(ds)
        k = even + odd
        rm1 = ds + k
        s_k3 += k
        s_chi2 += chi2_term(rm1)
        s_exp += 1.0 + abs(ds) + even + abs(odd)  # e^|d|, by the same series at |d|
    return s_k3, s_chi2, s_exp


@njit(**JIT)
def _row_differences(old_bits, rollout_bits, mask):
    """One row's valid tokens whose two float32 values differ in any bit (given as int32 bit patterns): (how many,
    the greatest distance in ulps, ``rcdiag.core.formulas.ulp_distance``, the list position of the first or -1).
    The count and the greatest distance in one branch-free loop LLVM vectorizes (the row is in L1 cache after
    ``_row``); the first position by a scan that stops there, only in a row with one (a select of the least index
    in the same loop cost 0.17 ns a token more)."""
    n = old_bits.shape[0]
    count = 0
    greatest = 0
    for i in range(n):
        a = old_bits[i]
        b = rollout_bits[i]
        valid = np.int64(mask[i])
        count += np.int64(a != b) * valid
        greatest = max(ulp_distance(np.int64(a), np.int64(b)) * valid, greatest)
    first = -1
    if count:
        for i in range(n):
            if mask[i] and old_bits[i] != rollout_bits[i]:
                first = i
                break
    return count, greatest, first


@njit(**JIT)
def differences_pass(old, rollout, mask, lengths, row_diff):
    """``_row_differences`` of every row of a raw block into ``row_diff`` ([rows, N_DIFFERENCES]), for a block whose
    token pass is not this module's (the torch path reads the host's copy of its tokens)."""
    old_bits = old.view(np.int32)
    rollout_bits = rollout.view(np.int32)
    t = 0
    for r in range(lengths.shape[0]):
        n = lengths[r]
        count, greatest, first = _row_differences(old_bits[t : t + n], rollout_bits[t : t + n], mask[t : t + n])
        row_diff[r, 0] = count
        row_diff[r, 1] = greatest
        row_diff[r, 2] = first
        t += n


@njit(**JIT)
def _row_large(d32):
    """The tokens ``_row`` left out (|d| >= K3_SERIES_MAX, inf or NaN): (e^|d|, k3, chi2, beyond the bound), scalar."""
    s_exp = 0.0
    s_k3 = 0.0
    s_chi2 = 0.0
    clamped = 0
    for i in range(d32.shape[0]):
        d = np.float64(d32[i])
        a = abs(d)
        if a < K3_SERIES_MAX:
            continue
        # verl's float32 exp overflows to inf above log(float32 max); -inf gives e^d - 1 - d = +inf
        s_k3 += k3_verl(math.expm1(d), d)
        s_exp += math.inf if exp_overflows(a) else math.exp(a)
        rm1 = math.expm1(clamp(d, SAFETY_BOUND))  # NaN stays NaN, as under verl's clamp
        s_chi2 += chi2_term(rm1)
        clamped += 1 if a > SAFETY_BOUND else 0
    return s_exp, s_k3, s_chi2, clamped


@njit(**JIT)
def _histogram(d32, base, edge, hist):
    """Log-ratio bin counts: ``base[cell] + (d >= edge[cell])`` by the top 16 bits of each float32 d (the
    table of ``rcdiag.metrics.backend``), in four interleaved copies so repeated bins do not wait on each other."""
    bits = d32.view(np.uint32)
    for i in range(d32.shape[0]):
        x = d32[i]
        if x != x:
            continue
        c = bits[i] >> 16
        hist[i & 3, np.int64(base[c]) + (1 if x >= edge[c] else 0)] += 1


@njit(**JIT)
def valid_lengths(mask, lengths, out):
    """Valid tokens of each row (``lengths`` raw tokens each) into ``out``: a vectorized count per row, where
    numpy's ``add.reduceat`` with an int64 accumulator cost 0.4 ns a token."""
    t = 0
    for r in range(lengths.shape[0]):
        n = lengths[r]
        m = mask[t : t + n]
        valid = 0
        for i in range(n):
            valid += np.int64(m[i])
        out[r] = valid
        t += n


@njit(**JIT)
def _k1_band_row(d32, lo, hi, nan):
    """What a token-level k1 band [lo, hi] does to one row, k1 = -clamp(d, ±20): (rejected, above hi, below lo,
    mean and M2 of k1 clipped to the band). A token is kept when ``lo <= k1 <= hi``; NaN (``nan`` of them in the
    row) is rejected, counted neither above nor below, and makes the moments NaN. Within (-20, 20) the bounds make
    the clamp irrelevant, so k1 > hi is d < -hi, k1 < lo is d > -lo and clip(k1) is -clip(d, -hi, -lo): three
    reductions LLVM vectorizes (exact float32 comparisons, the same numbers)."""
    if not (-SAFETY_BOUND_F32 < lo <= hi < SAFETY_BOUND_F32):
        return _k1_band_row_clamped(d32, lo, hi)
    neg_hi = -hi
    neg_lo = -lo
    above = 0
    below = 0
    s = 0.0
    for i in range(d32.shape[0]):
        d = d32[i]
        above += np.int64(d < neg_hi)
        below += np.int64(d > neg_lo)
        s += np.float64(clip(d, neg_hi, neg_lo))
    n = d32.shape[0]
    mean = s / n if n else 0.0
    m2 = 0.0
    for i in range(d32.shape[0]):
        d = d32[i]
        c = np.float64(clip(d, neg_hi, neg_lo)) - mean
        m2 += c * c
    return above + below + nan, above, below, -mean, m2


@njit(**JIT)
def _k1_band_row_clamped(d32, lo, hi):
    """``_k1_band_row`` for bounds at or beyond the clamp (or an inverted band, which keeps nothing): k1 itself,
    clipped as torch clamps, ``min(max(x, lo), hi)`` (``hi`` everywhere for an inverted band)."""
    rejected = 0
    above = 0
    below = 0
    s = 0.0
    floor = min(lo, hi)
    for i in range(d32.shape[0]):
        x = k1(clamp(d32[i], SAFETY_BOUND_F32))
        rejected += np.int64(not rs_keep(x, lo, hi, True))
        above += np.int64(x > hi)
        below += np.int64(x < lo)
        s += np.float64(clip(x, floor, hi))
    n = d32.shape[0]
    mean = s / n if n else 0.0
    m2 = 0.0
    for i in range(d32.shape[0]):
        x = k1(clamp(d32[i], SAFETY_BOUND_F32))
        c = np.float64(clip(x, floor, hi)) - mean
        m2 += c * c
    return rejected, above, below, mean, m2


@njit(**JIT)
def _k1_bands(d32, r, nan, band_lo, band_hi, band_rows, band_out):
    """Fold one row into every k1 band: its rejected count into ``band_rows[b, r]``; counts and the clipped
    moments into ``band_out[b]`` = (above, below, n, mean, M2), rows merged by Chan et al.'s update."""
    n = d32.shape[0]
    for b in range(band_lo.shape[0]):
        rejected, above, below, mean, m2 = _k1_band_row(d32, band_lo[b], band_hi[b], nan)
        band_rows[b, r] = rejected
        band_out[b, 0] += above
        band_out[b, 1] += below
        if n:
            # the row's share of M2 merged first, then added to the band's (0.0 + m2 is m2: the same sum)
            total, merged_mean, m2_row = chan_merge(band_out[b, 2], band_out[b, 3], 0.0, n, mean, m2)
            band_out[b, 2] = total
            band_out[b, 3] = merged_mean
            band_out[b, 4] += m2_row


@njit(**JIT)
def k1_band_pass(lr, lengths, lo, hi, band_rows, band_out):
    """One token-level k1 band over the compacted log-ratios of a block whose token pass was not asked for it:
    the same per-row kernel, so ``band_rows`` ([1, rows]) and ``band_out`` ([1, 5], zeros on entry) hold what
    the token pass would have given."""
    band_lo = np.full(1, lo, dtype=np.float32)
    band_hi = np.full(1, hi, dtype=np.float32)
    t = 0
    for r in range(lengths.shape[0]):
        d32 = lr[t : t + lengths[r]]
        nan = 0
        for i in range(d32.shape[0]):
            nan += np.int64(d32[i] != d32[i])
        _k1_bands(d32, r, nan, band_lo, band_hi, band_rows, band_out)
        t += lengths[r]


@njit(**JIT)
def token_pass(
    old,
    rollout,
    mask,
    lengths,
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
):
    """For the raw block ``old``/``rollout`` (``mask`` true for valid tokens; rows of ``lengths`` raw tokens),
    fill ``lr`` (the valid tokens' d, compacted; as long as the raw block), ``row_sums`` ([rows, 2]: sums of old
    and rollout), ``row_keys`` ([rows, 2] int32: keys of the least and greatest d), ``row_counts`` ([rows, 2]:
    valid tokens, NaN d), ``sums`` (``N_SUMS``), ``counts`` (``N_COUNTS``) and ``hist`` ([4, bins], added to);
    and for each token-level k1 RS band [``band_lo[b]``, ``band_hi[b]``] (float32 bounds), ``band_rows[b]``
    (rejected tokens per row) and ``band_out[b]`` (above, below, n, mean, M2 of k1 clipped to the band; zeros
    on entry); and ``row_diff`` ([rows, N_DIFFERENCES]: ``_row_differences``), while each row is in cache."""
    s_abs = 0.0
    s_exp = 0.0
    s_k3 = 0.0
    s_chi2 = 0.0
    valid = 0
    nan = 0
    clamped = 0
    left = 0
    t = 0
    longest = 0
    for r in range(lengths.shape[0]):
        longest = max(longest, lengths[r])
    old_valid = np.empty(longest, dtype=np.float32)
    rollout_valid = np.empty(longest, dtype=np.float32)
    old_bits = old.view(np.int32)
    rollout_bits = rollout.view(np.int32)
    for r in range(lengths.shape[0]):
        n = lengths[r]
        so, sr, a, e, k, c, rv, rnan, rbig, lo, hi = _row(
            old[t : t + n], rollout[t : t + n], mask[t : t + n], lr[valid : valid + n], old_valid, rollout_valid
        )
        count, greatest, first = _row_differences(old_bits[t : t + n], rollout_bits[t : t + n], mask[t : t + n])
        row_diff[r, 0] = count
        row_diff[r, 1] = greatest
        row_diff[r, 2] = first
        row_sums[r, 0] = so
        row_sums[r, 1] = sr
        row_keys[r, 0] = lo
        row_keys[r, 1] = hi
        row_counts[r, 0] = rv
        row_counts[r, 1] = rnan
        s_abs += a
        s_exp += e
        s_k3 += k
        s_chi2 += c
        nan += rnan
        if rbig:
            left += rbig
            e, k, c, rclamped = _row_large(lr[valid : valid + rv])
            s_exp += e
            s_k3 += k
            s_chi2 += c
            clamped += rclamped
        if band_lo.shape[0]:
            _k1_bands(lr[valid : valid + rv], r, rnan, band_lo, band_hi, band_rows, band_out)
        valid += rv
        t += n
    _histogram(lr[:valid], base, edge, hist)
    # every token left to the scalar pass added exactly 1 to the e^|d| sum
    sums[0] = s_abs
    sums[1] = s_exp - left
    sums[2] = s_k3
    sums[3] = s_chi2
    counts[0] = nan
    counts[1] = clamped
    counts[2] = left
    counts[3] = valid
