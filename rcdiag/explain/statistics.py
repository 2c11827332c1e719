"""Sums behind the temperature and offset detectors, kept per hash group so that their noise can be measured.

Both are plain float64 sums per group (``rcdiag.explain.breakdowns.GROUPS``), merged by addition, taken by the
fused pass over each block (``rcdiag.kernels.explain``). A row's group is a hash of its valid length and the exact
bits of its first valid trainer log-prob, so the same row lands in the same group whatever chunk, block or
worker reads it.

* ``ScaleSums``: the co-moments of the two sides' log-probs (x = old_log_prob, y = rollout_log_prob) over valid
  tokens with finite log-probs. Log-probs have mean and spread of the same order (mostly within [-20, 0]), so
  the raw-moment variance sum(x^2)/n - mean^2 loses no digits worth having in float64.
  Products are float32, as numpy takes them (x * x of float32 arrays).
* ``OffsetSums``: the mean of the token IS ratio exp(clamp(old - rollout)) (float32) capped at ``RATIO_CAP``, and how
  many tokens the rollout side scores more than ``SHIFT_TOL`` above or below the trainer.
"""

from __future__ import annotations

import math

import numpy as np

from rcdiag.explain.breakdowns import GROUPS
from rcdiag.fields import reals

RATIO_CAP = math.exp(3.0)
"""The offset statistic caps each token's IS ratio here, so that a few outlier tokens cannot move it."""
SHIFT_TOL = 0.01
"""A token counts as shifted when the two sides' log-probs differ by more than this (1% in probability)."""


class GroupSums:
    """A (GROUPS, len(NAMES)) table of float64 sums."""

    NAMES: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.sums = np.zeros((GROUPS, len(self.NAMES)))

    def merge(self, other: GroupSums) -> None:
        self.sums += other.sums

    def state_dict(self) -> list[float]:
        return self.sums.ravel().tolist()

    def load_state_dict(self, state: list[float]) -> None:
        self.sums = reals(state, type(self).__name__, self.sums.shape)

    def column(self, name: str) -> np.ndarray:
        return self.sums[:, self.NAMES.index(name)]


class ScaleSums(GroupSums):
    NAMES = ("n", "x", "y", "xx", "yy", "xy")

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


def group_spread(values: list[float]) -> float:
    """Standard error of the mean of per-group values (their spread over sqrt(count)); inf for fewer than 4."""
    if len(values) < 4:
        return math.inf
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))
