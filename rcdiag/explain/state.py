"""The mergeable state of ``analyze --explain``: breakdowns, worst responses and the detectors' sums.

One ``ExplainState`` covers the whole dump (not one per step). It sees every block the engine folds in, with
its rows' list lengths and mask (which place each valid token in its response) and each row's number in
reading order. Merging treats the other state's rows as following this one's (worker parts and shard states
merge in reading order), so row numbers stay global.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcdiag.engine.stream import number_rows
from rcdiag.explain.breakdowns import Breakdowns
from rcdiag.explain.by_token import DENSE_IDS, NO_TOKENS, TokenSums
from rcdiag.explain.by_token import SUMS as TOKEN_SUMS
from rcdiag.explain.detector_state import PartsState, fold_block, sums_layout
from rcdiag.explain.statistics import OffsetSums, ScaleSums, ShapeSums
from rcdiag.explain.worst import DEFAULT_WORST, PLOTTED, TEXT_TOKENS, TRACE_POINTS, WorstResponses
from rcdiag.metrics.batch import declared_states
from rcdiag.metrics.block import Block, RowContext
from rcdiag.records.report import ExplainBreakdowns
from rcdiag.runtime.fields import checked, integer

__all__ = ["ExplainState", "RowContext", "explain_layout", "number_rows"]


def explain_layout() -> dict[str, Any]:
    """What the state's arrays mean (bucket edges, sums, groups, statistics, and the kernel's series cut-off and
    row-group hash), for the one state layout hash (``rcdiag.engine.state_files.state_layout``): a state file written
    under another layout is refused rather than merged into numbers that mean something else."""
    return {
        **sums_layout(),
        "worst": {"plotted": PLOTTED, "trace_points": TRACE_POINTS, "text_tokens": TEXT_TOKENS},
        "tokens": {"sums": list(TOKEN_SUMS), "dense_ids": DENSE_IDS},
        "accumulators": declared_states("explain"),
    }


class ExplainState(PartsState):
    """Everything ``--explain`` accumulates: a whole-dump accumulator (``rcdiag.engine.stream.WholeDump``) made of
    accumulators of ``rcdiag.metrics.base`` (``PARTS``), fed by the engine block by block (``Block.rows`` carries
    the rows' numbers, lengths, ids and token ids)."""

    KEY = "explain"
    """Where an engine state holds it (``EngineState.extras``) and a state file saves it."""
    PARTS = ("breakdowns", "worst", "scale", "offset", "shape", "tokens")

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

    @property
    def position_sums(self) -> np.ndarray:
        """(GROUPS, N_DOUBLING, len(SUMS)) position sums per hash group (what ``position_drift`` reads)."""
        return self.breakdowns.position_sums

    def signature(self) -> tuple:
        return (type(self).__name__, self.worst.n)

    def update(self, block: Block) -> None:
        """Fold in a block of whole rows (``block.rows`` given)."""
        self._fold_sums(block)
        self.worst.update(block)
        for observer in self.observers:
            observer(block, block.rows)

    def _fold_sums(self, block: Block) -> None:
        """The breakdowns', the detectors' and the by-token sums, in one fused pass over the block (``fold_block``)."""
        from rcdiag.kernels.arrays import id_array

        raw_tokens = None if block.rows is None else block.rows.tokens
        tokens = NO_TOKENS if raw_tokens is None else id_array(raw_tokens)
        table = self.tokens.dense if raw_tokens is None else self.tokens.pass_table()
        beyond = fold_block(
            block, self.breakdowns.position, self.scale.sums, self.offset.sums, self.shape.sums,
            prob=self.breakdowns.prob, length=self.breakdowns.length, tokens=tokens, table=table,
        )  # fmt: skip
        if beyond:  # ids beyond the dense table as it was: it grows (the first blocks), or the sparse table
            mask = block.raw[2]
            self.tokens.add_left(block, tokens, mask, table.shape[0])

    def merge(self, other: ExplainState) -> ExplainState:
        """Fold in the state of rows read after this state's rows; returns ``self``."""
        if other.worst.n != self.worst.n:
            raise ValueError(f"cannot merge a worst-{other.worst.n} list into a worst-{self.worst.n} list")
        for name, part in self.parts().items():
            theirs = getattr(other, name)
            part.merge(theirs.shifted(self.rows_read) if name == "worst" else theirs)
        self.rows_read += other.rows_read
        return self

    def compute(self) -> ExplainBreakdowns:
        """The report's breakdowns, without the by-token table (the report reads the worst list, the token table
        and the detectors' sums from the parts)."""
        return self.breakdowns.compute()

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ExplainState:
        saved = checked(state, dict[str, Any], "explain")
        worst = checked(saved.get("worst"), dict[str, Any], "explain.worst")
        entries = checked(worst.get("entries"), dict[str, Any], "explain.worst.entries")
        out = cls(integer(entries.get("n"), "explain.worst.entries.n"))
        out.load_state_dict(state)
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        """What its saved state means: its parts' declared states and the constants they depend on."""
        return explain_layout()
