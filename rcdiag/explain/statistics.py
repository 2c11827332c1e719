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
* ``ShapeSums`` (not per group): per-response sums behind the temperature and truncation detectors, with whole
  responses as the independent units: the log-ratio d = old - rollout over the tokens the trainer found unlikely
  (p < ``UNLIKELY``) and likely (p >= ``LIKELY``), the capped IS ratio minus 1 over every valid token, and the
  likely tokens shifted each way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.explain.breakdowns import GROUPS
from rcdiag.metrics.base import Accumulator, Reduce

RATIO_CAP = math.exp(3.0)
"""The offset statistic caps each token's IS ratio here, so that a few outlier tokens cannot move it."""
SHIFT_TOL = 0.01
"""A token counts as shifted when the two sides' log-probs differ by more than this (1% in probability)."""
UNLIKELY = 0.1
"""``ShapeSums``: a token the trainer found unlikely has exp(old_log_prob) below this (a rollout_prob bucket edge)."""
LIKELY = 0.9
"""``ShapeSums``: a token the trainer found likely has exp(old_log_prob) at least this (a rollout_prob bucket edge)."""


class SumsAccumulator(Accumulator):
    """An accumulator of one ``sums`` state, ``sums`` (filled by the fused pass, ``rcdiag.explain.state``; read by
    the detectors, which ``compute`` nothing of their own here)."""

    STATES: ClassVar[dict[str, Reduce]] = {"sums": "sums"}
    OWNER: ClassVar[str | None] = "explain"

    @property
    def sums(self) -> np.ndarray:
        return self.state["sums"]

    @sums.setter
    def sums(self, value: np.ndarray) -> None:
        self.state["sums"] = value

    def update(self, block: Any) -> None:
        """Filled with the other sums by one fused pass over each block (``ExplainState``)."""
        raise NotImplementedError("filled by ExplainState's fused pass")

    def compute(self) -> tuple[dict[str, Any], list]:
        return {}, []


class GroupSums(SumsAccumulator):
    """A (GROUPS, len(NAMES)) table of float64 sums."""

    NAMES: tuple[str, ...] = ()

    def column(self, name: str) -> np.ndarray:
        return self.sums[:, self.NAMES.index(name)]


class ScaleSums(GroupSums):
    NAMES = ("n", "x", "y", "xx", "yy", "xy")
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {"sums": (GROUPS, len(NAMES))}

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
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {"sums": (GROUPS, len(NAMES))}


class ShapeSums(SumsAccumulator):
    """Per-response (cluster) sums of three token means, and two counts; one flat float64 array, merged by addition.

    For a statistic with per-response token count n_r and sum S_r, ``CLUSTER`` keeps sum n_r, sum S_r, sum S_r^2,
    sum n_r S_r and sum n_r^2: the mean is sum S / sum n, and its standard error with responses as the independent
    units (tokens of one response are correlated) is sqrt(sum (S_r - mean n_r)^2) / sum n, expanded into those
    sums (float64; clipped at 0 against rounding).
    """

    STATISTICS = ("unlikely", "likely", "ratio")
    """d over tokens with trainer p < UNLIKELY; d over tokens with p >= LIKELY; capped IS ratio - 1, all tokens."""
    CLUSTER = ("n", "s", "ss", "ns", "nn")
    COUNTS = ("likely_up", "likely_down")
    """Likely tokens the rollout scores more than SHIFT_TOL above (d < -tol) and below (d > tol) the trainer."""
    SIZE = len(STATISTICS) * len(CLUSTER) + len(COUNTS)
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {"sums": (SIZE,)}

    def cluster(self, statistic: str) -> np.ndarray:
        at = self.STATISTICS.index(statistic) * len(self.CLUSTER)
        return self.sums[at : at + len(self.CLUSTER)]

    def count(self, name: str) -> float:
        return float(self.sums[len(self.STATISTICS) * len(self.CLUSTER) + self.COUNTS.index(name)])

    def mean(self, statistic: str) -> ClusterMean | None:
        """The statistic's token mean, standard error and effective number of responses; ``None`` without tokens
        (or with a non-finite sum: a NaN log-ratio)."""
        n, s, ss, ns, nn = (float(v) for v in self.cluster(statistic))
        if n <= 0 or nn <= 0 or not math.isfinite(s + ss + ns):
            return None
        mean = s / n
        variance = max(ss - 2.0 * mean * ns + mean * mean * nn, 0.0)
        return ClusterMean(mean, math.sqrt(variance) / n, n, n * n / nn)


@dataclass(frozen=True)
class ClusterMean:
    mean: float
    std_error: float
    tokens: float
    responses: float
    """Effective number of responses, (sum n_r)^2 / sum n_r^2 (Satterthwaite): fewer when a few long responses hold
    most tokens; its value less 1 is the degrees of freedom of the t test."""

    def z(self) -> float:
        """The mean in standard errors (0 for a mean of 0, +-inf for a nonzero mean without spread)."""
        if self.std_error > 0:
            return self.mean / self.std_error
        return 0.0 if self.mean == 0 else math.copysign(math.inf, self.mean)


def group_spread(values: list[float]) -> float:
    """Standard error of the mean of per-group values (their spread over sqrt(count)); inf for fewer than 4."""
    if len(values) < 4:
        return math.inf
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))
