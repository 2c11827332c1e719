"""The small-dump path's numpy forms of ``analyze --explain``'s passes, so a small dump's ``--explain`` never imports
numba (``rcdiag.kernels.small``): ``explain_block`` (``rcdiag.kernels.explain``, with the by-token additions of
``rcdiag.kernels.token_rows``) and ``scatter_token_sums`` (``rcdiag.kernels.token_ids``), same arguments, same sums
added in place, same return value.

Array operations over the valid tokens of a piece of whole rows at a time in place of the kernel's loop over rows,
keeping the kernel's grouping of the additions: a run of a row's tokens that share a position bucket is summed first
and added to its cell, a row's runs make its length sums, a row's tokens per probability bucket its probability
sums, a row's scale, offset and shape sums are added to its group and the clusters, in row order (``np.add.at``);
each token is added to its id's row in token order. Counts are therefore the kernel's exactly; sums differ from its
sums by float64 rounding only (its vector lanes and fused multiply-adds add in another order), and the per-token
terms are the kernel's formulas (``rcdiag.core.formulas``) on numpy's ``expm1``, within two ulps of the kernel's
``expm1_reduced`` (tests/engine/test_explain_kernel.py), so k3 of a tiny log-ratio keeps the kernel's digits. Held to
the kernel and to the brute-force reference by tests/engine/test_explain_twin.py.
"""

from __future__ import annotations

import numpy as np

from rcdiag.core.formulas import chi2_term, k3_verl_array
from rcdiag.core.limits import EXPM1_AT_BOUND, EXPM1_AT_NEG_BOUND, SAFETY_BOUND
from rcdiag.kernels.explain_encoding import GOLDEN, GROUP_SHIFT

_GOLDEN = np.uint64(GOLDEN)
_SHIFT = np.uint64(GROUP_SHIFT)
PIECE = 1 << 16
"""Raw tokens (whole rows) the pass takes at a time: its forty-odd temporary arrays then stay in the CPU's caches
(measured on a 2M-token dump: 0.5-0.7x the time of taking a 512k-token block at once). Every sum is added per row
or per token in order, so the pieces change no bit."""


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
    ends = np.cumsum(list_len)
    skipped = first_row = start = 0
    with np.errstate(all="ignore"):  # inf - inf, exp overflow: NaN and inf, as in the kernel
        while first_row < list_len.shape[0]:  # whole rows, about PIECE raw tokens at a time
            end_row = max(int(np.searchsorted(ends, start + PIECE, side="right")), first_row + 1)
            end = int(ends[end_row - 1])
            rows, raw = slice(first_row, end_row), slice(start, end)
            skipped += _explain_block(
                old[raw], rollout[raw], valid_len[rows], list_len[rows], mask[raw] if mask.shape[0] else mask, edges,
                thresholds, ratio_cap, shift_tol, prob, position, length, scale, offset, unlikely, likely, shape,
                tokens[raw] if tokens.shape[0] else tokens, token_sums,
            )  # fmt: skip
            first_row, start = end_row, end
    return skipped


def _explain_block(
    old: np.ndarray, rollout: np.ndarray, valid_len: np.ndarray, list_len: np.ndarray, mask: np.ndarray,
    edges: np.ndarray, thresholds: np.ndarray, ratio_cap: float, shift_tol: float, prob: np.ndarray,
    position: np.ndarray, length: np.ndarray, scale: np.ndarray, offset: np.ndarray, unlikely: float, likely: float,
    shape: np.ndarray, tokens: np.ndarray, token_sums: np.ndarray,
) -> int:  # fmt: skip
    filled = valid_len > 0
    n_valid = valid_len[filled]  # rows without a valid token add nothing
    n_rows = n_valid.shape[0]
    if n_rows == 0:
        return 0
    at = np.flatnonzero(mask) if mask.shape[0] else None  # the valid tokens' places in the block
    x = old if at is None else old[at]
    y = rollout if at is None else rollout[at]
    n = x.shape[0]
    first = np.cumsum(n_valid) - n_valid  # each filled row's first valid token

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
        return np.add.reduceat(flags.view(np.uint8), first, dtype=np.int64).astype(np.float64)

    # position: a run of a row's valid tokens in one position bucket (list positions edges[k] to edges[k + 1]),
    # summed, then added to its group's cell; a row's runs are the edges below its list length
    n_list = list_len[filled]
    runs = np.searchsorted(edges, n_list, side="left")
    run_row = np.repeat(np.arange(n_rows), runs)
    run_bucket = np.arange(run_row.shape[0]) - np.repeat(np.cumsum(runs) - runs, runs)
    run_place = np.repeat((np.cumsum(list_len) - list_len)[filled], runs) + edges[run_bucket]  # in the block
    if at is None:
        run_count = np.diff(run_place, append=n)
    else:
        run_count = np.add.reduceat(mask.view(np.uint8), run_place, dtype=np.int64)
    taken = run_count > 0
    run_row, run_bucket, run_count = run_row[taken], run_bucket[taken], run_count[taken]
    run_first = np.cumsum(run_count) - run_count  # in the valid tokens
    run_sums = np.empty((run_first.shape[0], 5))
    run_sums[:, 0] = run_count
    for column, values in enumerate(terms, start=1):
        run_sums[:, column] = np.add.reduceat(values, run_first)
    np.add.at(position, (group[run_row], run_bucket), run_sums)
    if prob.shape[0]:  # the breakdowns (none: the detectors' sums alone)
        _breakdowns(run_sums, run_first, first, n_valid, edges, y, thresholds, terms, prob, length)

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
    columns = [v for c, s in clusters for v in (c, s, s * s, c * s, c * c)]
    shape_rows = np.stack([*columns, count(high & up), count(high & down)], axis=1)
    np.add.at(shape, np.tile(np.arange(shape.shape[0]), n_rows), shape_rows.ravel())

    if tokens.shape[0] == 0:
        return 0
    ids = tokens if at is None else tokens[at]
    return _add_token_terms(ids, d, abs_d, k3, chi2, token_sums)


def _breakdowns(
    run_sums: np.ndarray, run_first: np.ndarray, first: np.ndarray, n_valid: np.ndarray, edges: np.ndarray,
    y: np.ndarray, thresholds: np.ndarray, terms: tuple[np.ndarray, ...], prob: np.ndarray, length: np.ndarray,
) -> None:  # fmt: skip
    """The length and probability breakdowns of the filled rows (``_explain_block``'s position runs given)."""
    # length: a row's runs, added to its valid length's bucket
    row_sums = np.add.reduceat(run_sums, np.searchsorted(run_first, first), axis=0)
    row_sums[:, 0] = n_valid
    np.add.at(length, np.searchsorted(edges, n_valid, side="right") - 1, row_sums)

    # prob: a row's tokens per rollout-probability bucket (float32 log-prob thresholds), added row by row
    prob_at = (y >= thresholds[0]).view(np.uint8).copy()  # NaN: bucket 0
    for threshold in thresholds[1:]:
        prob_at += (y >= threshold).view(np.uint8)
    n_rows, n_prob = n_valid.shape[0], prob.shape[0]
    row = np.repeat(np.arange(n_rows), n_valid)  # each valid token's row (among the filled rows)
    cell = row * n_prob + prob_at
    cells = n_rows * n_prob
    by_prob = np.empty((cells, 5))
    by_prob[:, 0] = np.bincount(cell, minlength=cells)
    for column, values in enumerate(terms, start=1):
        by_prob[:, column] = np.bincount(cell, weights=values, minlength=cells)
    np.add.at(prob, np.tile(np.arange(n_prob), n_rows), by_prob)


def _add_token_terms(
    ids: np.ndarray, d: np.ndarray, abs_d: np.ndarray, k3: np.ndarray, chi2: np.ndarray, out: np.ndarray
) -> int:
    """``rcdiag.kernels.token_rows.add_token_terms`` in numpy: each token whose id is in ``[0, out.shape[0])`` added
    to its id's row of ``out``, in token order; returns how many were not."""
    inside = (ids >= 0) & (ids < out.shape[0])
    skipped = int(ids.shape[0] - np.count_nonzero(inside))
    if skipped:
        ids, d, abs_d, k3, chi2 = (v[inside] for v in (ids, d, abs_d, k3, chi2))
    if ids.shape[0] == 0:
        return skipped
    np.add.at(out[:, 0], ids, 1.0)
    for column, values in enumerate((d, abs_d, k3, chi2, d * d), start=1):
        np.add.at(out[:, column], ids, values)
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
