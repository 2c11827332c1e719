"""The small-dump path's numpy forms of ``analyze --explain``'s passes, so a small dump's ``--explain`` never imports
numba (``rcdiag.kernels.small``): ``explain_block`` (``rcdiag.kernels.explain``, with the by-token additions of
``rcdiag.kernels.token_rows``) and ``scatter_token_sums`` (``rcdiag.kernels.token_ids``), same arguments, same sums
added in place, same return value.

Whole-block array operations over the block's valid tokens in place of the kernel's loop over rows, keeping the
kernel's grouping of the additions: a run of a row's tokens that share a position bucket is summed first and added
to its cell, a row's runs make its length sums, a row's tokens per probability bucket its probability sums, a row's
scale, offset and shape sums are added to its group and the clusters, in row order (``np.add.at``); each id's
tokens are summed in token order. Counts are therefore the kernel's exactly; sums differ from its sums by float64
rounding only (its vector lanes and fused multiply-adds add in another order), and the per-token terms are the
kernel's formulas (``rcdiag.core.formulas``) on numpy's ``expm1``, within two ulps of the kernel's ``expm1_reduced``
(tests/test_explain_kernel.py), so k3 of a tiny log-ratio keeps the kernel's digits. Held to the kernel and to the
brute-force reference by tests/test_explain_twin.py.
"""

from __future__ import annotations

import numpy as np

from rcdiag.core.formulas import chi2_term, k3_verl_array
from rcdiag.core.limits import EXPM1_AT_BOUND, EXPM1_AT_NEG_BOUND, SAFETY_BOUND
from rcdiag.kernels.explain_encoding import GOLDEN, GROUP_SHIFT

_GOLDEN = np.uint64(GOLDEN)
_SHIFT = np.uint64(GROUP_SHIFT)


def token_terms(d: np.ndarray, cap: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per token of the float64 log-ratios ``d``, the kernel's ``_row_terms``: k3 = e^d - 1 - d unclamped (inf where
    verl's float32 e^d overflows), chi2 = (e^d - 1)(e^d + 1) at d clamped to [-20, 20], and the IS ratio e^d at the
    clamped d, rounded to float32 and capped at ``cap`` (NaN kept), as float64."""
    em1 = np.expm1(d)
    clamped = np.where(d > SAFETY_BOUND, EXPM1_AT_BOUND, np.where(d < -SAFETY_BOUND, EXPM1_AT_NEG_BOUND, em1))
    ratio = (clamped + 1.0).astype(np.float32)
    capped = np.where(ratio > cap, cap, ratio).astype(np.float64)
    return k3_verl_array(np, em1, d), chi2_term(clamped), capped


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
    """``rcdiag.kernels.explain.explain_block`` in numpy (its docstring says what each argument holds): fold one
    block into the explain sums (added in place); returns how many valid tokens had an id beyond the by-token
    table (left for the caller)."""
    with np.errstate(all="ignore"):  # inf - inf, exp overflow: NaN and inf, as in the kernel
        return _explain_block(
            old, rollout, valid_len, list_len, mask, edges, thresholds, ratio_cap, shift_tol, prob, position,
            length, scale, offset, unlikely, likely, shape, tokens, token_sums,
        )  # fmt: skip


def _explain_block(
    old: np.ndarray, rollout: np.ndarray, valid_len: np.ndarray, list_len: np.ndarray, mask: np.ndarray,
    edges: np.ndarray, thresholds: np.ndarray, ratio_cap: float, shift_tol: float, prob: np.ndarray,
    position: np.ndarray, length: np.ndarray, scale: np.ndarray, offset: np.ndarray, unlikely: float, likely: float,
    shape: np.ndarray, tokens: np.ndarray, token_sums: np.ndarray,
) -> int:  # fmt: skip
    filled = valid_len > 0
    n_valid = valid_len[filled]  # rows without a valid token add nothing
    if n_valid.shape[0] == 0:
        return 0
    list_start = (np.cumsum(list_len) - list_len)[filled]
    at = np.flatnonzero(mask) if mask.shape[0] else None  # the valid tokens' places in the block
    x = old if at is None else old[at]
    y = rollout if at is None else rollout[at]
    row = np.repeat(np.arange(n_valid.shape[0]), n_valid)  # each valid token's row (among the filled rows)
    first = np.cumsum(n_valid) - n_valid  # each filled row's first valid token
    place = np.arange(x.shape[0]) if at is None else at
    where = place - np.repeat(list_start, n_valid)  # each valid token's position in its list

    key = (n_valid.astype(np.uint64) << np.uint64(32)) ^ x.view(np.uint32)[first].astype(np.uint64)
    group = ((key * _GOLDEN) >> _SHIFT).astype(np.intp)  # the kernel's row-group hash

    d32 = x - y
    d = d32.astype(np.float64)
    abs_d = np.abs(d)
    k3, chi2, capped = token_terms(d, np.float32(ratio_cap))
    terms = (d, abs_d, k3, chi2)

    def per_row(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values, first)

    def count(flags: np.ndarray) -> np.ndarray:
        return np.bincount(row[flags], minlength=n_valid.shape[0]).astype(np.float64)

    # position: a run of a row's tokens in one position bucket, summed, then added to its group's cell
    bucket_at = np.searchsorted(edges, where, side="right") - 1
    starts = np.ones(x.shape[0], dtype=np.bool_)
    starts[1:] = (row[1:] != row[:-1]) | (bucket_at[1:] != bucket_at[:-1])
    run_first = np.flatnonzero(starts)
    run_sums = np.empty((run_first.shape[0], 5))
    run_sums[:, 0] = np.diff(run_first, append=x.shape[0])
    for column, values in enumerate(terms, start=1):
        run_sums[:, column] = np.add.reduceat(values, run_first)
    np.add.at(position, (group[row[run_first]], bucket_at[run_first]), run_sums)

    # length: a row's runs, added to its valid length's bucket
    row_sums = np.add.reduceat(run_sums, np.searchsorted(run_first, first), axis=0)
    row_sums[:, 0] = n_valid
    np.add.at(length, np.searchsorted(edges, n_valid, side="right") - 1, row_sums)

    # prob: a row's tokens per rollout-probability bucket (float32 log-prob thresholds), added row by row
    prob_at = np.zeros(x.shape[0], dtype=np.intp)
    for threshold in thresholds:
        prob_at += y >= threshold
    n_prob = prob.shape[0]
    cell = row * n_prob + prob_at
    cells = n_valid.shape[0] * n_prob
    by_prob = np.empty((cells, 5))
    by_prob[:, 0] = np.bincount(cell, minlength=cells)
    for column, values in enumerate(terms, start=1):
        by_prob[:, column] = np.bincount(cell, weights=values, minlength=cells)
    np.add.at(prob, np.tile(np.arange(n_prob), n_valid.shape[0]), by_prob)

    # scale (finite log-probs; float32 products, as numpy takes them) and offset, per row, added to the row's group
    finite = (np.abs(x) < np.inf) & (np.abs(y) < np.inf)
    xf = np.where(finite, x, np.float32(0.0))
    yf = np.where(finite, y, np.float32(0.0))
    scale_rows = np.stack(
        [count(finite), *(per_row(v.astype(np.float64)) for v in (xf, yf, xf * xf, yf * yf, xf * yf))], axis=1
    )
    np.add.at(scale, group, scale_rows)
    tol = np.float32(shift_tol)
    up, down = d32 < -tol, d32 > tol
    row_capped = per_row(capped)
    np.add.at(offset, group, np.stack([n_valid.astype(np.float64), row_capped, count(up), count(down)], axis=1))

    # shape: per-response cluster sums (n, s, s^2, n s, n^2) of three statistics, then the likely tokens' shifts
    low = finite & (x < np.float32(unlikely))
    high = finite & (x >= np.float32(likely))
    clusters = (
        (count(low), per_row(np.where(low, d, 0.0))),
        (count(high), per_row(np.where(high, d, 0.0))),
        (n_valid.astype(np.float64), row_capped - n_valid),
    )
    columns = [v for n, s in clusters for v in (n, s, s * s, n * s, n * n)]
    shape_rows = np.stack([*columns, count(high & up), count(high & down)], axis=1)
    np.add.at(shape, np.tile(np.arange(shape.shape[0]), n_valid.shape[0]), shape_rows.ravel())

    if tokens.shape[0] == 0:
        return 0
    ids = tokens if at is None else tokens[at]
    return _add_token_terms(ids, d, abs_d, k3, chi2, token_sums)


def _add_token_terms(
    ids: np.ndarray, d: np.ndarray, abs_d: np.ndarray, k3: np.ndarray, chi2: np.ndarray, out: np.ndarray
) -> int:
    """``rcdiag.kernels.token_rows.add_token_terms`` in numpy: each token whose id is in ``[0, out.shape[0])`` added
    to its id's row of ``out`` (an id's tokens summed in token order, then added); returns how many were not."""
    inside = (ids >= 0) & (ids < out.shape[0])
    skipped = int(ids.shape[0] - np.count_nonzero(inside))
    if skipped:
        ids, d, abs_d, k3, chi2 = (v[inside] for v in (ids, d, abs_d, k3, chi2))
    if ids.shape[0] == 0:
        return skipped
    top = int(ids.max()) + 1
    out[:top, 0] += np.bincount(ids, minlength=top)
    for column, values in enumerate((d, abs_d, k3, chi2, d * d), start=1):
        out[:top, column] += np.bincount(ids, weights=values, minlength=top)
    return skipped


def scatter_token_sums(old: np.ndarray, rollout: np.ndarray, ids: np.ndarray, mask: np.ndarray, out: np.ndarray) -> int:
    """``rcdiag.kernels.token_ids.scatter_token_sums`` in numpy: add every valid token (``mask`` empty: every
    position) whose id is in ``[0, out.shape[0])`` to its id's row of ``out``; returns how many valid tokens had an
    id beyond the table (left for the caller)."""
    with np.errstate(all="ignore"):
        if mask.shape[0]:
            valid = mask != 0
            old, rollout, ids = old[valid], rollout[valid], ids[valid]
        d = (old - rollout).astype(np.float64)
        k3, chi2, _ = token_terms(d, np.float32(1.0))
        return _add_token_terms(ids, d, np.abs(d), k3, chi2, out)
