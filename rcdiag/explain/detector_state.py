"""The bias detectors' sums, the state every analyze keeps (``rcdiag.explain.detector_section``): the position sums
per hash group, the scale and offset sums per group and the shape sums (``rcdiag.explain.statistics``), and nothing
else of ``--explain``'s (no probability or length breakdown, no worst list, no by-token table).

They are taken by the explain pass itself (``rcdiag.kernels.explain``, or its numpy form on a small dump) with the
breakdowns left out: the same code adds the same numbers as under ``--explain``, so the detectors find the same
with and without it (tests/findings/test_default_detectors.py). ``fold_block`` is that one call, for both states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from rcdiag.explain.breakdowns import DOUBLING_EDGES, GROUPS, LOG_PROB_THRESHOLDS, N_DOUBLING, PROB_EDGES, SUMS
from rcdiag.explain.by_token import NO_TOKENS
from rcdiag.explain.statistics import (
    LIKELY,
    RATIO_CAP,
    SHIFT_TOL,
    UNLIKELY,
    OffsetSums,
    ScaleSums,
    ShapeSums,
    SumsAccumulator,
)
from rcdiag.io.base import RowNumbering
from rcdiag.metrics.base import Accumulator
from rcdiag.metrics.batch import declared_states
from rcdiag.metrics.block import Block
from rcdiag.runtime.fields import FieldError, integer, shown

_NO_MASK = np.zeros(0, dtype=np.uint8)
_NO_BREAKDOWN = np.zeros((0, len(SUMS)))
"""An empty ``prob`` and ``length``: the pass then takes the detectors' sums alone."""
_NO_TABLE = np.zeros((0, 6))
_EDGES = np.asarray(DOUBLING_EDGES, dtype=np.int64)
_LOG_UNLIKELY = float(LOG_PROB_THRESHOLDS[PROB_EDGES.index(UNLIKELY) - 1])
_LOG_LIKELY = float(LOG_PROB_THRESHOLDS[PROB_EDGES.index(LIKELY) - 1])
"""The float32 thresholds on old_log_prob of ``ShapeSums``: x >= t exactly when exp(x) >= the probability edge."""


def fold_block(
    block: Block,
    position: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    shape: np.ndarray,
    *,
    prob: np.ndarray = _NO_BREAKDOWN,
    length: np.ndarray = _NO_BREAKDOWN,
    tokens: np.ndarray = NO_TOKENS,
    table: np.ndarray = _NO_TABLE,
) -> int:
    """Add one block to the sums (in place) by the explain pass (``rcdiag.kernels.explain``; on a small dump's numpy
    path its numpy form, ``rcdiag.kernels.small_explain``); ``prob`` and ``length`` given: the breakdowns too,
    ``tokens`` (the block's raw ids) and ``table``: the by-token sums. Returns the valid tokens whose id lies beyond
    ``table`` (left to the caller)."""
    explain_block: Callable[..., int]
    if block.b.compiled:
        from rcdiag.kernels import explain

        explain_block = explain.explain_block
    else:
        from rcdiag.kernels import small_explain

        explain_block = small_explain.explain_block
    old, rollout, mask, lengths = block.raw  # the raw rows: the pass drops the padding row by row
    row_len = block.row_len if isinstance(block.row_len, np.ndarray) else block.b.to_numpy(block.row_len)
    return int(
        explain_block(
            np.ascontiguousarray(old, dtype=np.float32),
            np.ascontiguousarray(rollout, dtype=np.float32),
            row_len.astype(np.int64),
            np.asarray(lengths, dtype=np.int64),
            _NO_MASK if mask is None else np.asarray(mask).view(np.uint8),
            _EDGES,
            LOG_PROB_THRESHOLDS,
            RATIO_CAP,
            SHIFT_TOL,
            prob,
            position,
            length,
            scale,
            offset,
            _LOG_UNLIKELY,
            _LOG_LIKELY,
            shape,
            tokens,
            table,
        )
    )


def sums_layout() -> dict[str, Any]:
    """What the detectors' sums mean (for the state layout hash, ``rcdiag.engine.state_files.state_layout``): the sums
    per bucket, the groups and their hash, the position edges, the statistics' names and thresholds and the kernel's
    constants. ``--explain``'s layout holds the same (``rcdiag.explain.state.explain_layout``)."""
    from rcdiag.kernels import explain_encoding

    return {
        "sums": list(SUMS),
        "groups": GROUPS,
        "doubling_edges": list(DOUBLING_EDGES),
        "prob_edges": list(PROB_EDGES),
        "log_prob_thresholds": LOG_PROB_THRESHOLDS.tolist(),
        "scale": list(ScaleSums.NAMES),
        "offset": list(OffsetSums.NAMES),
        "ratio_cap": RATIO_CAP,
        "shift_tol": SHIFT_TOL,
        "shape": {
            "statistics": list(ShapeSums.STATISTICS),
            "cluster": list(ShapeSums.CLUSTER),
            "counts": list(ShapeSums.COUNTS),
            "unlikely": UNLIKELY,
            "likely": LIKELY,
        },
        "kernel": explain_encoding.layout(),
    }


class PositionSums(SumsAccumulator):
    """The position buckets' sums (``SUMS``) per hash group, as ``--explain``'s ``Breakdowns.position``."""

    OWNER: ClassVar[str | None] = "detectors"
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {"sums": (GROUPS, N_DOUBLING, len(SUMS))}


class PartsState(RowNumbering):
    """A whole-dump accumulator made of accumulators (its ``PARTS``, attributes of those names): rows numbered in
    reading order, and a saved state of ``rows_read`` and each part's, checked against their declarations."""

    KEY: str
    PARTS: tuple[str, ...]
    rows_read: int

    def parts(self) -> dict[str, Accumulator]:
        return {name: getattr(self, name) for name in self.PARTS}

    def state_dict(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, **{name: part.state_dict() for name, part in self.parts().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state with a saved one, every part checked against its declared states."""
        if not isinstance(state, dict) or set(state) != {"rows_read", *self.PARTS}:
            raise FieldError(f"{self.KEY} must be a table of rows_read, {', '.join(self.PARTS)}, got {shown(state)}")
        self.rows_read = integer(state["rows_read"], f"{self.KEY}.rows_read")
        for name, part in self.parts().items():
            part.load_state_dict(state[name])


class DetectorState(PartsState):
    """The detectors' sums of the whole dump: a whole-dump accumulator (``rcdiag.engine.stream.WholeDump``) of four
    accumulators (``PARTS``), fed by the engine block by block. It reads no row's number, id or token id; it numbers
    rows only as every whole-dump accumulator does (``number``), so that it can ride beside others."""

    KEY = "detectors"
    """Where an engine state holds it and a state file saves it."""
    PARTS = ("position", "scale", "offset", "shape")

    def __init__(self) -> None:
        self.position = PositionSums()
        self.scale = ScaleSums()
        self.offset = OffsetSums()
        self.shape = ShapeSums()
        self.rows_read = 0
        self.part_rows: list[int] = []

    @property
    def position_sums(self) -> np.ndarray:
        """(GROUPS, N_DOUBLING, len(SUMS)) position sums per hash group (what ``position_drift`` reads)."""
        return self.position.sums

    def signature(self) -> tuple:
        return (type(self).__name__,)

    def update(self, block: Block) -> None:
        fold_block(block, self.position.sums, self.scale.sums, self.offset.sums, self.shape.sums)

    def merge(self, other: DetectorState) -> DetectorState:
        for name, part in self.parts().items():
            part.merge(getattr(other, name))
        self.rows_read += other.rows_read
        return self

    def compute(self) -> dict[str, Any]:
        """Nothing of its own (the detectors read the parts: ``rcdiag.explain.detectors``)."""
        return {}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DetectorState:
        out = cls()
        out.load_state_dict(state)
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        """What its saved state means: its parts' declared states and the constants they depend on."""
        parts = [f"{type(part).__module__}.{type(part).__qualname__}" for part in cls().parts().values()]
        declared = dict(declared_states("detectors") + declared_states("explain"))
        return {**sums_layout(), "parts": {name: declared[name] for name in parts}}
