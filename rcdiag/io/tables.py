"""Arrow record batches -> chunks: the one conversion every tabular reader shares.

A reader (Parquet, Arrow IPC, JSONL, tensors, shards) only says how to get record batches and the schema;
``TableSource`` resolves the columns once, checks their types, recognises the layout (lists per response,
ragged or padded, or long: one row per token) and turns batches into chunks of whole responses.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import InputError
from rcdiag.io.arrow_lists import (
    check_same_lengths,
    flatten_list,
    float_values,
    is_list_type,
)
from rcdiag.io.base import DEFAULT_CHUNK_TOKENS, Chunk, ColumnMap, Source, SourceInfo, split_rows
from rcdiag.io.columns import Resolved, resolve

METADATA_COLUMNS = {
    "temperature": "temperature",
    "temperatures": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "model": "model",
    "rollout_engine": "rollout_engine",
    "train_engine": "train_engine",
    "training_engine": "train_engine",
    "rollout_dtype": "rollout_dtype",
    "train_dtype": "train_dtype",
}
"""Columns holding run facts (constant or nearly so) -> ``InputFacts.metadata`` key."""
MAX_METADATA_VALUES = 8


@dataclass(frozen=True)
class Batch:
    """A record batch with where it came from: ``first_row`` is the index of its first row in ``path``."""

    data: pa.RecordBatch
    path: str
    first_row: int
    step: int | None = None
    """The step of every row when the container says it (a NeMo-RL file name), else ``None``."""


class TableSource(Source):
    """A dump read as Arrow record batches. Subclasses set ``path``, ``schema``, ``kv_metadata``, ``format``
    (and optionally ``total_rows``, ``file_step``) in ``__init__`` and implement ``batches``."""

    path: str
    format: str
    schema: pa.Schema
    kv_metadata: dict[str, str]
    total_rows: int | None = None
    file_step: bool = False
    """Rows get their step from the container (``Batch.step``) when the dump has no step column."""
    extra_aliases: dict[str, tuple[str, ...]] | None = None

    @abstractmethod
    def batches(self, chunk_tokens: int, columns: list[str]) -> Iterator[Batch]:
        """Record batches of about ``chunk_tokens`` values holding ``columns``."""

    def setup(self, columns: ColumnMap | None) -> None:
        """Resolve the columns and the layout; call at the end of ``__init__``."""
        schema = self.schema
        names = schema.names
        first = resolve(names, columns, self.path, extra=self.extra_aliases)
        self.long = not is_list_type(schema.field(first.old).type)
        self.cols: Resolved = (
            resolve(names, columns, self.path, extra=self.extra_aliases, need_seq=True) if self.long else first
        )
        check_types(schema, self.cols, self.long, self.path)
        self.metadata_columns = {
            name: key
            for name, key in METADATA_COLUMNS.items()
            if name in names and name not in {self.cols.old, self.cols.rollout, self.cols.mask, self.cols.step}
        }
        self._metadata_values: dict[str, set[str]] = {}
        columns_used = self.cols.used(self.long)
        if self.cols.step is None and self.file_step:
            columns_used["step"] = "<file name>"
        self.info = SourceInfo(
            path=self.path,
            format=self.format + (" (long)" if self.long else ""),
            columns=columns_used,
            dtypes={name: str(schema.field(name).type) for name in self.read_columns()},
            metadata=dict(self.kv_metadata),
            total_rows=None if self.long else self.total_rows,
        )

    def read_columns(self) -> list[str]:
        cols = self.cols
        names = [name for name in (cols.old, cols.rollout, cols.mask, cols.step, cols.seq) if name is not None]
        return names + ([cols.id] if cols.id is not None and cols.id not in names else [])

    def chunks(self, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, part: Any = None) -> Iterator[Chunk]:
        wanted = self.read_columns() + list(self.metadata_columns)
        # Only sources that override ``partitions`` get a part, and their ``batches`` accept it.
        source = self.batches(chunk_tokens, wanted) if part is None else self.batches(chunk_tokens, wanted, part=part)  # type: ignore[call-arg]
        if self.long:
            from rcdiag.io.long import group_sequences

            batches = self._with_metadata(source)
            yield from group_sequences(batches, self.cols, self.path, chunk_tokens, self.total_rows)
        else:
            for batch in self._with_metadata(source):
                yield from list_chunks(batch, self.cols, chunk_tokens)
        self._finish_metadata()

    def _with_metadata(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        for batch in batches:
            for name, key in self.metadata_columns.items():
                if name in batch.data.schema.names:
                    self._collect(key, batch.data.column(name))
            yield batch

    def _collect(self, key: str, column: pa.Array) -> None:
        values = self._metadata_values.setdefault(key, set())
        if len(values) > MAX_METADATA_VALUES:
            return
        if is_list_type(column.type):
            column = column.flatten()
        for value in column.unique().to_pylist():
            if value is not None:
                values.add(_fmt(value))

    def _finish_metadata(self) -> None:
        for key, values in self._metadata_values.items():
            if key in self.info.metadata or not values:
                continue
            shown = sorted(values)[:MAX_METADATA_VALUES]
            more = ", ..." if len(values) > MAX_METADATA_VALUES else ""
            self.info.metadata[key] = ", ".join(shown) + more


def _fmt(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)


def check_types(schema: pa.Schema, cols: Resolved, long: bool, path: str) -> None:
    """Every used column must have a type that means what its role needs."""
    for name in (cols.old, cols.rollout):
        arrow_type = schema.field(name).type
        if long:
            ok = pa.types.is_floating(arrow_type)
            expected = "a float (one log-prob per row, as in the long layout of the other log-prob column)"
        else:
            ok = is_list_type(arrow_type) and pa.types.is_floating(arrow_type.value_type)
            expected = (
                "a list of float32/float64 (one list of per-token log-probs per response), like the other "
                "log-prob column"
            )
        if not ok:
            raise InputError(f"has type {arrow_type}, expected {expected}", path=path, column=name)
    if cols.mask is not None:
        arrow_type = schema.field(cols.mask).type
        value_type = arrow_type if long else (arrow_type.value_type if is_list_type(arrow_type) else None)
        if value_type is None or not (
            pa.types.is_integer(value_type) or pa.types.is_boolean(value_type) or pa.types.is_floating(value_type)
        ):
            shape = "an int, bool or 0/1 float per row" if long else "a list of int, bool or 0/1 floats"
            raise InputError(
                f"has type {arrow_type}, expected {shape} (1 = valid token, 0 = padding)", path=path, column=cols.mask
            )
    if cols.step is not None and not pa.types.is_integer(schema.field(cols.step).type):
        raise InputError(
            f"has type {schema.field(cols.step).type}, expected an integer training step", path=path, column=cols.step
        )
    if long and cols.seq is not None:
        seq_type = schema.field(cols.seq).type
        if not (pa.types.is_integer(seq_type) or pa.types.is_string(seq_type) or pa.types.is_large_string(seq_type)):
            raise InputError(
                f"has type {seq_type}, expected an integer or string sequence id", path=path, column=cols.seq
            )


def mask_array(values: pa.Array) -> np.ndarray:
    """Flat mask values as numpy (bool stays bool; numbers are checked to be 0/1 by ``validate.Screen``)."""
    return values.to_numpy(zero_copy_only=False)


def step_array(column: pa.Array, name: str, path: str, first_row: int) -> np.ndarray:
    """Per-row steps as int64; a null step is an ``InputError``."""
    if column.null_count:
        null_row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
        raise InputError("is null; every row needs a step", path=path, row=first_row + null_row, column=name)
    return column.to_numpy().astype(np.int64, copy=False)


def id_array(column: pa.Array) -> np.ndarray:
    """Per-row ids as numpy (strings and nulls as Python objects)."""
    return column.to_numpy(zero_copy_only=False)


def list_chunks(batch: Batch, cols: Resolved, chunk_tokens: int) -> Iterator[Chunk]:
    """Chunks of whole rows from one batch of list columns."""
    data, path, row = batch.data, batch.path, batch.first_row
    offsets, old_values = flatten_list(data.column(cols.old), cols.old, path, row)
    rollout_offsets, rollout_values = flatten_list(data.column(cols.rollout), cols.rollout, path, row)
    check_same_lengths(offsets, rollout_offsets, (cols.old, cols.rollout), path, row)
    mask = None
    if cols.mask is not None:
        mask_offsets, mask_values = flatten_list(data.column(cols.mask), cols.mask, path, row)
        check_same_lengths(offsets, mask_offsets, (cols.old, cols.mask), path, row)
        mask = mask_array(mask_values)
    steps = None
    if cols.step is not None:
        steps = step_array(data.column(cols.step), cols.step, path, row)
    elif batch.step is not None:
        steps = np.full(data.num_rows, batch.step, dtype=np.int64)
    old = float_values(old_values)
    rollout = float_values(rollout_values)
    ids = id_array(data.column(cols.id)) if cols.id is not None else None
    yield from slice_chunks(old, rollout, offsets, mask, steps, cols, path, chunk_tokens, first_row=row, ids=ids)


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
) -> Iterator[Chunk]:
    """Cut flat whole rows into chunks of at most ``chunk_tokens`` values (a longer row is its own chunk).
    ``first_row`` is the file row of the first row, or ``None`` when rows are not file rows (long layout)."""
    for start, stop in split_rows(np.diff(offsets), chunk_tokens):
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
        )


def short(exc: BaseException) -> str:
    """The first line of an exception's message, for a one-line error."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
