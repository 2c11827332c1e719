"""Exact match: how many valid tokens' two float32 log-probs differ in any bit, in how many responses, by how many
ulps at most, and where the first differences sit. On every analyze (docs/json.md, ``exact``).

Deterministic and batch-invariant inference promises bitwise-equal log-probs; "kl near 0" cannot tell a dump that
keeps that promise from one that misses it by an ulp. Bits are compared as bit patterns: -0.0 and +0.0 differ
(though 0 ulps apart: the same number, ``rcdiag.core.formulas.ulp_distance``), as would two NaN payloads (the value
screen keeps NaN out of the valid tokens, so none reaches here), and masked tokens are never compared.

The per-row counts come from the token pass, which reads both values of every token anyway
(``rcdiag.metrics.token_passes.BitDifferences``; its cost: benchmarks/exact.py). This accumulator only adds them up and
keeps the earliest ``FIRST_RESPONSES`` differing responses in reading order: row numbers as read, skipped rows
included, the same whatever the chunk size, the order of steps within a chunk, the worker parts or the saved states
merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.io.base import RowNumbering
from rcdiag.metrics.base import Accumulator, Reduce
from rcdiag.metrics.batch import declared_states
from rcdiag.metrics.block import Block
from rcdiag.records.report import ExactMatch, FirstDifference
from rcdiag.runtime.fields import FieldError, integer
from rcdiag.sections.base import PlainSection, RunFacts

FIRST_RESPONSES = 5
"""How many differing responses ``first_difference`` names (the earliest in reading order); ``--sequences`` has
every response's."""


@dataclass(frozen=True)
class _Listed:
    """A ``top`` item: one differing response (``FirstDifference``), the earliest rows kept."""

    row: int
    position: int
    tokens_different: int
    max_ulp: int

    @property
    def key(self) -> int:
        return -self.row

    def shifted(self, offset: int) -> _Listed:
        return _Listed(self.row + offset, self.position, self.tokens_different, self.max_ulp)


class BitSums(Accumulator):
    """Responses and valid tokens compared, those whose bits differ, the responses holding one, the greatest ulp
    distance, and the earliest ``FIRST_RESPONSES`` differing responses (a ``top`` state keyed by the negated row)."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "rows": "sum",
        "tokens": "sum",
        "different": "sum",
        "responses": "sum",
        "max_ulp": "max",
        "first": "top",
    }
    OWNER: ClassVar[str | None] = "exact"
    ITEMS: ClassVar[dict[str, type]] = {"first": _Listed}
    COUNTED = Accumulator.COUNTED | {"different", "responses"}  # (max_ulp is -inf before a differing token)

    def capacity(self, name: str) -> int:
        return FIRST_RESPONSES

    def update(self, block: Block) -> None:
        found = block.sums.differences
        hit = np.flatnonzero(found.tokens)
        self.add(rows=float(block.n_rows), tokens=float(block.n_tokens))
        if not hit.size:
            return
        self.add(different=float(found.tokens.sum()), responses=float(hit.size), max_ulp=float(found.max_ulp.max()))
        assert block.rows is not None  # the engine gives whole-dump accumulators their rows
        rows = block.rows.rows[hit]
        for i in np.argsort(rows, kind="stable")[:FIRST_RESPONSES]:  # a block's rows may follow the steps' order
            at = hit[i]
            listed = _Listed(int(rows[i]), int(found.first[at]), int(found.tokens[at]), int(found.max_ulp[at]))
            self.offered("first", listed)

    def shifted(self, offset: int) -> BitSums:
        """A copy whose rows are numbered ``offset`` later (to merge into the state of the rows read before)."""
        out = BitSums()
        out.state = dict(self.state, first=self._empty("top", "first"))
        for item in self.state["first"].items():
            out.offered("first", item.shifted(offset))
        return out


class ExactState(RowNumbering):
    """The whole-dump accumulator (``rcdiag.engine.stream.WholeDump``) of the exact-match section: ``BitSums`` and the
    row count that shifts a later part's row numbers when parts merge."""

    KEY = "exact"

    def __init__(self) -> None:
        self.sums = BitSums()
        self.rows_read = 0
        self.part_rows: list[int] = []

    def update(self, block: Block) -> None:
        self.sums.update(block)

    def merge(self, other: ExactState) -> ExactState:
        """Fold in the state of rows read after this state's rows; returns ``self``."""
        self.sums.merge(other.sums.shifted(self.rows_read))
        self.rows_read += other.rows_read
        return self

    def signature(self) -> tuple:
        return (type(self).__name__,)

    def state_dict(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "sums": self.sums.state_dict()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ExactState:
        out = cls()
        if not isinstance(state, dict) or set(state) != {"rows_read", "sums"}:
            raise FieldError("exact must be a table of rows_read and sums")
        out.rows_read = integer(state["rows_read"], "exact.rows_read")
        out.sums.load_state_dict(state["sums"])
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        """What its saved state means: its accumulator's declared states and how many responses it lists."""
        return {"first_responses": FIRST_RESPONSES, "accumulators": declared_states(cls.KEY)}

    def record(self) -> ExactMatch:
        """The typed record of the finished state."""
        state = self.sums.state
        listed = state["first"].items()  # largest key first: the earliest row first
        return ExactMatch(
            responses_compared=int(state["rows"]),
            tokens_compared=int(state["tokens"]),
            tokens_different=int(state["different"]),
            responses_different=int(state["responses"]),
            max_ulp=int(state["max_ulp"]) if state["different"] else 0,
            first_difference=tuple(
                FirstDifference(item.row, item.position, item.tokens_different, item.max_ulp) for item in listed
            ),
        )


class ExactSection(PlainSection):
    """Exact match, on every analyze: its record in ``Report.sections["exact"]`` (the verdict's ``identical``)."""

    KEY: ClassVar[str] = ExactState.KEY
    STATE = ExactState

    def new_state(self) -> ExactState:
        return ExactState()

    def record(self, state: ExactState | None, run: RunFacts) -> ExactMatch | None:
        return None if state is None else state.record()
