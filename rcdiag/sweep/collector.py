"""What the recommendations need, collected in the sweep's own pass: per option, the statistic that decides
rejection (docs/sweep.md#recommendations). Accumulators (``rcdiag.metrics.base``), pooled over steps, saved in
state files like every other.

* per response (``seq_*`` options, sequence IS, and each response's worst token for token options): every value,
  exactly (float32 where every value of a block is one, else float64: 4 or 8 bytes per response and option), and
  each response's length once for all options;
* per token (``token_*`` options, token IS): a histogram over the float32 value with 256 buckets per power of two
  (bucket width 0.39%), exact at bucket edges.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import numpy as np

from rcdiag.kernels.sweep_encoding import BUCKETS, HISTOGRAM, HISTOGRAM_CLAMPED, SHIFT
from rcdiag.metrics.base import Accumulator, Reduce
from rcdiag.metrics.batch import groups_state, load_groups, merge_groups
from rcdiag.metrics.block import Block
from rcdiag.metrics.rejection import row_statistic
from rcdiag.runtime.fields import FieldError
from rcdiag.sweep.cells import Passes
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


T = TypeVar("T", bound="TokenCollector")


class OptionCollector(Accumulator):
    """What one option's recommendation needs, mergeable: per response, the statistic (token options: the row's
    worst token); the responses' lengths are the collector's (``Totals``), kept once for every option."""

    STATES: ClassVar[dict[str, Reduce]] = {"statistic": "values"}
    token_level = False

    def __init__(self, option: str, passes: Passes) -> None:
        super().__init__()
        self.option = option
        self.passes = passes
        self.spec = resolve(option, "1.0").rs_option if option != "is_sequence" else None
        """An RS option (its threshold does not matter here), for the engine's per-row statistic."""

    def signature(self) -> tuple:
        return (type(self).__name__, self.option)

    @property
    def all_rows(self) -> bool:
        """Whether every response has a statistic (sequence IS), or only the valid ones (``row_len > 0``)."""
        return self.option == "is_sequence"

    @property
    def rows(self) -> list[np.ndarray]:
        """Per response: the statistic (in parts; float32 where that is exact, else float64)."""
        return self.state["statistic"]

    @property
    def histogram(self) -> np.ndarray | None:
        return None

    def update(self, block: Block) -> None:
        b = block.b
        if self.all_rows:
            self.add(statistic=_exact(b.to_numpy(block.seq_log_ratio)))
            return
        self.add(statistic=self._worst(block)[b.to_numpy(block.row_len) > 0])

    def _worst(self, block: Block) -> np.ndarray:
        assert self.spec is not None
        worst = _exact(block.b.to_numpy(row_statistic(block, self.spec)))
        return np.abs(worst) if self.option.endswith("k1") else worst


class TokenCollector(OptionCollector):
    """A token option's: also a histogram of the token statistic, which each block's pass over it (``Passes``)
    counts into four interleaved copies (``pending``: copies break the chain of consecutive tokens in one bucket),
    added up into the state when it is read."""

    STATES: ClassVar[dict[str, Reduce]] = {"histogram": "sparse", **OptionCollector.STATES}
    token_level = True

    def __init__(self, option: str, passes: Passes) -> None:
        super().__init__(option, passes)
        self.sizes["histogram"] = BUCKETS
        self.state["histogram"] = self._empty("sparse", "histogram")
        self.pending = np.zeros(4 * BUCKETS, dtype=np.int64)
        self._counted = False
        passes.histograms[_statistic(option)] = (_mode(option), self.pending)

    @property
    def histogram(self) -> np.ndarray:
        """Valid tokens per bucket of the token statistic (NaN buckets at the top)."""
        self._settle()
        return self.state["histogram"]

    def _settle(self) -> None:
        if self._counted:
            self.add(histogram=self.pending.reshape(4, BUCKETS).sum(axis=0))
            self.pending[:] = 0
            self._counted = False

    def update(self, block: Block) -> None:
        self.passes.scans(block)  # counts the block's tokens into ``pending``
        self._counted = True
        super().update(block)

    def _worst(self, block: Block) -> np.ndarray:
        """Each row's largest token statistic (|k1| for k1), from the per-row extremes of the pass."""
        if self.option == "is_token":
            return _exact(self.passes.scans(block)["ratio"].row_max)
        b = block.b
        assert self.spec is not None
        row_max, row_min = (_exact(b.to_numpy(r)) for r in block.row_extremes_k(self.spec.estimator))
        return np.maximum(np.abs(row_max), np.abs(row_min)) if self.option.endswith("k1") else row_max

    def merge(self: T, other: T) -> T:
        self._settle()
        other._settle()
        return super().merge(other)

    def state_dict(self) -> dict[str, Any]:
        self._settle()
        return super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending[:] = 0
        self._counted = False
        super().load_state_dict(state)


class Totals(Accumulator):
    """The tokens, rows and valid rows the recommendations' shares are of, and each response's length (the tokens
    a rejected response takes with it), in the order the options' statistics are."""

    STATES: ClassVar[dict[str, Reduce]] = {"tokens": "sum", "rows": "sum", "valid_rows": "sum", "lengths": "values"}

    def update(self, block: Block) -> None:
        lengths = block.b.to_numpy(block.row_len).astype(np.float64)
        self.add(tokens=block.n_tokens, rows=block.n_rows, valid_rows=block.n_valid_rows, lengths=lengths)


class Collector:
    """Every option's collector; one for the whole dump (steps do not matter here)."""

    def __init__(self, options: list[str], passes: Passes) -> None:
        self.options = options
        self.totals = Totals()
        self.collectors = {
            o: (TokenCollector if o == "is_token" or o.startswith("token_") else OptionCollector)(o, passes)
            for o in options
        }

    @property
    def tokens(self) -> int:
        return int(self.totals.state["tokens"])

    @property
    def rows(self) -> int:
        return int(self.totals.state["rows"])

    @property
    def valid_rows(self) -> int:
        return int(self.totals.state["valid_rows"])

    def lengths(self, option: str) -> np.ndarray:
        """The lengths of the responses ``option``'s statistic is of (float64), in its order."""
        parts = self.totals.state["lengths"]
        lengths = np.concatenate(parts) if parts else np.zeros(0)
        return lengths if self.collectors[option].all_rows else lengths[lengths > 0]

    def groups(self) -> list[Accumulator]:
        return [self.totals, *self.collectors.values()]

    def update(self, block: Block) -> None:
        for group in self.groups():
            group.update(block)

    def merge(self, other: Collector) -> Collector:
        merge_groups(self.groups(), other.groups())
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"groups": groups_state(self.groups())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_groups(self.groups(), state.get("groups") if isinstance(state, dict) else None)
        if sum(part.shape[0] for part in self.totals.state["lengths"]) != self.rows:
            raise FieldError("collector lengths must hold one length per response")
        for option, collector in self.collectors.items():
            if sum(part.shape[0] for part in collector.rows) != self.lengths(option).shape[0]:
                raise FieldError(f"collector {option} must hold a statistic for every response of the lengths")


def _exact(values: np.ndarray) -> np.ndarray:
    """Per-response values in half the memory where that loses nothing: float32 when every value is one (a float32
    statistic, or float32 values the kernels give as float64: a row's worst token), else float64."""
    if values.dtype == np.float32:
        return values
    values = values.astype(np.float64, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = values.astype(np.float32)
    return narrow if bool(((narrow == values) | np.isnan(values)).all()) else values


def _estimator(option: str) -> str:
    return option.rsplit("_", 1)[1]


def _statistic(option: str) -> str:
    """The per-token statistic of a token-level option."""
    return "ratio" if option == "is_token" else _estimator(option)


def _mode(option: str) -> int:
    """How its histogram buckets the statistic: k1 by its absolute value (the sign bit dropped), k3 clamped at 0
    (float32 may round it below 0), the ratio and k2 as they are (never below 0)."""
    return HISTOGRAM_CLAMPED if option.endswith("k3") else HISTOGRAM
