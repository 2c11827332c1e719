"""Every row of every step, kept in dump order: micro-batching needs a whole step's rows at once (which rows share
a micro-batch depends on all of them), where the engine streams. Only the valid tokens are kept, with each row's
response length (its last valid position + 1, what verl's attention mask counts) and list width.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from rcdiag.io.base import Chunk


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


class RowCollector:
    """Passes chunks through (``tee``) and keeps their rows by step."""

    def __init__(self) -> None:
        self._steps: dict[int | None, _Parts] = {}

    def tee(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        for chunk in chunks:
            self.add(chunk)
            yield chunk

    def add(self, chunk: Chunk) -> None:
        offsets = np.asarray(chunk.offsets, dtype=np.int64)
        widths = np.diff(offsets)
        n = widths.shape[0]
        mask = chunk.mask
        if mask is None:
            valid, response, old, rollout = widths, widths, chunk.old, chunk.rollout
            starts = offsets[:-1]
        else:
            mask = np.asarray(mask, dtype=bool)
            positions = np.flatnonzero(mask)
            row_of = np.searchsorted(offsets, positions, side="right") - 1
            valid = np.bincount(row_of, minlength=n).astype(np.int64)
            response = np.zeros(n, np.int64)
            np.maximum.at(response, row_of, positions - offsets[row_of] + 1)
            old, rollout = chunk.old[mask], chunk.rollout[mask]
            starts = np.concatenate([[0], np.cumsum(valid)[:-1]]).astype(np.int64)
        steps = chunk.steps
        keys = [None] if steps is None else list(dict.fromkeys(int(s) for s in steps))
        for key in keys:
            rows = np.arange(n) if key is None else np.flatnonzero(steps == key)
            parts = self._steps.setdefault(key, _Parts())
            parts.old.append(_gather(old, starts, valid, rows))
            parts.rollout.append(_gather(rollout, starts, valid, rows))
            parts.valid_lengths.append(valid[rows])
            parts.response_lengths.append(response[rows])
            parts.widths.append(widths[rows])

    def steps(self) -> dict[int | None, StepRows]:
        """Each step's rows, steps ascending (``None``: a dump without steps)."""
        keys = sorted(self._steps, key=lambda k: (k is None, k or 0))
        return {key: self._steps[key].rows() for key in keys}


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
