"""The distribution of the per-token log-ratio ``log pi_train - log pi_rollout``, as mergeable bin counts.

Mismatch spans many orders of magnitude (1e-5 for bf16 noise, 20+ for a broken token), so the bins are
logarithmic in |log-ratio| on each side of zero: ``PER_DECADE`` bins per decade from ``TINY`` to ``HUGE``, one
bin for |log-ratio| below ``TINY`` (identical log-probs land there) and two open bins beyond ``±HUGE``. The edges
are fixed, so counts of chunks, files, workers and steps simply add, and a report is drawn from a few dozen
numbers whatever the dump's size. Edges are float32 numbers, so numpy (float64 comparisons) and torch (float32)
put every float32 log-ratio in the same bin.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from rcdiag.core.bins import EDGES, HUGE_DECADE, PER_DECADE, TINY_DECADE  # noqa: F401 (the edges' layout, named here too)
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash
from rcdiag.metrics.block import Block


class LogRatioHistogram(Accumulator):
    """Counts of valid tokens per log-ratio bin (``len(EDGES) + 1`` bins) and of NaN log-ratios (both sides
    ``-inf``), which no bin holds. Reports no metric: ``rcdiag.records.report.Histogram`` carries it to the
    renderers."""

    STATES: ClassVar[dict[str, Reduce]] = {"counts": "counts", "nan": "sum"}
    BINS: ClassVar[int] = EDGES.shape[0] + 1

    def update(self, block: Block) -> None:
        self.add(counts=block.sums.log_ratio_counts, nan=block.sums.nan)

    def keys(self) -> list[str]:
        return []

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        return {}, []

    @property
    def counts(self) -> np.ndarray:
        return self.state["counts"]
