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
from rcdiag.metrics.offpolicy import k3_sum, token_metrics

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

SUMS = ("tokens", "lr", "abs_lr", "exp_lr", "ratio_sq")
"""Per-bucket sums: valid tokens, log-ratio (old - rollout), |log-ratio|, exp(log-ratio), exp(clamp(lr))^2."""

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
    return np.searchsorted(LOG_PROB_THRESHOLDS, rollout_log_prob, side="right").astype(np.uint8)


def token_positions(lengths: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """0-based position in its response of every valid token (every position counts, masked or not)."""
    total = int(lengths.sum())
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    positions = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    return positions if mask is None else positions[mask]


class Breakdowns:
    """The three breakdowns' sums: positions x rollout probability per row group, and lengths."""

    def __init__(self) -> None:
        self.joint = np.zeros((GROUPS, N_DOUBLING, N_PROB, len(SUMS)))
        self.length = np.zeros((N_DOUBLING, len(SUMS)))

    def update(self, block: Block, positions: np.ndarray, token_groups: np.ndarray, row_groups: np.ndarray) -> None:
        """Fold a (numpy) block in; ``positions`` and ``token_groups`` are per valid token, ``row_groups`` per row."""
        if block.n_tokens == 0:
            return
        b = block.b
        cell = token_groups.astype(np.int32) * (N_DOUBLING * N_PROB)
        cell += doubling_bucket(positions).astype(np.int32) * N_PROB
        cell += prob_bucket(block.rollout)
        size = GROUPS * N_DOUBLING * N_PROB
        abs_lr = b.abs(block.lr)
        terms = (None, block.lr, abs_lr, block.exp_lr, block.ratio * block.ratio)
        joint = np.stack([np.bincount(cell, weights=term, minlength=size) for term in terms], axis=-1)
        self.joint += joint.reshape(self.joint.shape)
        seg = block.seg
        row_sums = (block.row_len, block.row_sum_lr, seg.sum(abs_lr), seg.sum(block.exp_lr), seg.sum(terms[4]))
        rows = doubling_bucket(block.row_len.astype(np.int64))
        self.length += np.stack([np.bincount(rows, weights=s, minlength=N_DOUBLING) for s in row_sums], axis=-1)

    def merge(self, other: Breakdowns) -> None:
        self.joint += other.joint
        self.length += other.length

    def state_dict(self) -> dict[str, Any]:
        return {"joint": self.joint.ravel().tolist(), "length": self.length.ravel().tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.joint = np.asarray(state["joint"], dtype=np.float64).reshape(self.joint.shape)
        self.length = np.asarray(state["length"], dtype=np.float64).reshape(self.length.shape)

    @property
    def position_sums(self) -> np.ndarray:
        """(GROUPS, N_DOUBLING, len(SUMS)) position sums per row group."""
        return self.joint.sum(axis=2)

    def compute(self) -> dict[str, list[dict[str, Any]]]:
        """The JSON ``breakdowns`` object."""
        position = self.joint.sum(axis=(0, 2))
        prob = self.joint.sum(axis=(0, 1))
        return {
            "position": _rows(position, DOUBLING_EDGES, open_end=True),
            "rollout_prob": _rows(prob, PROB_EDGES, open_end=False),
            "length": _rows(self.length, DOUBLING_EDGES, open_end=True),
        }


def bucket_metrics(sums: np.ndarray) -> dict[str, float | None]:
    """kl, k3_kl, chi2_token and abs_log_ratio_mean of one bucket's sums (``None`` for an empty bucket)."""
    tokens, lr, abs_lr, exp_lr, ratio_sq = (float(v) for v in sums)
    if tokens == 0:
        return {"kl": None, "k3_kl": None, "chi2_token": None, "abs_log_ratio_mean": None}
    values: dict[str, float | None] = dict(token_metrics(tokens, lr, k3_sum(exp_lr, lr, tokens), ratio_sq))
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
