"""``analyze --explain``'s per-token work in one fused pass over a block (rcdiag/explain/).

``explain_block`` takes the block's raw rows; a row with padding has its valid tokens copied into a row buffer
(in L1) first. Per row, a few simple loops, each of which LLVM vectorizes (their fusion it does not):

* ``_row_scale``: the scale co-moments and shift counts of the detectors, and each token's rollout-probability
  bucket (compared with log-space thresholds, written out);
* ``_row_terms``: each token's k3 and chi2 terms (written out) and the capped IS ratio's sum;
* ``_run_sums``, once per run of positions that share a position bucket (0-31, 32-63, 64-127, ...; the mask
  places each valid token at its position): the run's token count, log-ratio, |log-ratio|, k3 and chi2 sums, for
  the position and length breakdowns;
* ``_four_buckets``, twice: the same sums per probability bucket, four buckets at a time, by a select per bucket
  (a scatter into the buckets does not vectorize: twice the time, measured).

Sums are per run and per row, in token order within a vector lane, so they depend on a row's valid tokens alone:
padding, chunking and row order change nothing beyond float64 rounding of the additions across rows.

The float64 ``expm1`` here is a polynomial (``_expm1``) that LLVM vectorizes: numba's ``math.expm1`` calls libm
one value at a time (5 ns a token). It is within two ulps of numpy's ``np.expm1``.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.explain_encoding import GOLDEN, GROUP_SHIFT, SERIES_TERMS, SMALL

LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e00
_EXPM1_HI = 90.0
"""Log-ratios above this give k3 = inf anyway (float32 exp overflows at 88.7): the polynomial stops here."""
_EXPM1_LO = -40.0
"""``expm1`` of anything below rounds to -1 in float64."""
EM1_POS_BOUND = math.expm1(20.0)
EM1_NEG_BOUND = math.expm1(-20.0)
LOG_F32_MAX = math.log(float(np.finfo(np.float32).max))


@intrinsic
def _bits_to_float64(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float64 whose bit pattern is the int64 ``bits`` (a register move, so the loop still vectorizes)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


_SERIES = tuple(1.0 / math.factorial(k) for k in range(SERIES_TERMS))
"""1/k!: the Taylor coefficients of ``expm1`` to degree 14 (truncation below 1e-17 of the value for
|r| <= ln2/2)."""


@njit(**{**JIT, "fastmath": {"contract"}})
def _expm1_series(r: float) -> float:
    """``expm1(r)`` for |r| <= ln2/2: r + r^2 (1/2 + r (1/6 + ...)), Horner's scheme (correctly rounded but for
    an ulp now and then). Not ``inline="always"``: numba would inline it under the caller's fast-math flags, and
    reassociating Horner's scheme changes the last bits (LLVM inlines it with its own flags)."""
    p = r * _SERIES[14]
    p = r * (p + _SERIES[13])
    p = r * (p + _SERIES[12])
    p = r * (p + _SERIES[11])
    p = r * (p + _SERIES[10])
    p = r * (p + _SERIES[9])
    p = r * (p + _SERIES[8])
    p = r * (p + _SERIES[7])
    p = r * (p + _SERIES[6])
    p = r * (p + _SERIES[5])
    p = r * (p + _SERIES[4])
    p = r * (p + _SERIES[3])
    p = r * (p + _SERIES[2])
    return r + r * p


@njit(**{**JIT, "fastmath": {"contract"}})
def _expm1(x: float) -> float:
    """``exp(x) - 1`` in float64 without the cancellation near 0: x = k ln2 + r with |r| <= ln2/2,
    ``_expm1_series(r)``, then ``2^k expm1(r) + (2^k - 1)``. NaN stays NaN; below -40 it is -1, above 90 it is
    ``expm1(90)`` (the callers never need more). No reassociation here: it would fold the two halves of ln 2 back
    into one and lose the reduction's precision."""
    xc = x if x > _EXPM1_LO else _EXPM1_LO
    xc = xc if xc < _EXPM1_HI else _EXPM1_HI
    k = np.rint(xc * INV_LN2)
    r = (xc - k * LN2_HI) - k * LN2_LO
    em1_r = _expm1_series(r)
    scale = _bits_to_float64((np.int64(k) + 1023) << 52)
    out = scale * em1_r + (scale - 1.0)
    return x if x != x else out


_GOLDEN = np.uint64(GOLDEN)


@njit(**JIT)
def _four_buckets(
    bucket: np.ndarray,
    old: np.ndarray,
    rollout: np.ndarray,
    k3: np.ndarray,
    chi2: np.ndarray,
    first: int,
    out: np.ndarray,
) -> None:
    """Add one row's tokens in probability buckets ``first`` to ``first + 3`` to ``out`` (tokens, log-ratio,
    |log-ratio|, k3, chi2 per bucket): a select per bucket and sum, which vectorizes (a scatter does not)."""
    n0 = n1 = n2 = n3 = 0  # integer counts: the float adds are the bottleneck
    d0 = d1 = d2 = d3 = a0 = a1 = a2 = a3 = 0.0
    k0 = k1 = k2 = k3_ = c0 = c1 = c2 = c3 = 0.0
    for j in range(bucket.shape[0]):
        b = bucket[j] - first
        d = np.float64(old[j] - rollout[j])
        a = abs(d)
        k = k3[j]
        c = chi2[j]
        n0 += np.int64(b == 0)
        n1 += np.int64(b == 1)
        n2 += np.int64(b == 2)
        n3 += np.int64(b == 3)
        d0 += d if b == 0 else 0.0
        d1 += d if b == 1 else 0.0
        d2 += d if b == 2 else 0.0
        d3 += d if b == 3 else 0.0
        a0 += a if b == 0 else 0.0
        a1 += a if b == 1 else 0.0
        a2 += a if b == 2 else 0.0
        a3 += a if b == 3 else 0.0
        k0 += k if b == 0 else 0.0
        k1 += k if b == 1 else 0.0
        k2 += k if b == 2 else 0.0
        k3_ += k if b == 3 else 0.0
        c0 += c if b == 0 else 0.0
        c1 += c if b == 1 else 0.0
        c2 += c if b == 2 else 0.0
        c3 += c if b == 3 else 0.0
    sums = (
        (float(n0), d0, a0, k0, c0),
        (float(n1), d1, a1, k1, c1),
        (float(n2), d2, a2, k2, c2),
        (float(n3), d3, a3, k3_, c3),
    )
    for q, values in enumerate(sums):
        for v in range(5):
            out[first + q, v] += values[v]


@njit(**JIT)
def _row_terms(
    old: np.ndarray, rollout: np.ndarray, k3_out: np.ndarray, chi2_out: np.ndarray, cap: np.float32, small: bool
) -> float:
    """A row's k3 and chi2 terms, written out, and the sum of its capped IS ratio. k3 = e^d - 1 - d unclamped (inf
    where verl's float32 e^d overflows), chi2 = (e^d - 1)(e^d + 1) and the ratio e^d at d clamped to [-20, 20].
    ``small``: every |d| is below ``SMALL``, so ``_expm1`` is its series (LLVM takes the test out of the loop)."""
    capped = 0.0
    for j in range(old.shape[0]):
        d = np.float64(old[j] - rollout[j])
        em1 = _expm1_series(d) if small else _expm1(d)
        em1c = EM1_POS_BOUND if d > 20.0 else (EM1_NEG_BOUND if d < -20.0 else em1)
        ratio = np.float32(em1c + 1.0)
        capped += np.float64(cap if ratio > cap else ratio)
        k3_out[j] = math.inf if d > LOG_F32_MAX else em1 - d
        chi2_out[j] = em1c * (em1c + 2.0)
    return capped


@njit(**JIT)
def _run_sums(old: np.ndarray, rollout: np.ndarray, k3: np.ndarray, chi2: np.ndarray):
    """Sums of the log-ratio d, |d| and the k3 and chi2 terms over a run of a row's valid tokens."""
    s_lr = s_abs = s_k3 = s_chi2 = 0.0
    for j in range(old.shape[0]):
        d = np.float64(old[j] - rollout[j])
        s_lr += d
        s_abs += abs(d)
        s_k3 += k3[j]
        s_chi2 += chi2[j]
    return s_lr, s_abs, s_k3, s_chi2


@njit(**JIT)
def _row_scale(old: np.ndarray, rollout: np.ndarray, bucket: np.ndarray, thresholds: np.ndarray, tol: np.float32):
    """A row's scale co-moments over tokens with finite log-probs (n, x, y, xx, yy, xy; products in float32 as
    numpy takes them), its shift counts (d < -tol, d > tol), whether every |d| is below ``SMALL``, and each
    token's probability bucket (written out)."""
    t0, t1, t2, t3, t4, t5, t6 = (thresholds[0], thresholds[1], thresholds[2], thresholds[3], thresholds[4],
                                  thresholds[5], thresholds[6])  # fmt: skip
    n = up = down = big = 0
    small = np.float32(SMALL)
    sx = sy = sxx = syy = sxy = 0.0
    for j in range(old.shape[0]):
        x = old[j]
        y = rollout[j]
        d32 = x - y
        bucket[j] = (
            np.int64(y >= t0) + np.int64(y >= t1) + np.int64(y >= t2) + np.int64(y >= t3)
            + np.int64(y >= t4) + np.int64(y >= t5) + np.int64(y >= t6)
        )  # fmt: skip
        big += np.int64(not (abs(d32) < small))  # NaN included
        up += np.int64(d32 < -tol)
        down += np.int64(d32 > tol)
        finite = (abs(x) < math.inf) & (abs(y) < math.inf)
        xf = x if finite else np.float32(0.0)
        yf = y if finite else np.float32(0.0)
        n += np.int64(finite)
        sx += np.float64(xf)
        sy += np.float64(yf)
        sxx += np.float64(xf * xf)
        syy += np.float64(yf * yf)
        sxy += np.float64(xf * yf)
    return float(n), sx, sy, sxx, syy, sxy, float(up), float(down), big == 0


@njit(**JIT)
def _compact(values: np.ndarray, mask: np.ndarray, out: np.ndarray) -> None:
    """The values at mask 1, in order, into ``out`` (a branch-free store: every value is written, the position
    moves on only past a valid one)."""
    k = 0
    for j in range(values.shape[0]):
        out[k] = values[j]
        k += np.int64(mask[j] != 0)


@njit(**JIT)
def explain_block(
    old: np.ndarray,
    rollout: np.ndarray,
    valid_len: np.ndarray,
    list_len: np.ndarray,
    mask: np.ndarray,
    edges: np.ndarray,
    thresholds: np.ndarray,
    ratio_cap: float,
    shift_tol: float,
    prob: np.ndarray,
    position: np.ndarray,
    length: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
) -> None:
    """Fold one block into the explain sums (added in place).

    ``old``/``rollout``: the block's raw tokens (float32, row after row, padding included); ``valid_len`` /
    ``list_len``: each row's valid tokens and list length (int64); ``mask``: the rows' mask over their list
    positions as uint8, or empty when every position is valid (then ``valid_len`` is ``list_len``). A row with
    masked positions has its valid tokens copied out first (into a row buffer, in L1), so every sum sees a row's
    valid tokens in the same order and lanes whatever its padding. ``edges``: the position buckets' lower edges;
    ``thresholds``: the seven float32 log-prob thresholds of the probability buckets. Each row's group is a hash
    of its valid length and the bits of its first valid trainer log-prob (``rcdiag.explain.statistics``). Sums:
    ``prob`` (buckets, 5), ``position`` (groups, buckets, 5), ``length`` (buckets, 5) with columns tokens,
    log-ratio, |log-ratio|, k3, chi2; ``scale`` (groups, 6): n, x, y, xx, yy, xy over tokens with finite
    log-probs; ``offset`` (groups, 4): n, capped IS ratio, up, down.
    """
    n_rows = valid_len.shape[0]
    n_edges = edges.shape[0]
    has_mask = mask.shape[0] > 0
    cap = np.float32(ratio_cap)
    tol = np.float32(shift_tol)
    longest = 0
    longest_list = 0
    for row in range(n_rows):
        longest = max(longest, valid_len[row])
        if valid_len[row] < list_len[row]:
            longest_list = max(longest_list, list_len[row])
    row_bucket = np.empty(longest, np.int64)
    row_k3 = np.empty(longest)
    row_chi2 = np.empty(longest)
    row_old = np.empty(longest_list, np.float32)
    row_rollout = np.empty(longest_list, np.float32)
    m = 0  # first list position of the row, in the block
    for row in range(n_rows):
        n_valid = valid_len[row]
        n_list = list_len[row]
        if n_valid == n_list:
            row_x = old[m : m + n_list]
            row_y = rollout[m : m + n_list]
        else:
            _compact(old[m : m + n_list], mask[m : m + n_list], row_old)
            _compact(rollout[m : m + n_list], mask[m : m + n_list], row_rollout)
            row_x = row_old[:n_valid]
            row_y = row_rollout[:n_valid]
        key = np.uint64(n_valid) << np.uint64(32)
        if n_valid > 0:
            key ^= np.uint64(row_x[:1].view(np.uint32)[0])
        g = np.int64((key * _GOLDEN) >> np.uint64(GROUP_SHIFT))
        if n_valid == 0:
            m += n_list
            continue
        r_n, r_x, r_y, r_xx, r_yy, r_xy, r_up, r_down, small = _row_scale(
            row_x, row_y, row_bucket[:n_valid], thresholds, tol
        )
        size = 0
        while size < n_edges and edges[size] < n_list:
            size += 1  # size: the row's runs
        row_lr = row_abs = row_k3_sum = row_chi2_sum = 0.0
        r_capped = _row_terms(row_x, row_y, row_k3[:n_valid], row_chi2[:n_valid], cap, small)
        at = 0  # the run's first token, in the row
        for k in range(size):
            lo = edges[k]
            hi = edges[k + 1] if k + 1 < n_edges and edges[k + 1] < n_list else n_list
            if has_mask:
                flags = mask[m + lo : m + hi]
                count = 0
                for j in range(flags.shape[0]):
                    count += flags[j]
            else:
                count = hi - lo
            if count == 0:
                continue
            xs = row_x[at : at + count]
            ys = row_y[at : at + count]
            sk3 = row_k3[at : at + count]
            sc2 = row_chi2[at : at + count]
            s_lr, s_abs, s_k3, s_chi2 = _run_sums(xs, ys, sk3, sc2)
            cell = position[g, k]
            cell[0] += count
            cell[1] += s_lr
            cell[2] += s_abs
            cell[3] += s_k3
            cell[4] += s_chi2
            row_lr += s_lr
            row_abs += s_abs
            row_k3_sum += s_k3
            row_chi2_sum += s_chi2
            at += count
        xs = row_x
        ys = row_y
        _four_buckets(row_bucket[:n_valid], xs, ys, row_k3[:n_valid], row_chi2[:n_valid], 0, prob)
        _four_buckets(row_bucket[:n_valid], xs, ys, row_k3[:n_valid], row_chi2[:n_valid], 4, prob)
        m += n_list
        bucket = 0
        while bucket + 1 < n_edges and edges[bucket + 1] <= n_valid:
            bucket += 1
        length[bucket, 0] += n_valid
        length[bucket, 1] += row_lr
        length[bucket, 2] += row_abs
        length[bucket, 3] += row_k3_sum
        length[bucket, 4] += row_chi2_sum
        scale[g, 0] += r_n
        scale[g, 1] += r_x
        scale[g, 2] += r_y
        scale[g, 3] += r_xx
        scale[g, 4] += r_yy
        scale[g, 5] += r_xy
        offset[g, 0] += n_valid
        offset[g, 1] += r_capped
        offset[g, 2] += r_up
        offset[g, 3] += r_down
