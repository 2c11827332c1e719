"""The mergeable state of ``analyze --explain``: breakdowns, worst responses and the detectors' sums.

One ``ExplainState`` covers the whole dump (not one per step). It sees every block the engine folds in, with
its rows' list lengths and mask (which place each valid token in its response) and each row's number in
reading order. Merging treats the other state's rows as following this one's (worker parts and shard states
merge in reading order), so row numbers stay global.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import ConfigError
from rcdiag.explain.breakdowns import DOUBLING_EDGES, GROUPS, LOG_PROB_THRESHOLDS, PROB_EDGES, SUMS, Breakdowns
from rcdiag.explain.statistics import LIKELY, RATIO_CAP, SHIFT_TOL, UNLIKELY, OffsetSums, ScaleSums, ShapeSums
from rcdiag.explain.tokens import DENSE_IDS, NO_TOKENS, TokenSums
from rcdiag.explain.tokens import SUMS as TOKEN_SUMS
from rcdiag.explain.worst import DEFAULT_WORST, PLOTTED, TEXT_TOKENS, TRACE_POINTS, WorstResponses
from rcdiag.fields import integer
from rcdiag.io.base import Chunk
from rcdiag.metrics.block import Block


@dataclass(frozen=True)
class ExplainOptions:
    """What ``--explain`` computes beyond its defaults: the worst-list size and the per-response file."""

    worst: int = DEFAULT_WORST
    sequences: str | Path | None = None

    def __post_init__(self) -> None:
        if isinstance(self.worst, bool) or not isinstance(self.worst, int) or self.worst < 0:
            raise ConfigError(f"worst must be 0 or more responses, got {self.worst}.")

    @classmethod
    def of(cls, explain: bool, worst: int, sequences: str | Path | None) -> ExplainOptions | None:
        """The options, or ``None`` when explain is off (a non-default ``worst`` or a ``sequences`` file turn it
        on)."""
        if not explain and worst == DEFAULT_WORST and sequences is None:
            return None
        return cls(worst, sequences)


@dataclass(frozen=True)
class RowContext:
    """What the engine knows about a block's rows beyond the block itself."""

    lengths: np.ndarray
    """List length of each row (padding included)."""
    mask: np.ndarray | None
    """The rows' boolean mask over all their positions (``None``: every position valid)."""
    rows: np.ndarray
    ids: np.ndarray | None
    step: int | None
    tokens: np.ndarray | None = None
    """The rows' token ids over all their positions, like ``mask`` (``None``: the dump has none, or not read)."""


_NO_MASK = np.zeros(0, dtype=np.uint8)
_EDGES = np.asarray(DOUBLING_EDGES, dtype=np.int64)
_LOG_UNLIKELY = float(LOG_PROB_THRESHOLDS[PROB_EDGES.index(UNLIKELY) - 1])
_LOG_LIKELY = float(LOG_PROB_THRESHOLDS[PROB_EDGES.index(LIKELY) - 1])
"""The float32 thresholds on old_log_prob of ``ShapeSums``: x >= t exactly when exp(x) >= the probability edge."""


def explain_layout() -> dict[str, Any]:
    """What the state's arrays mean (bucket edges, sums, groups, statistics, and the kernel's series cut-off and
    row-group hash), for the one state layout hash (``rcdiag.state.state_layout``): a state file written under
    another layout is refused rather than merged into numbers that mean something else."""
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
        "worst": {"plotted": PLOTTED, "trace_points": TRACE_POINTS, "text_tokens": TEXT_TOKENS},
        "tokens": {"sums": list(TOKEN_SUMS), "dense_ids": DENSE_IDS},
        "kernel": explain_encoding.layout(),
    }


class ExplainState:
    """Everything ``--explain`` accumulates."""

    def __init__(self, worst: int = DEFAULT_WORST) -> None:
        self.breakdowns = Breakdowns()
        self.worst = WorstResponses(worst)
        self.scale = ScaleSums()
        self.offset = OffsetSums()
        self.shape = ShapeSums()
        self.tokens = TokenSums()
        self.rows_read = 0
        """Rows numbered so far in reading order, skipped rows included (the next row's number)."""
        self.observers: list[Any] = []
        """Per-row consumers (the ``--sequences`` writer); not part of the state."""
        self.part_rows: list[int] = []
        """Rows read by each worker part, in order (``--workers``; for the ``--sequences`` row numbers)."""

    def update(self, block: Block, context: RowContext) -> None:
        """Fold in a block (numpy backend) of whole rows."""
        self._fold_sums(block, context)
        self.worst.update(block, context)
        for observer in self.observers:
            observer(block, context)

    def _fold_sums(self, block: Block, context: RowContext) -> None:
        """The breakdowns', the detectors' and the by-token sums, in one fused pass over the block
        (``rcdiag.kernels.explain``)."""
        from rcdiag.kernels.explain import explain_block
        from rcdiag.kernels.token_ids import id_array

        old, rollout, mask, lengths = block.raw  # the raw rows: the fused pass drops the padding row by row
        tokens = NO_TOKENS if context.tokens is None else id_array(context.tokens)
        table = self.tokens.dense if context.tokens is None else self.tokens.pass_table()
        beyond = explain_block(
            np.ascontiguousarray(old, dtype=np.float32),
            np.ascontiguousarray(rollout, dtype=np.float32),
            block.row_len.astype(np.int64),
            np.asarray(lengths, dtype=np.int64),
            _NO_MASK if mask is None else mask.view(np.uint8),
            _EDGES,
            LOG_PROB_THRESHOLDS,
            RATIO_CAP,
            SHIFT_TOL,
            self.breakdowns.prob,
            self.breakdowns.position,
            self.breakdowns.length,
            self.scale.sums,
            self.offset.sums,
            _LOG_UNLIKELY,
            _LOG_LIKELY,
            self.shape.sums,
            tokens,
            table,
        )
        if beyond:  # ids beyond the dense table as it was: it grows (the first blocks), or the sparse table
            self.tokens.add_left(block, tokens, mask, table.shape[0])

    def number(self, chunk: Chunk) -> Chunk:
        """Give a chunk's rows their numbers in reading order (before any can be skipped)."""
        chunk.rows = np.arange(self.rows_read, self.rows_read + chunk.n_rows, dtype=np.int64)
        self.rows_read += chunk.n_rows
        return chunk

    def merge(self, other: ExplainState) -> ExplainState:
        """Fold in the state of rows read after this state's rows; returns ``self``."""
        if other.worst.n != self.worst.n:
            raise ValueError(f"cannot merge a worst-{other.worst.n} list into a worst-{self.worst.n} list")
        self.breakdowns.merge(other.breakdowns)
        self.scale.merge(other.scale)
        self.offset.merge(other.offset)
        self.shape.merge(other.shape)
        self.tokens.merge(other.tokens)
        self.worst.merge(other.worst, row_offset=self.rows_read)
        self.rows_read += other.rows_read
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "rows_read": self.rows_read,
            "breakdowns": self.breakdowns.state_dict(),
            "worst": self.worst.state_dict(),
            "scale": self.scale.state_dict(),
            "offset": self.offset.state_dict(),
            "shape": self.shape.state_dict(),
            "tokens": self.tokens.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ExplainState:
        out = cls(integer(state["worst"]["n"], "explain.worst.n"))
        out.rows_read = integer(state["rows_read"], "explain.rows_read")
        out.breakdowns.load_state_dict(state["breakdowns"])
        out.worst.load_state_dict(state["worst"])
        out.scale.load_state_dict(state["scale"])
        out.offset.load_state_dict(state["offset"])
        out.shape.load_state_dict(state["shape"])
        out.tokens.load_state_dict(state["tokens"])
        return out


def number_rows(chunks: Iterable[Chunk], state: ExplainState | None) -> Iterator[Chunk]:
    """Number rows in reading order as they are read (a no-op without ``--explain``)."""
    if state is None:
        yield from chunks
        return
    for chunk in chunks:
        yield state.number(chunk)
