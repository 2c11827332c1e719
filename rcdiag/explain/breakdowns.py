"""Where the mismatch sits: token-level off-policy metrics per bucket of position, rollout probability and length.

Every valid token falls in exactly one bucket of each breakdown, so each breakdown's ``tokens`` add up to the
dump's valid tokens. A bucket's state is five float64 sums (``SUMS``: tokens, log-ratio, |log-ratio|, k3 and
chi2 terms), from which verl's ``kl``, ``k3_kl`` and ``chi2_token`` follow by the engine's own formulas
(``rcdiag.metrics.offpolicy.token_metrics``) restricted to the bucket's tokens. Sums merge by addition, so the
result does not depend on chunking, row order or workers. Position buckets are also kept per hash group
(``GROUPS``), which gives the position-drift detector its noise estimate. The sums are taken by one fused pass
per block (``rcdiag.kernels.explain``, fed by ``rcdiag.explain.state``); this module declares their layout.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from rcdiag.core.limits import finite
from rcdiag.metrics.base import Accumulator, Reduce
from rcdiag.metrics.offpolicy import token_metrics
from rcdiag.records.report import BucketRow, ExplainBreakdowns

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
"""Per-bucket sums: valid tokens, log-ratio (old - rollout), |log-ratio|, and verl's per-token k3_kl and
chi2_token terms (e^d - 1 - d unclamped, e^(2 clamp(d)) - 1)."""


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
    """Bucket index in ``PROB_EDGES`` of exp(rollout_log_prob): the number of thresholds it reaches (as the fused
    pass counts them; NaN reaches none)."""
    bucket = np.zeros(rollout_log_prob.shape, dtype=np.uint8)
    for edge in LOG_PROB_THRESHOLDS:
        bucket += rollout_log_prob >= edge
    return bucket


def token_positions(lengths: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """0-based position in its response of every valid token (every position counts, masked or not)."""
    total = int(lengths.sum())
    starts = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    positions = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    return positions if mask is None else positions[mask]


class Breakdowns(Accumulator):
    """The three breakdowns' sums: position buckets per hash group, rollout-probability buckets, lengths (filled by
    the fused pass, ``rcdiag.explain.state``)."""

    STATES: ClassVar[dict[str, Reduce]] = {"position": "sums", "prob": "sums", "length": "sums"}
    OWNER: ClassVar[str | None] = "explain"
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {
        "position": (GROUPS, N_DOUBLING, len(SUMS)),
        "prob": (N_PROB, len(SUMS)),
        "length": (N_DOUBLING, len(SUMS)),
    }

    def update(self, block: Any) -> None:
        """Filled with the detectors' sums by one fused pass over each block (``ExplainState``)."""
        raise NotImplementedError("filled by ExplainState's fused pass")

    @property
    def position(self) -> np.ndarray:
        return self.state["position"]

    @position.setter
    def position(self, value: np.ndarray) -> None:
        self.state["position"] = value

    @property
    def prob(self) -> np.ndarray:
        return self.state["prob"]

    @property
    def length(self) -> np.ndarray:
        return self.state["length"]

    @property
    def position_sums(self) -> np.ndarray:
        """(GROUPS, N_DOUBLING, len(SUMS)) position sums per hash group."""
        return self.position

    def compute(self) -> ExplainBreakdowns:  # type: ignore[override]
        """The report's breakdowns (without the by-token table, which the explain section adds)."""
        return ExplainBreakdowns(
            position=_rows(self.position.sum(axis=0), DOUBLING_EDGES, open_end=True),
            rollout_prob=_rows(self.prob, PROB_EDGES, open_end=False),
            length=_rows(self.length, DOUBLING_EDGES, open_end=True),
        )


def bucket_metrics(sums: np.ndarray) -> dict[str, float | None]:
    """kl, k3_kl, chi2_token and abs_log_ratio_mean of one bucket's sums (``None`` for an empty bucket)."""
    tokens, lr, abs_lr, k3, chi2 = (float(v) for v in sums)
    if tokens == 0:
        return {"kl": None, "k3_kl": None, "chi2_token": None, "abs_log_ratio_mean": None}
    values: dict[str, float | None] = dict(token_metrics(tokens, lr, k3, chi2))
    values["abs_log_ratio_mean"] = abs_lr / tokens
    return {k: finite(v) for k, v in values.items()}


def _rows(sums: np.ndarray, edges: tuple, *, open_end: bool) -> tuple[BucketRow, ...]:
    """One entry per bucket, from the first up to the last bucket holding a token (all of them for bounded
    edges)."""
    filled = np.flatnonzero(sums[:, 0])
    last = len(sums) - 1 if not open_end else (int(filled[-1]) if filled.size else 0)
    out = []
    for k in range(last + 1):
        hi = edges[k + 1] if k + 1 < len(edges) else None
        out.append(BucketRow(lo=edges[k], hi=hi, tokens=int(sums[k, 0]), **bucket_metrics(sums[k])))
    return tuple(out)
