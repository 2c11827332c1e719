"""What the recommendations need, collected in the sweep's own pass: per option, the statistic that decides
rejection (docs/sweep.md#recommendations). Mergeable, pooled over steps, saved in state files.

* per response (``seq_*`` options, sequence IS, and each response's worst token for token options): every value,
  exactly (a few bytes per response);
* per token (``token_*`` options, token IS): a histogram over the float32 value with 256 buckets per power of two
  (bucket width 0.39%), exact at bucket edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcdiag.fields import FieldError, counts, integer, reals, shown
from rcdiag.kernels.sweep_encoding import BUCKETS, HISTOGRAM, HISTOGRAM_CLAMPED, SHIFT
from rcdiag.metrics.block import Block
from rcdiag.metrics.rejection import row_statistic
from rcdiag.sweep.cells import TokenScan
from rcdiag.sweep.grid import resolve


def bucket(values: np.ndarray, nonnegative: bool = False) -> np.ndarray:
    """Bucket index of non-negative float32 values (negative ones count as 0; NaN lands in the top buckets).
    ``nonnegative``: the values are known to be >= 0 or -0.0 (ratios, squares, absolute values): no clamp."""
    clamped = values if nonnegative else np.maximum(values, np.float32(0.0))
    # the bits below the sign, shifted: an arithmetic shift of the int32 view, then a mask (one pass fewer)
    index = clamped.view(np.int32) >> SHIFT
    index &= BUCKETS - 1
    return index


def edge(bucket: int) -> np.float32:
    """The smallest float32 in a bucket."""
    return np.uint32(bucket << SHIFT).view(np.float32)


@dataclass
class OptionCollector:
    """What one option's recommendation needs, mergeable."""

    option: str
    token_level: bool
    counts: np.ndarray | None = None
    """Token options: four interleaved copies of the histogram, one after another (int64), which each block's
    pass over the statistic counts into (``Cells.scan``: copies break the chain of consecutive tokens in one
    bucket); ``histogram`` adds them up."""
    rows: list[np.ndarray] = field(default_factory=list)
    """Per response: the statistic (token options: the row's worst token), float64."""
    lengths: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.token_level and self.counts is None:
            self.counts = np.zeros(4 * BUCKETS, dtype=np.int64)

    @property
    def histogram(self) -> np.ndarray | None:
        """Token options: valid tokens per bucket of the token statistic (NaN buckets at the top)."""
        return None if self.counts is None else self.counts.reshape(4, BUCKETS).sum(axis=0)

    def merge(self, other: OptionCollector) -> None:
        if self.counts is not None and other.counts is not None:
            self.counts += other.counts
        self.rows += other.rows
        self.lengths += other.lengths


class Collector:
    """Every option's collector; one for the whole dump (steps do not matter here)."""

    def __init__(self, options: list[str]) -> None:
        self.options = options
        self.collectors = {
            o: OptionCollector(o, token_level=o == "is_token" or o.startswith("token_")) for o in options
        }
        self.specs = {o: spec for o in options if (spec := resolve(o, "1.0").rs_option) is not None}
        """Each RS option (its threshold does not matter here), for the engine's per-row statistic."""
        self.histograms = {
            _statistic(o): (_mode(o), c.counts) for o, c in self.collectors.items() if c.counts is not None
        }
        """Per-token statistic -> how its histogram buckets it, and the counts the batch's pass (``Cells.scan``)
        adds to."""
        self.tokens = 0
        self.rows = 0
        self.valid_rows = 0

    def update(self, block: Block, scans: dict[str, TokenScan]) -> None:
        b = block.b
        self.tokens += block.n_tokens
        self.rows += block.n_rows
        self.valid_rows += block.n_valid_rows
        lengths = b.to_numpy(block.row_len)
        valid = lengths > 0
        for option, collector in self.collectors.items():
            if option == "is_sequence":
                value = b.to_numpy(block.seq_log_ratio).astype(np.float64)
                collector.rows.append(value)
                collector.lengths.append(lengths)
                continue
            if collector.token_level:  # its histogram: counted by the batch's pass over the statistic
                worst = self._worst_token(block, option, scans)
            else:
                worst = b.to_numpy(row_statistic(block, self.specs[option])).astype(np.float64)
                if option.endswith("k1"):
                    worst = np.abs(worst)
            collector.rows.append(worst[valid])
            collector.lengths.append(lengths[valid])

    @staticmethod
    def _worst_token(block: Block, option: str, scans: dict[str, TokenScan]) -> np.ndarray:
        """Each row's largest token statistic (|k1| for k1), from the per-row extremes of the batch's pass."""
        b = block.b
        if option == "is_token":
            return scans["ratio"].row_max.astype(np.float64)
        row_max, row_min = (b.to_numpy(r).astype(np.float64) for r in block.row_extremes_k(_estimator(option)))
        return np.maximum(np.abs(row_max), np.abs(row_min)) if option.endswith("k1") else row_max

    def merge(self, other: Collector) -> Collector:
        for option, collector in self.collectors.items():
            collector.merge(other.collectors[option])
        self.tokens += other.tokens
        self.rows += other.rows
        self.valid_rows += other.valid_rows
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": [self.tokens, self.rows, self.valid_rows],
            "options": {
                o: {
                    "histogram": None if c.histogram is None else _sparse(c.histogram),
                    "rows": np.concatenate(c.rows).tolist() if c.rows else [],
                    "lengths": np.concatenate(c.lengths).tolist() if c.lengths else [],
                }
                for o, c in self.collectors.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["counts"]
        if not isinstance(saved, list) or len(saved) != 3:
            raise FieldError(f"collector.counts must be [tokens, rows, valid_rows], got {shown(saved)}")
        self.tokens, self.rows, self.valid_rows = (integer(v, "collector.counts") for v in saved)
        for option, saved in state["options"].items():
            collector = self.collectors[option]
            hist = saved["histogram"]
            if collector.counts is not None:
                collector.counts[:] = 0
                if hist is not None:
                    collector.counts[:BUCKETS] = _dense(hist, f"collector {option} histogram")
            collector.rows = [reals(saved["rows"], f"collector {option} rows")]
            collector.lengths = [reals(saved["lengths"], f"collector {option} lengths", nonnegative=True)]
            if collector.rows[0].shape != collector.lengths[0].shape:
                raise FieldError(f"collector {option} rows and lengths must be as long as each other")


def _estimator(option: str) -> str:
    return option.rsplit("_", 1)[1]


def _statistic(option: str) -> str:
    """The per-token statistic of a token-level option."""
    return "ratio" if option == "is_token" else _estimator(option)


def _mode(option: str) -> int:
    """How its histogram buckets the statistic: k1 by its absolute value (the sign bit dropped), k3 clamped at 0
    (float32 may round it below 0), the ratio and k2 as they are (never below 0)."""
    return HISTOGRAM_CLAMPED if option.endswith("k3") else HISTOGRAM


def _sparse(histogram: np.ndarray) -> list[list[int]]:
    buckets = np.flatnonzero(histogram)
    return [buckets.tolist(), histogram[buckets].tolist()]


def _dense(sparse: list[list[int]], field: str) -> np.ndarray:
    if not isinstance(sparse, list) or len(sparse) != 2:
        raise FieldError(f"{field} must be [buckets, counts], got {shown(sparse)}")
    buckets, values = counts(sparse[0], f"{field} buckets"), counts(sparse[1], f"{field} counts")
    if buckets.shape != values.shape or (buckets.size and buckets.max() >= BUCKETS):
        raise FieldError(f"{field} must list as many counts as buckets, each bucket below {BUCKETS}")
    out = np.zeros(BUCKETS, dtype=np.int64)
    out[buckets] = values
    return out
