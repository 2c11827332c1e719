"""Whole rows picked out of a chunk's flat values: the one ragged gather (bad rows left out, rows grouped by step)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rcdiag.io.base import Chunk


def take_rows(chunk: Chunk, rows: np.ndarray) -> Chunk:
    """The rows at the indices ``rows`` (in that order) as a new chunk; every per-token and per-row array follows."""
    lengths = np.diff(chunk.offsets)[rows]
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(chunk.offsets[:-1][rows] - offsets[:-1], lengths) + np.arange(offsets[-1])
    per_row: dict[str, Any] = {
        name: None if getattr(chunk, name) is None else getattr(chunk, name)[rows] for name in Chunk.PER_ROW
    }
    return dataclasses.replace(
        chunk,
        old=chunk.old[index],
        rollout=chunk.rollout[index],
        offsets=offsets,
        mask=None if chunk.mask is None else chunk.mask[index],
        tokens=None if chunk.tokens is None else chunk.tokens[index],
        nulls=None if chunk.nulls is None else (_taken(chunk.nulls[0], index), _taken(chunk.nulls[1], index)),
        labels=None if chunk.labels is None else {name: values[rows] for name, values in chunk.labels.items()},
        loss_inputs=None if chunk.loss_inputs is None else {k: v[index] for k, v in chunk.loss_inputs.items()},
        **per_row,
    )


def _taken(values: np.ndarray | None, index: np.ndarray) -> np.ndarray | None:
    return None if values is None else values[index]
