"""Every row of every step, kept in dump order: micro-batching needs a whole step's rows at once (which rows share
a micro-batch depends on all of them), where the engine streams. Only the valid tokens are kept, with each row's
response length (its last valid position + 1, what verl's attention mask counts) and list width
(``MicroBatchRows``, the micro-batch section's state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rcdiag.engine.stream import step_pairs
from rcdiag.io.base import RowNumbering
from rcdiag.microbatch.plan import MicroBatchSettings
from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.fields import FieldError, checked, counts, integer, reals

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block
    from rcdiag.records.report import MicroBatchReport


@dataclass
class StepRows:
    """One step's rows: flat valid tokens and per-row counts, in dump order."""

    old: np.ndarray
    rollout: np.ndarray
    valid_lengths: np.ndarray
    response_lengths: np.ndarray
    widths: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.valid_lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.valid_lengths)


@dataclass
class _Parts:
    old: list[np.ndarray] = field(default_factory=list)
    rollout: list[np.ndarray] = field(default_factory=list)
    valid_lengths: list[np.ndarray] = field(default_factory=list)
    response_lengths: list[np.ndarray] = field(default_factory=list)
    widths: list[np.ndarray] = field(default_factory=list)

    def rows(self) -> StepRows:
        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        return StepRows(
            cat(self.old, np.float32),
            cat(self.rollout, np.float32),
            cat(self.valid_lengths, np.int64),
            cat(self.response_lengths, np.int64),
            cat(self.widths, np.int64),
        )


class MicroBatchRows(RowNumbering):
    """The micro-batch section's whole-dump accumulator (``rcdiag.engine.stream.WholeDump``): every screened row by
    step, in reading order, block by block (a block holds rows of one step, and each step's rows keep their order
    however the engine groups them). One process only: a step's split depends on all its rows in order."""

    KEY = "microbatch"
    COLUMNS = ("old", "rollout", "valid_lengths", "response_lengths", "widths")
    """What a step keeps (``StepRows``' fields), in a saved state."""

    def __init__(self, settings: MicroBatchSettings) -> None:
        self.settings = settings
        self._steps: dict[int | None, _Parts] = {}
        self.rows_read = 0
        self.part_rows: list[int] = []
        self.simulated: MicroBatchReport | None = None
        """The simulation of these rows, once made (``rcdiag.microbatch.section``: its record and findings read it)."""

    def update(self, block: Block) -> None:
        assert block.rows is not None  # the engine gives whole-dump accumulators their rows
        old, rollout, mask, widths = block.raw
        offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        n = widths.shape[0]
        if mask is None:
            valid, response = widths, widths
        else:
            mask = np.asarray(mask, dtype=bool)
            positions = np.flatnonzero(mask)
            row_of = np.searchsorted(offsets, positions, side="right") - 1
            valid = np.bincount(row_of, minlength=n).astype(np.int64)
            response = np.zeros(n, np.int64)
            np.maximum.at(response, row_of, positions - offsets[row_of] + 1)
            old, rollout = old[mask], rollout[mask]
        parts = self._steps.setdefault(block.rows.step, _Parts())
        parts.old.append(np.asarray(old))
        parts.rollout.append(np.asarray(rollout))
        parts.valid_lengths.append(valid)
        parts.response_lengths.append(response)
        parts.widths.append(widths)

    def merge(self, other: MicroBatchRows) -> MicroBatchRows:
        """Fold in the rows read after this state's (each step's rows after this one's)."""
        if self.signature() != other.signature():
            raise ValueError("cannot merge micro-batch rows split under other settings")
        for step, theirs in other._steps.items():
            mine = self._steps.setdefault(step, _Parts())
            for name in self.COLUMNS:
                getattr(mine, name).extend(getattr(theirs, name))
        self.rows_read += other.rows_read
        return self

    def signature(self) -> tuple:
        return (type(self).__name__, self.settings)

    def steps(self) -> dict[int | None, StepRows]:
        """Each step's rows, steps ascending (``None``: a dump without steps)."""
        keys = sorted(self._steps, key=lambda k: (k is None, k or 0))
        return {key: self._steps[key].rows() for key in keys}

    def state_dict(self) -> dict[str, Any]:
        steps = [
            [step, {name: getattr(rows, name).tolist() for name in self.COLUMNS}] for step, rows in self.steps().items()
        ]
        return {"settings": self.settings.to_dict(), "rows_read": self.rows_read, "steps": steps}

    @classmethod
    def from_state_dict(cls, state: Any) -> MicroBatchRows:
        saved = checked(state, dict[str, Any], "microbatch")
        if set(saved) != {"settings", "rows_read", "steps"}:
            raise FieldError("microbatch must be a table of settings, rows_read and steps")
        try:
            out = cls(MicroBatchSettings(**checked(saved["settings"], dict[str, Any], "microbatch.settings")))
        except (ConfigError, TypeError) as exc:
            raise FieldError(f"microbatch.settings: {exc}") from None
        out.rows_read = integer(saved["rows_read"], "microbatch.rows_read")
        for step, table in step_pairs(saved["steps"], "microbatch.steps"):
            columns = checked(table, dict[str, list[Any]], "microbatch.steps")
            if set(columns) != set(cls.COLUMNS):
                raise FieldError(f"microbatch.steps must hold {', '.join(cls.COLUMNS)}")
            parts = out._steps.setdefault(step, _Parts())
            parts.old.append(reals(columns["old"], "microbatch.steps.old").astype(np.float32))
            parts.rollout.append(reals(columns["rollout"], "microbatch.steps.rollout").astype(np.float32))
            for name in cls.COLUMNS[2:]:
                getattr(parts, name).append(counts(columns[name], f"microbatch.steps.{name}").astype(np.int64))
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        return {"columns": list(cls.COLUMNS)}


def _gather(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The concatenated values of ``rows`` (each ``values[starts[r]:starts[r] + lengths[r]]``)."""
    if len(rows) == len(starts) and (len(rows) == 0 or (rows == np.arange(len(rows))).all()):
        return np.asarray(values[: int(starts[-1] + lengths[-1])] if len(rows) else values[:0])
    if len(rows) == 0:
        return values[:0]
    return np.concatenate([values[int(starts[r]) : int(starts[r] + lengths[r])] for r in rows])


def take(
    rows: StepRows, indices: list[int], keep: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(old, rollout, per-row lengths) of some rows of a step; with ``keep`` (a bool per valid token), only the
    kept tokens."""
    offsets = rows.offsets
    picks = [np.arange(offsets[i], offsets[i + 1]) for i in indices]
    index = np.concatenate(picks) if picks else np.zeros(0, np.int64)
    lengths = rows.valid_lengths[indices] if indices else np.zeros(0, np.int64)
    if keep is not None:
        kept = keep[index]
        lengths = np.array([int(keep[p].sum()) for p in picks], dtype=np.int64)
        index = index[kept]
    return rows.old[index], rows.rollout[index], lengths
