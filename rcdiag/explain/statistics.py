"""Sums behind the temperature and offset detectors, kept per row group so that their noise can be measured.

Both are plain float64 sums per group (``rcdiag.explain.breakdowns.GROUPS``), merged by addition.

* ``ScaleSums``: the co-moments of the two sides' log-probs (x = old_log_prob, y = rollout_log_prob) over valid
  tokens with finite log-probs. Log-probs have mean and spread of the same order (mostly within [-20, 0]), so
  the raw-moment variance sum(x^2)/n - mean^2 loses no digits worth having in float64.
* ``OffsetSums``: the mean of the token IS ratio exp(clamp(old - rollout)) capped at ``RATIO_CAP``, and how many
  tokens the rollout side scores more than ``SHIFT_TOL`` above or below the trainer.
"""

from __future__ import annotations

import math

import numpy as np

from rcdiag.explain.breakdowns import GROUPS
from rcdiag.metrics.block import Block

RATIO_CAP = math.exp(3.0)
"""The offset statistic caps each token's IS ratio here, so that a few outlier tokens cannot move it."""
SHIFT_TOL = 0.01
"""A token counts as shifted when the two sides' log-probs differ by more than this (1% in probability)."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def row_groups(block: Block) -> np.ndarray:
    """Each row's group: a hash of its valid length and the exact bits of its first valid trainer log-prob,
    so the same row lands in the same group whatever chunk, block or worker reads it."""
    lengths = block.row_len.astype(np.int64)
    starts = np.zeros(block.n_rows, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    bits = np.zeros(block.n_rows, dtype=np.uint64)
    nonempty = lengths > 0
    if block.n_tokens:
        bits[nonempty] = block.old[starts[nonempty]].view(np.uint32).astype(np.uint64)
    key = bits ^ (lengths.astype(np.uint64) << np.uint64(32))
    with np.errstate(over="ignore"):
        return ((key * _GOLDEN) >> np.uint64(60)).astype(np.int64)


class GroupSums:
    """A (GROUPS, len(NAMES)) table of float64 sums."""

    NAMES: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.sums = np.zeros((GROUPS, len(self.NAMES)))

    def add_rows(self, groups: np.ndarray, *per_row: np.ndarray) -> None:
        self.sums += np.stack([np.bincount(groups, weights=v, minlength=GROUPS) for v in per_row], axis=-1)

    def merge(self, other: GroupSums) -> None:
        self.sums += other.sums

    def state_dict(self) -> list[float]:
        return self.sums.ravel().tolist()

    def load_state_dict(self, state: list[float]) -> None:
        self.sums = np.asarray(state, dtype=np.float64).reshape(self.sums.shape)

    def column(self, name: str) -> np.ndarray:
        return self.sums[:, self.NAMES.index(name)]


class ScaleSums(GroupSums):
    NAMES = ("n", "x", "y", "xx", "yy", "xy")

    def update(self, block: Block, groups: np.ndarray) -> None:
        if block.n_tokens == 0:
            return
        seg, x, y = block.seg, block.old, block.rollout
        low, high = block.lr_range
        if math.isfinite(low) and math.isfinite(high):
            n, sx, sy = block.row_len, block.row_sum_old, block.row_sum_rollout
        else:  # -inf log-probs (probability 0) carry no scale information
            finite = np.isfinite(x) & np.isfinite(y)
            x, y = np.where(finite, x, 0.0).astype(np.float32), np.where(finite, y, 0.0).astype(np.float32)
            n, sx, sy = seg.count(finite), seg.sum(x), seg.sum(y)
        self.add_rows(groups, n, sx, sy, seg.sum(x * x), seg.sum(y * y), seg.sum(x * y))

    @staticmethod
    def slopes(sums: np.ndarray) -> tuple[float, float, float] | None:
        """(y-on-x slope, inverse x-on-y slope, geometric-mean slope) of one row of sums; ``None`` if degenerate."""
        n, x, y, xx, yy, xy = (float(v) for v in sums)
        if n < 2:
            return None
        cxx, cyy, cxy = xx / n - (x / n) ** 2, yy / n - (y / n) ** 2, xy / n - (x / n) * (y / n)
        if cxx <= 0 or cyy <= 0 or cxy <= 0:
            return None
        return cxy / cxx, cyy / cxy, math.sqrt(cyy / cxx)


class OffsetSums(GroupSums):
    NAMES = ("n", "capped_ratio", "up", "down")

    def update(self, block: Block, groups: np.ndarray) -> None:
        if block.n_tokens == 0:
            return
        seg, lr = block.seg, block.lr
        capped = np.minimum(block.ratio, np.float32(RATIO_CAP))
        self.add_rows(groups, block.row_len, seg.sum(capped), seg.count(lr < -SHIFT_TOL), seg.count(lr > SHIFT_TOL))


def group_spread(values: list[float]) -> float:
    """Standard error of the mean of per-group values (their spread over sqrt(count)); inf for fewer than 4."""
    if len(values) < 4:
        return math.inf
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))
