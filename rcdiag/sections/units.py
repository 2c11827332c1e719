"""Per-response sums of the headline token statistics: the units ``compare``'s significance tests resample.

A token-weighted metric (kl, k3_kl, chi2_token, mean |log-ratio|) is a ratio of sums over valid tokens; its
sampling unit is the response, not the token (a response's tokens share a prompt and a history). Keeping each
response's token count and sums lets ``rcdiag.compare.paired`` resample responses and recompute every metric
exactly as the report defines it. 40 bytes per response (five float64), in reading order.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.keys import Key
from rcdiag.core import formulas
from rcdiag.io.base import RowNumbering
from rcdiag.metrics.block import Block
from rcdiag.runtime.fields import FieldError
from rcdiag.sections.base import PlainSection, RunFacts

COLUMNS = ("tokens", "neg_lr", "k3", "chi2", "abs_lr")
"""Per response: valid tokens, and the sums of -log-ratio (kl), k3, chi2's ``ratio^2 - 1`` and |log-ratio|."""
METRIC_COLUMNS = {Key.KL: "neg_lr", Key.K3_KL: "k3", Key.CHI2_TOKEN: "chi2", Key.ABS_LOG_RATIO_MEAN: "abs_lr"}
"""Each tested metric (full key) and the per-response sum whose token mean it is."""


def response_terms(block: Block) -> np.ndarray:
    """One row per response of the block (empty responses included, with 0 tokens): ``COLUMNS``, float64."""
    old, rollout = block.b.to_numpy(block.old), block.b.to_numpy(block.rollout)
    counts = block.b.to_numpy(block.row_len).astype(np.int64)
    which = np.repeat(np.arange(counts.size), counts)
    d32 = old - rollout  # float32, as the report's token pass forms it
    d = d32.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        k3 = formulas.k3(np.expm1(d), d)
        chi2 = formulas.chi2_term(np.expm1(formulas.clamp_log_ratio(np, d)))
    sums = np.zeros((counts.size, len(COLUMNS)))
    sums[:, 0] = counts
    row_old = np.bincount(which, weights=old.astype(np.float64), minlength=counts.size)
    row_rollout = np.bincount(which, weights=rollout.astype(np.float64), minlength=counts.size)
    sums[:, 1] = row_rollout - row_old
    sums[:, 2] = np.bincount(which, weights=k3, minlength=counts.size)
    sums[:, 3] = np.bincount(which, weights=chi2, minlength=counts.size)
    sums[:, 4] = np.bincount(which, weights=np.abs(d), minlength=counts.size)
    return sums


class ResponseUnits(RowNumbering):
    """A whole-dump accumulator (``rcdiag.engine.stream.WholeDump``) of ``response_terms``, block by block, merged in
    reading order (a later part's responses after this one's)."""

    KEY = "units"

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []
        self.rows_read = 0
        self.part_rows: list[int] = []

    def update(self, block: Block) -> None:
        self.blocks.append(response_terms(block))

    def merge(self, other: ResponseUnits) -> ResponseUnits:
        self.blocks.extend(other.blocks)
        self.rows_read += other.rows_read
        return self

    def signature(self) -> tuple:
        return (type(self).__name__,)

    def table(self) -> np.ndarray:
        """Every response's row (``COLUMNS``), in reading order."""
        if not self.blocks:
            return np.zeros((0, len(COLUMNS)))
        if len(self.blocks) > 1:
            self.blocks = [np.concatenate(self.blocks)]
        return self.blocks[0]

    def state_dict(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "table": self.table().tolist()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ResponseUnits:
        out = cls()
        if not isinstance(state, dict) or set(state) != {"rows_read", "table"}:
            raise FieldError("units must be a table of rows_read and table")
        table = np.asarray(state["table"], dtype=np.float64)
        if table.size and (table.ndim != 2 or table.shape[1] != len(COLUMNS)):
            raise FieldError(f"units.table must have {len(COLUMNS)} columns ({', '.join(COLUMNS)})")
        rows = state["rows_read"]
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise FieldError("units.rows_read must be a count")
        out.rows_read = rows
        out.blocks = [table.reshape(-1, len(COLUMNS))] if table.size else []
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        return {"columns": list(COLUMNS)}


class UnitsRecord:
    """The per-response table a report keeps for ``compare`` (its JSON says only how many responses it holds)."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def column(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, sums) per response for one tested metric (full key)."""
        return self.table[:, 0], self.table[:, COLUMNS.index(METRIC_COLUMNS[metric])]

    def to_dict(self) -> dict[str, Any]:
        return {"responses": int(self.table.shape[0]), "tokens": int(self.table[:, 0].sum())}


class UnitsSection(PlainSection):
    """Keeps each response's sums (``compare`` asks for it; an analyze without it keeps nothing per response)."""

    KEY: ClassVar[str] = ResponseUnits.KEY
    STATE = ResponseUnits

    def new_state(self) -> ResponseUnits:
        return ResponseUnits()

    def record(self, state: ResponseUnits | None, run: RunFacts) -> UnitsRecord | None:
        return None if state is None else UnitsRecord(state.table())
