"""Arrow record batches and the cut into chunks of whole rows, shared by the list and the long layout."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rcdiag.io.base import Chunk, split_rows
from rcdiag.io.columns import Resolved
from rcdiag.io.limits import ROW_TOKENS
from rcdiag.runtime.errors import InputError
from rcdiag.runtime.fields import STEP_RANGE


@dataclass(frozen=True)
class Batch:
    """A record batch with where it came from: ``first_row`` is the index of its first row in ``path``."""

    data: pa.RecordBatch
    path: str
    first_row: int
    step: int | None = None
    """The step of every row when the container says it (a NeMo-RL file name), else ``None``."""
    nulls: dict[str, np.ndarray] | None = None
    """Per list column that had any, its positions (over the column's flat values) the file held as null and the
    reader gave as NaN (``Chunk.nulls``); ``None`` when none did."""


def mask_array(values: pa.Array) -> np.ndarray:
    """Flat mask values as numpy (bool stays bool; numbers are checked to be 0/1 by ``validate.Screen``)."""
    return values.to_numpy(zero_copy_only=False)


def step_array(column: pa.Array, name: str, path: str, first_row: int) -> np.ndarray:
    """Per-row steps, exact (``exact_steps``); a null step is an ``InputError``."""
    if column.null_count:
        null_row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise InputError("is null; every row needs a step", path=path, row=first_row + null_row, column=name)
    return exact_steps(column.to_numpy())


def exact_steps(values: np.ndarray) -> np.ndarray:
    """Steps of any integer column as int64, or kept uint64 when one lies beyond int64 (a uint64 step of 2**63 or
    more, which int64 would make negative): every step stays exact, and the engine keys its batches by the
    Python ``int`` of each (``rcdiag.runtime.fields.STEP_RANGE``)."""
    if values.dtype == np.uint64 and values.size and int(values.max()) > np.iinfo(np.int64).max:
        return values
    return values.astype(np.int64, copy=False)


def constant_steps(step: int, rows: int) -> np.ndarray:
    """``rows`` copies of the one step a file states (its name, a key), exact: int64, or uint64 beyond it."""
    return np.full(rows, step, dtype=np.int64 if step <= np.iinfo(np.int64).max else np.uint64)


def check_file_step(step: int, path: str, origin: str) -> None:
    """A step a file states (its name, a key) must be one a step column could hold (``STEP_RANGE``)."""
    low, high = STEP_RANGE
    if not low <= step <= high:
        raise InputError(
            f"states step {step} (from its {origin}), beyond the range of a step (int64 or uint64: {low} to {high})",
            path=path,
        )


def id_array(column: pa.Array) -> np.ndarray:
    """Per-row ids as numpy (strings and nulls as Python objects)."""
    return column.to_numpy(zero_copy_only=False)


def token_values(
    values: pa.Array, column: str, path: str, first_row: int | None, offsets: np.ndarray | None = None
) -> np.ndarray:
    """Flat token ids as int32 when stored so (Parquet's usual type: no widened copy), else int64. Floats (JSON
    numbers) must be whole; ``offsets`` (list layout) place a bad value in its row for the error. Negative ids and
    ids beyond the vocabulary are the screen's (valid positions only)."""
    flat = values.to_numpy(zero_copy_only=False)
    if flat.dtype.kind == "f":
        whole = np.isfinite(flat) & (np.floor(flat) == flat) & (np.abs(flat) < 2.0**53)
        if not whole.all():
            at = int(np.flatnonzero(~whole)[0])
            row = at if offsets is None else int(np.searchsorted(offsets, at, side="right") - 1)
            position = "" if offsets is None else f" at position {at - int(offsets[row])} of the list"
            raise InputError(
                f"holds {float(flat[at])!r}{position}, which is not a token id (a whole number)",
                path=path,
                row=None if first_row is None else first_row + row,
                column=column,
            )
    if flat.dtype.kind == "u" and flat.size and flat.max() > np.iinfo(np.int64).max:
        at = int(np.argmax(flat))
        row = at if offsets is None else int(np.searchsorted(offsets, at, side="right") - 1)
        raise InputError(
            f"holds the token id {int(flat[at])}, beyond any vocabulary",
            path=path,
            row=None if first_row is None else first_row + row,
            column=column,
        )
    return flat if flat.dtype == np.int32 else flat.astype(np.int64, copy=False)


def loss_values(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A loss input's numbers (an Arrow array, any numeric type) as float32; a null is NaN."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    out = array.cast(pa.float64()).to_numpy(zero_copy_only=False)
    return np.asarray(out, dtype=np.float32)


def check_group_rows(values: int, rows: int, path: str, group: int) -> None:
    """Before decoding a row group (Parquet): rows averaging more than ``ROW_TOKENS`` hold a response beyond it."""
    limit = ROW_TOKENS.value
    if rows and limit and values > rows * limit:
        what = f"row group {group} holds {values:,} tokens in {rows:,} response(s): a response of it, on average,"
        ROW_TOKENS.check(values // rows, path, what)


def slice_chunks(
    old: np.ndarray,
    rollout: np.ndarray,
    offsets: np.ndarray,
    mask: np.ndarray | None,
    steps: np.ndarray | None,
    cols: Resolved,
    path: str,
    chunk_tokens: int,
    *,
    first_row: int | None,
    seq_ids: np.ndarray | None = None,
    ids: np.ndarray | None = None,
    tokens: np.ndarray | None = None,
    nulls: tuple[np.ndarray | None, np.ndarray | None] | None = None,
    labels: dict[str, np.ndarray] | None = None,
    loss_inputs: dict[str, np.ndarray] | None = None,
) -> Iterator[Chunk]:
    """Cut flat whole rows into chunks of at most ``chunk_tokens`` values (a longer row is its own chunk).
    ``first_row`` is the file row of the first row, or ``None`` when rows are not file rows (long layout).
    A row is computed whole: one longer than ``ROW_TOKENS`` is refused here, before the engine allocates for it."""
    lengths = np.diff(offsets)
    limit = ROW_TOKENS.value
    if limit and lengths.size and int(lengths.max()) > limit:
        row = int(np.argmax(lengths))
        seq = None if seq_ids is None else seq_ids[row]
        where = {"row": (first_row or 0) + row} if seq is None else {"sequence": getattr(seq, "item", lambda: seq)()}
        ROW_TOKENS.check(int(lengths[row]), path, "this response (one row, computed whole)", **where)
    for start, stop in split_rows(lengths, chunk_tokens):
        lo, hi = int(offsets[start]), int(offsets[stop])
        yield Chunk(
            old=old[lo:hi],
            rollout=rollout[lo:hi],
            offsets=offsets[start : stop + 1] - lo,
            mask=None if mask is None else mask[lo:hi],
            steps=None if steps is None else steps[start:stop],
            first_row=0 if first_row is None else first_row + start,
            source=path,
            column_names=(cols.old, cols.rollout),
            mask_name=cols.mask or "response_mask",
            seq_ids=None if seq_ids is None else seq_ids[start:stop],
            ids=None if ids is None else ids[start:stop],
            tokens=None if tokens is None else tokens[lo:hi],
            token_name=cols.token or "token_ids",
            nulls=None if nulls is None else (_cut(nulls[0], lo, hi), _cut(nulls[1], lo, hi)),
            labels=None if labels is None else {name: values[start:stop] for name, values in labels.items()},
            loss_inputs=None if loss_inputs is None else {k: v[lo:hi] for k, v in loss_inputs.items()},
        )


def _cut(values: np.ndarray | None, lo: int, hi: int) -> np.ndarray | None:
    return None if values is None else values[lo:hi]
