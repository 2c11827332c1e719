"""``analyze --explain``'s per-token work in one fused pass over a block (rcdiag/explain/), and the bias detectors'
part of it, which every analyze runs (``prob`` and ``length`` empty: no breakdown, no ids).

``explain_block`` takes the block's raw rows; a row with padding has its valid tokens copied into a row buffer
(in L1) first. Per row, a few simple loops, each of which LLVM vectorizes (their fusion it does not):

* ``_row_scale``: the scale co-moments, shift counts and shape sums (log-ratio over the tokens the trainer found
  unlikely and likely) of the detectors;
* ``_row_terms``: each token's k3 and chi2 terms (written out) and the capped IS ratio's sum;
* ``_run_sums``, once per run of positions that share a position bucket (0-31, 32-63, 64-127, ...; the mask
  places each valid token at its position): the run's token count, log-ratio, |log-ratio|, k3 and chi2 sums, for
  the position and length breakdowns;
* with the breakdowns, ``_row_buckets``: each token's rollout-probability bucket (compared with log-space
  thresholds, written out; in a loop of its own, so that the detectors' sums are the same code with and without
  the breakdowns), then ``_four_buckets``, twice: the same sums per probability bucket, four buckets at a time, by
  a select per bucket (a scatter into the buckets does not vectorize: twice the time, measured);
* with token ids, ``add_token_terms`` (``rcdiag.kernels.token_rows``), last: the row's tokens added to their ids'
  rows of the by-token table, from the terms already taken (a separate pass over the block, reading it again and
  taking the terms again, cost about a third more: docs/performance.md). The row's ids are compacted first and, over
  a table larger than L2, their table rows prefetched (``prefetch_token_rows``), so the cache misses into it are in
  flight before the loops above run: a fifth to two fifths less time for the ids (docs/performance.md).

Sums are per run and per row, in token order within a vector lane, so they depend on a row's valid tokens alone:
padding, chunking and row order change nothing beyond float64 rounding of the additions across rows.

The float64 ``expm1`` here is a polynomial LLVM vectorizes (``expm1_reduced`` of ``rcdiag.kernels.series``, which
says why it is not the token pass's series).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.explain_encoding import GOLDEN, GROUP_SHIFT, SMALL
from rcdiag.kernels.scalar import chi2_term, clamped_expm1, k3_verl, truncate
from rcdiag.kernels.series import expm1_reduced, expm1_series
from rcdiag.kernels.token_rows import add_token_terms, prefetch_token_rows

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
    ``small``: every |d| is below ``SMALL``, so ``expm1_reduced`` is its series (LLVM takes the test out of the
    loop)."""
    capped = 0.0
    for j in range(old.shape[0]):
        d = np.float64(old[j] - rollout[j])
        em1 = expm1_series(d) if small else expm1_reduced(d)
        em1c = clamped_expm1(em1, d)
        ratio = np.float32(em1c + 1.0)
        capped += np.float64(truncate(ratio, cap))
        k3_out[j] = k3_verl(em1, d)
        chi2_out[j] = chi2_term(em1c)
    return capped


@njit(**JIT)
def _run_sums(
    old: np.ndarray, rollout: np.ndarray, k3: np.ndarray, chi2: np.ndarray
) -> tuple[float, float, float, float]:
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
def _row_buckets(rollout: np.ndarray, bucket: np.ndarray, thresholds: np.ndarray) -> None:
    """Each token's probability bucket (written out): how many of the seven float32 log-prob thresholds its rollout
    log-prob reaches (NaN: none)."""
    t0, t1, t2, t3, t4, t5, t6 = (thresholds[0], thresholds[1], thresholds[2], thresholds[3], thresholds[4],
                                  thresholds[5], thresholds[6])  # fmt: skip
    for j in range(rollout.shape[0]):
        y = rollout[j]
        bucket[j] = (
            np.int64(y >= t0) + np.int64(y >= t1) + np.int64(y >= t2) + np.int64(y >= t3)
            + np.int64(y >= t4) + np.int64(y >= t5) + np.int64(y >= t6)
        )  # fmt: skip


@njit(**JIT)
def _row_scale(
    old: np.ndarray, rollout: np.ndarray, tol: np.float32, unlikely: np.float32, likely: np.float32
) -> tuple[float, float, float, float, float, float, float, float, bool, tuple[float, ...]]:
    """A row's scale co-moments over tokens with finite log-probs (n, x, y, xx, yy, xy; products in float32 as
    numpy takes them), its shift counts (d < -tol, d > tol), whether every |d| is below ``SMALL``, and the shape
    sums: count and sum of d over finite tokens with old below ``unlikely`` and at or above ``likely``, and the
    likely ones shifted each way (d < -tol, d > tol)."""
    n = up = down = big = 0
    n_lo = n_hi = hi_up = hi_down = 0
    s_lo = s_hi = 0.0
    small = np.float32(SMALL)
    sx = sy = sxx = syy = sxy = 0.0
    for j in range(old.shape[0]):
        x = old[j]
        y = rollout[j]
        d32 = x - y
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
        lo = finite & (x < unlikely)
        hi = finite & (x >= likely)
        d = np.float64(d32)
        n_lo += np.int64(lo)
        s_lo += d if lo else 0.0
        n_hi += np.int64(hi)
        s_hi += d if hi else 0.0
        hi_up += np.int64(hi & (d32 < -tol))
        hi_down += np.int64(hi & (d32 > tol))
    shape = (float(n_lo), s_lo, float(n_hi), s_hi, float(hi_up), float(hi_down))
    return float(n), sx, sy, sxx, syy, sxy, float(up), float(down), big == 0, shape


@njit(**JIT)
def _add_cluster(out: np.ndarray, at: int, n: float, s: float) -> None:
    """One response's count ``n`` and sum ``s`` into the cluster sums at ``out[at:at + 5]`` (n, s, s^2, n s, n^2)."""
    out[at] += n
    out[at + 1] += s
    out[at + 2] += s * s
    out[at + 3] += n * s
    out[at + 4] += n * n


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
    unlikely: float,
    likely: float,
    shape: np.ndarray,
    tokens: np.ndarray,
    token_sums: np.ndarray,
) -> int:
    """Fold one block into the explain sums (added in place); returns how many valid tokens had an id beyond the
    by-token table (left for the caller).

    ``old``/``rollout``: the block's raw tokens (float32, row after row, padding included); ``valid_len`` /
    ``list_len``: each row's valid tokens and list length (int64); ``mask``: the rows' mask over their list
    positions as uint8, or empty when every position is valid (then ``valid_len`` is ``list_len``). A row with
    masked positions has its valid tokens copied out first (into a row buffer, in L1), so every sum sees a row's
    valid tokens in the same order and lanes whatever its padding. ``edges``: the position buckets' lower edges;
    ``thresholds``: the seven float32 log-prob thresholds of the probability buckets. Each row's group is a hash
    of its valid length and the bits of its first valid trainer log-prob (``rcdiag.explain.statistics``). Sums:
    ``prob`` (buckets, 5), ``position`` (groups, buckets, 5), ``length`` (buckets, 5) with columns tokens,
    log-ratio, |log-ratio|, k3, chi2; ``scale`` (groups, 6): n, x, y, xx, yy, xy over tokens with finite
    log-probs; ``offset`` (groups, 4): n, capped IS ratio, up, down. ``shape`` (``ShapeSums.SIZE``): per-response
    cluster sums of d over tokens with old below ``unlikely`` and at or above ``likely`` (float32 log-prob
    thresholds) and of the capped ratio minus 1, then the likely tokens shifted up and down. ``tokens``: the
    block's raw token ids (int32 or int64, like ``old``), or empty without ids; ``token_sums``: the by-token table
    (ids, ``N_TOKEN_SUMS``) their valid tokens are added to (``rcdiag.kernels.token_rows``). ``prob`` and ``length``
    empty (no rows): the detectors' sums alone (``position``, ``scale``, ``offset``, ``shape``; the default
    analyze's ``rcdiag.explain.detector_state``), taken by the same code as with them, so the same bits.
    """
    n_rows = valid_len.shape[0]
    n_edges = edges.shape[0]
    has_mask = mask.shape[0] > 0
    breakdowns = prob.shape[0] > 0
    cap = np.float32(ratio_cap)
    tol = np.float32(shift_tol)
    low = np.float32(unlikely)
    high = np.float32(likely)
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
    has_tokens = tokens.shape[0] > 0
    row_tokens = np.empty(longest_list if has_tokens else 0, tokens.dtype)
    skipped = 0
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
        if has_tokens:  # the row's ids first: their table rows are fetched while the row's sums are taken
            if n_valid == n_list:
                row_t = tokens[m : m + n_list]
            else:
                _compact(tokens[m : m + n_list], mask[m : m + n_list], row_tokens)
                row_t = row_tokens[:n_valid]
            prefetch_token_rows(row_t, token_sums)
        r_n, r_x, r_y, r_xx, r_yy, r_xy, r_up, r_down, small, r_shape = _row_scale(row_x, row_y, tol, low, high)
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
        if breakdowns:
            _row_buckets(row_y, row_bucket[:n_valid], thresholds)
            xs = row_x
            ys = row_y
            _four_buckets(row_bucket[:n_valid], xs, ys, row_k3[:n_valid], row_chi2[:n_valid], 0, prob)
            _four_buckets(row_bucket[:n_valid], xs, ys, row_k3[:n_valid], row_chi2[:n_valid], 4, prob)
            bucket = 0
            while bucket + 1 < n_edges and edges[bucket + 1] <= n_valid:
                bucket += 1
            length[bucket, 0] += n_valid
            length[bucket, 1] += row_lr
            length[bucket, 2] += row_abs
            length[bucket, 3] += row_k3_sum
            length[bucket, 4] += row_chi2_sum
        if has_tokens:  # last: the prefetched table rows have had the row's other loops' time to arrive
            skipped += add_token_terms(row_t, row_x, row_y, row_k3[:n_valid], row_chi2[:n_valid], token_sums)
        m += n_list
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
        _add_cluster(shape, 0, r_shape[0], r_shape[1])
        _add_cluster(shape, 5, r_shape[2], r_shape[3])
        _add_cluster(shape, 10, float(n_valid), r_capped - n_valid)
        shape[15] += r_shape[4]
        shape[16] += r_shape[5]
    return skipped
