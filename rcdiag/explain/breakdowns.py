"""Where the mismatch sits: token-level off-policy metrics per bucket of position, rollout probability and length.

Every valid token falls in exactly one bucket of each breakdown, so each breakdown's ``tokens`` add up to the
dump's valid tokens. A bucket's state is five float64 sums (tokens, log-ratio, |log-ratio|, exp(log-ratio),
squared IS ratio), from which verl's ``kl``, ``k3_kl`` and ``chi2_token`` follow by the engine's own formulas
(``rcdiag.metrics.offpolicy.token_metrics``) restricted to the bucket's tokens. Sums merge by addition, so the
result does not depend on chunking, row order or workers. Position buckets are also kept per row group
(``GROUPS``), which gives the position-drift detector its noise estimate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.metrics.block import Block
from rcdiag.metrics.offpolicy import chi2_terms, k3_terms, token_metrics

GROUPS = 16
"""Rows are dealt into this many groups by a hash of their content (never by position in the dump, so workers
and chunking cannot change the deal); the spread between groups measures sampling noise with whole responses
as the independent units, since tokens of one response are correlated."""

FIRST_EDGE = 32
MAX_EXPONENT = 30
DOUBLING_EDGES = (0, *(FIRST_EDGE << k for k in range(MAX_EXPONENT - 4)))
"""[0, 32), [32, 64), [64, 128), ..., [2^29, 2^30), then [2^30, open): positions and lengths."""
N_DOUBLING = len(DOUBLING_EDGES)

PROB_EDGES = (0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1.0)
"""Rollout-probability buckets; the last, [0.99, 1], includes 1."""
N_PROB = len(PROB_EDGES) - 1

SUMS = ("tokens", "lr", "abs_lr", "k3", "chi2")
"""Per-bucket sums: valid tokens, log-ratio (old - rollout), |log-ratio|, and the engine's per-token k3_kl and
chi2_token terms (``rcdiag.metrics.offpolicy.k3_terms`` / ``chi2_terms``)."""

_LUT_SIZE = 1 << 16


def _doubling_lut() -> np.ndarray:
    values = np.arange(_LUT_SIZE, dtype=np.int64)
    return np.searchsorted(np.asarray(DOUBLING_EDGES[1:]), values, side="right").astype(np.uint8)


_LUT = _doubling_lut()


def doubling_bucket(values: np.ndarray) -> np.ndarray:
    """Bucket index in ``DOUBLING_EDGES`` of non-negative integers (positions, lengths)."""
    if values.size == 0 or int(values.max()) < _LUT_SIZE:
        return _LUT[values]
    return np.searchsorted(np.asarray(DOUBLING_EDGES[1:]), values, side="right").astype(np.uint8)


def _log_thresholds() -> np.ndarray:
    """float32 log-prob thresholds t_k with ``x >= t_k`` exactly when ``exp(x) >= PROB_EDGES[k]`` (x float32,
    exp in float64): bucketing in log space gives the buckets of the probability itself, with no exp pass."""
    out = []
    for edge in PROB_EDGES[1:-1]:
        t = np.float32(math.log(edge))
        while math.exp(float(t)) < edge:
            t = np.nextafter(t, np.float32(np.inf))
        while math.exp(float(np.nextafter(t, np.float32(-np.inf)))) >= edge:
            t = np.nextafter(t, np.float32(-np.inf))
        out.append(t)
    return np.asarray(out, dtype=np.float32)


LOG_PROB_THRESHOLDS = _log_thresholds()


def prob_bucket(rollout_log_prob: np.ndarray) -> np.ndarray:
    """Bucket index in ``PROB_EDGES`` of exp(rollout_log_prob)."""
    return prob_buckets(rollout_log_prob)[0]


def prob_buckets(rollout_log_prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each token's bucket index in ``PROB_EDGES`` of exp(rollout_log_prob), and the tokens per bucket: a sum of
    comparisons with the edges (seven one-byte passes; ``searchsorted`` costs ten times as much per token)."""
    bucket = np.zeros(rollout_log_prob.shape, dtype=np.uint8)
    at_least = [rollout_log_prob.shape[0]]
    for edge in LOG_PROB_THRESHOLDS:
        above = rollout_log_prob >= edge
        at_least.append(int(np.count_nonzero(above)))
        bucket += above
    at_least.append(0)
    return bucket, -np.diff(np.asarray(at_least, dtype=np.float64))


_LANES = 64
_lanes = np.zeros(0, dtype=np.intp)


def _lane_index(n: int) -> np.ndarray:
    """0, 1, ..., 63, 0, 1, ... of length ``n`` (cached): spreads consecutive tokens of one bucket over 64 slots,
    so ``bincount`` does not wait on one running sum (with 8 buckets that costs it 5-10x)."""
    global _lanes
    if _lanes.shape[0] < n:
        _lanes = np.arange(max(n, 1 << 17), dtype=np.intp) & (_LANES - 1)
    return _lanes[:n]


def position_segments(
    valid_lengths: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of a block's valid tokens that share a row and a position bucket.

    Returns each run's first index in the compacted (valid-only) token array, its row and its bucket. Buckets
    start at fixed positions of each row (0, 32, 64, ...), so the runs follow from the row lengths and the mask
    alone; their sums are then ``reduceat`` sums (one sequential pass per term, no per-token positions).
    """
    n_rows = lengths.shape[0]
    per_row = np.where(lengths > 0, doubling_bucket(np.maximum(lengths - 1, 0)).astype(np.int64) + 1, 0)
    runs = int(per_row.sum())
    run_row = np.repeat(np.arange(n_rows), per_row)
    first_run = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(per_row[:-1], out=first_run[1:])
    run_bucket = np.arange(runs) - first_run[run_row]
    row_start = np.zeros(n_rows, dtype=np.int64)
    np.cumsum(lengths[:-1], out=row_start[1:])
    at = row_start[run_row] + np.asarray(DOUBLING_EDGES, dtype=np.int64)[run_bucket]
    if mask is not None and runs:
        # valid tokens per run (one sequential pass over the mask), then where each run starts among them
        flags = mask.view(np.uint8) if mask.dtype == np.bool_ else (mask != 0).view(np.uint8)
        valid = np.add.reduceat(flags, at, dtype=np.int64)
        at = np.zeros(runs, dtype=np.int64)
        np.cumsum(valid[:-1], out=at[1:])
    ends = np.append(at[1:], int(valid_lengths.sum()))
    keep = ends > at
    return at[keep], run_row[keep], run_bucket[keep]


def token_positions(lengths: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """0-based position in its response of every valid token (every position counts, masked or not)."""
    total = int(lengths.sum())
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    positions = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    return positions if mask is None else positions[mask]


class Breakdowns:
    """The three breakdowns' sums: position buckets per row group, rollout-probability buckets, lengths."""

    def __init__(self) -> None:
        self.position = np.zeros((GROUPS, N_DOUBLING, len(SUMS)))
        self.prob = np.zeros((N_PROB, len(SUMS)))
        self.length = np.zeros((N_DOUBLING, len(SUMS)))

    def update(self, block: Block, lengths: np.ndarray, mask: np.ndarray | None, row_groups: np.ndarray) -> None:
        """Fold a (numpy) block in; ``lengths`` and ``mask`` describe its rows before padding was dropped."""
        n = block.n_tokens
        if n == 0:
            return
        b = block.b
        k3, chi2 = k3_terms(block), chi2_terms(block)
        terms = (block.lr, b.abs(block.lr), k3, chi2)
        bucket, counts = prob_buckets(block.rollout)
        cell = (bucket.astype(np.intp) << 6) | _lane_index(n)
        # float64 log-ratio (the engine's, when no value reaches the clamp): ``np.add.at`` adds float64 weights in
        # token order like ``bincount`` (the same sums) at two thirds of its cost, but is slow on float32 ones.
        lr64 = block.lr_safe64 if block.within_clamp else b.to_float64(block.lr)
        size = N_PROB * _LANES
        sums = np.stack([_cell_sums(cell, t, size) for t in (lr64, b.abs(lr64), k3, chi2)], axis=-1)
        self.prob[:, 0] += counts
        self.prob[:, 1:] += sums.reshape(N_PROB, _LANES, len(terms)).sum(axis=1)

        starts, run_row, run_bucket = position_segments(block.row_len.astype(np.int64), lengths, mask)
        counts = np.diff(np.append(starts, n)).astype(np.float64)
        runs = np.stack([counts, *(np.add.reduceat(t, starts, dtype=np.float64) for t in terms)], axis=-1)
        cells = row_groups[run_row] * N_DOUBLING + run_bucket
        self.position += _scatter(cells, runs, GROUPS * N_DOUBLING).reshape(self.position.shape)
        row_bucket = doubling_bucket(block.row_len.astype(np.int64))
        self.length += _scatter(row_bucket[run_row], runs, N_DOUBLING)

    def merge(self, other: Breakdowns) -> None:
        self.position += other.position
        self.prob += other.prob
        self.length += other.length

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name).ravel().tolist() for name in ("position", "prob", "length")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("position", "prob", "length"):
            current = getattr(self, name)
            setattr(self, name, np.asarray(state[name], dtype=np.float64).reshape(current.shape))

    @property
    def position_sums(self) -> np.ndarray:
        """(GROUPS, N_DOUBLING, len(SUMS)) position sums per row group."""
        return self.position

    def compute(self) -> dict[str, list[dict[str, Any]]]:
        """The JSON ``breakdowns`` object."""
        return {
            "position": _rows(self.position.sum(axis=0), DOUBLING_EDGES, open_end=True),
            "rollout_prob": _rows(self.prob, PROB_EDGES, open_end=False),
            "length": _rows(self.length, DOUBLING_EDGES, open_end=True),
        }


def _cell_sums(cell: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
    """``np.bincount(cell, weights, minlength=size)`` for float64 weights, added in the same order."""
    out = np.zeros(size)
    np.add.at(out, cell, weights)
    return out


def _scatter(cells: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per-cell sums of each column of ``values`` (few runs per row: cheap)."""
    return np.stack([np.bincount(cells, weights=values[:, k], minlength=size) for k in range(values.shape[1])], -1)


def bucket_metrics(sums: np.ndarray) -> dict[str, float | None]:
    """kl, k3_kl, chi2_token and abs_log_ratio_mean of one bucket's sums (``None`` for an empty bucket)."""
    tokens, lr, abs_lr, k3, chi2 = (float(v) for v in sums)
    if tokens == 0:
        return {"kl": None, "k3_kl": None, "chi2_token": None, "abs_log_ratio_mean": None}
    values: dict[str, float | None] = dict(token_metrics(tokens, lr, k3, chi2))
    values["abs_log_ratio_mean"] = abs_lr / tokens
    return {k: v if v is not None and math.isfinite(v) else None for k, v in values.items()}


def _rows(sums: np.ndarray, edges: tuple, *, open_end: bool) -> list[dict[str, Any]]:
    """One entry per bucket, from the first up to the last bucket holding a token (all of them for bounded
    edges)."""
    filled = np.flatnonzero(sums[:, 0])
    last = len(sums) - 1 if not open_end else (int(filled[-1]) if filled.size else 0)
    out = []
    for k in range(last + 1):
        hi = edges[k + 1] if k + 1 < len(edges) else None
        out.append({"lo": edges[k], "hi": hi, "tokens": int(sums[k, 0]), **bucket_metrics(sums[k])})
    return out
