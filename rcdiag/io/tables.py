"""One file read as Arrow record batches: the contract every tabular format implements, and the conversion to chunks.

A format module (Parquet, Arrow IPC, JSONL, tensors) only says how to get the schema and record batches of one file;
``TableFile`` resolves the columns once, checks their types and recognises the layout (lists per response, ragged
or padded, or long: one row per token). ``rcdiag.io.table_source.TableSource`` reads one or several such files as a
dump.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.io.arrow_lists import check_same_lengths, flatten_list, float_values, is_list_type
from rcdiag.io.base import Chunk, ColumnMap
from rcdiag.io.columns import LOSS_INPUTS, Resolved, check_unique, long_layout_reason, resolve
from rcdiag.io.record_batches import (
    Batch,
    check_file_step,
    constant_steps,
    id_array,
    loss_values,
    mask_array,
    slice_chunks,
    step_array,
    token_values,
)
from rcdiag.runtime.errors import InputError

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


class TableFile(ABC):
    """One file of a dump, read as Arrow record batches.

    A subclass learns its schema (and what else it can say without reading the rows) in ``__init__``, then calls
    ``super().__init__``, which resolves the columns and the layout; it implements ``batches``, and
    ``partitions`` when the file splits into parts for parallel workers.
    """

    def __init__(
        self,
        path: str,
        columns: ColumnMap | None,
        *,
        format: str,
        schema: pa.Schema,
        kv_metadata: dict[str, str] | None = None,
        total_rows: int | None = None,
        step: int | None = None,
        step_origin: str = "file name",
        extra_aliases: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.path = path
        self.format = format
        self.schema = schema
        self.kv_metadata = dict(kv_metadata or {})
        self.total_rows = total_rows
        if step is not None:
            check_file_step(step, path, step_origin)
        self.step = step
        """The step of every row when the container says it; ``step_origin`` says where ("file name",
        "directory name" or "key 'NAME'"), used only when the dump has no step column."""
        names = schema.names
        first = resolve(names, columns, path, extra=extra_aliases)
        self.long = not is_list_type(schema.field(first.old).type)
        why = long_layout_reason(first.old, schema.field(first.old).type, path) if self.long else ""
        cols = resolve(names, columns, path, extra=extra_aliases, need_seq=why) if self.long else first
        named = columns is not None and columns.token is not None
        if cols.token is not None and not named and not _is_token_type(schema.field(cols.token).type, self.long):
            cols = dataclasses.replace(cols, token=None)  # a recognised name holding something else: not ids
        for role in LOSS_INPUTS:  # a recognised name holding something else: not this loss input
            name = getattr(cols, role)
            given = getattr(columns or ColumnMap(), role)
            if name is not None and given is None and not _is_loss_input_type(schema.field(name).type, self.long):
                cols = (
                    dataclasses.replace(cols, advantages=None)
                    if role == "advantages"
                    else dataclasses.replace(cols, current=None)
                )
        given = () if columns is None else columns.by
        labels = tuple(name for name in cols.labels if name in given or _is_label_type(schema.field(name).type))
        self.cols: Resolved = dataclasses.replace(cols, labels=labels)  # a recognised name holding lists: not a label
        check_types(schema, self.cols, self.long, path)
        self.loss_cols = self.cols
        """``cols`` with the loss inputs the dump has; ``cols`` holds them only once wanted (``want_loss_inputs``)."""
        self.cols = dataclasses.replace(self.cols, advantages=None, current=None)
        self.tokens_wanted = False
        """Whether ``read_columns`` includes the token-id column (``--explain``: ``Source.want_tokens``)."""
        used = {self.cols.old, self.cols.rollout, self.cols.mask, self.cols.step}
        self.metadata_columns = {
            name: key
            for name, key in METADATA_COLUMNS.items()
            if name in names and name not in used and _is_fact_type(schema.field(names.index(name)).type)
        }
        for name in self.metadata_columns:
            check_unique(names, name, path)
        self.columns_used = self.cols.used(self.long)
        """``InputFacts.columns``: canonical role -> the column, key or ``"<file name>"`` the values come from."""
        self.step_source = ""
        if self.cols.step is not None:
            self.step_source = f"column '{self.cols.step}'"
        elif step is not None:
            key = step_origin.removeprefix("key ").strip("'")
            self.columns_used["step"] = key if step_origin.startswith("key ") else f"<{step_origin}>"
            self.step_source = step_origin
        self.mask_candidates = _mask_candidates(schema, self.cols) if self.cols.mask is None else ()

    @abstractmethod
    def batches(self, chunk_tokens: int, columns: list[str], part: Any = None) -> Iterator[Batch]:
        """Record batches of about ``chunk_tokens`` values holding ``columns``, of the file or of one part."""

    def partitions(self, n: int) -> list[Any]:
        """Up to ``n`` disjoint parts of the file for parallel workers; by default one: the whole file."""
        return [None]

    def read_columns(self) -> list[str]:
        cols = self.cols
        names = [name for name in (cols.old, cols.rollout, cols.mask, cols.step, cols.seq) if name is not None]
        names += [cols.id] if cols.id is not None and cols.id not in names else []
        names += [name for name in cols.labels if name not in names]
        names += [name for name in cols.loss_inputs().values() if name not in names]
        return names + ([cols.token] if self.tokens_wanted and cols.token is not None else [])

    def want_loss_inputs(self, wanted: bool) -> None:
        """Read the loss-input columns the dump has (``--as``), or not."""
        keep = self.loss_cols if wanted else dataclasses.replace(self.loss_cols, advantages=None, current=None)
        self.cols = dataclasses.replace(self.cols, advantages=keep.advantages, current=keep.current)

    @property
    def token_column(self) -> str | None:
        """The token-id column read, if any."""
        return self.cols.token if self.tokens_wanted else None


def _is_token_type(arrow_type: pa.DataType, long: bool) -> bool:
    """Token ids: integers (one per token in the long layout, else a list per response); JSON gives lists of
    numbers as floats, checked to be whole when read (``token_values``)."""
    if not long:
        if not is_list_type(arrow_type):
            return False
        arrow_type = arrow_type.value_type
    return pa.types.is_integer(arrow_type) or (not long and pa.types.is_floating(arrow_type))


def _is_loss_input_type(arrow_type: pa.DataType, long: bool) -> bool:
    """A loss input: a number per token (a list of them per response; the advantages also one number per
    response)."""
    if not long and is_list_type(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type)


def _is_label_type(arrow_type: pa.DataType) -> bool:
    """One number, string or boolean (a dictionary-encoded one too): a label (``--by``) holds one per row."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
    )


def _is_fact_type(arrow_type: pa.DataType) -> bool:
    """A column of run facts holds numbers, strings or booleans, or lists of them (per-token temperatures); any
    other type (a struct, a map, nested lists) is some other column of the same name, left unread."""
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if is_list_type(arrow_type):
        arrow_type = arrow_type.value_type
    return _is_label_type(arrow_type)


def _mask_candidates(schema: pa.Schema, cols: Resolved) -> tuple[str, ...]:
    """Unused columns that could be a mask the aliases do not know (``attention_mask``, ``mask``, ...)."""
    used = {cols.old, cols.rollout, cols.step, cols.seq}
    return tuple(name for name in schema.names if "mask" in name.lower() and name not in used)


def check_unmasked(chunk: Chunk, candidates: tuple[str, ...]) -> None:
    """Without a mask column, NaN or +inf log-probs are usually padding: say so, not "skip the bad rows"."""
    for values, name in zip((chunk.old, chunk.rollout), chunk.column_names, strict=True):
        bad = np.flatnonzero(np.isnan(values) | np.isposinf(values))
        if bad.size:
            row = int(np.searchsorted(chunk.offsets, bad[0], side="right") - 1)
            listed = ", ".join(f"'{c}'" for c in candidates)
            raise InputError(
                f"holds {values[bad[0]]} at position {int(bad[0] - chunk.offsets[row])} and the dump has no mask "
                f"column, so padding counts as valid tokens; columns that could be the mask: {listed}; name it "
                "with --mask-col NAME",
                **chunk.where(row),
                column=name,
            )


def schema_metadata(schema: pa.Schema) -> dict[str, str]:
    """Key-value metadata as strings, without Arrow's internal keys and the pandas blob."""
    return {
        key.decode(errors="replace"): value.decode(errors="replace")
        for key, value in (schema.metadata or {}).items()
        if not key.startswith(b"ARROW:") and key != b"pandas"
    }


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
    if cols.token is not None and not _is_token_type(schema.field(cols.token).type, long):
        shape = "an integer per row" if long else "a list of integers"
        raise InputError(
            f"has type {schema.field(cols.token).type}, expected {shape} (the token id of each position)",
            path=path,
            column=cols.token,
        )
    for role, key in LOSS_INPUTS.items():
        name = getattr(cols, role)
        if name is None:
            continue
        arrow_type = schema.field(name).type
        per_row = role == "advantages" and not long and not is_list_type(arrow_type)
        ok = _is_loss_input_type(arrow_type, long) and (per_row or long or is_list_type(arrow_type))
        if not ok:
            shape = "a number per row" if long else "a list of numbers (one per token)"
            shape += "" if long or role != "advantages" else " or one number per response"
            raise InputError(f"has type {arrow_type}, expected {shape} ({key})", path=path, column=name)
    for name in cols.labels:
        if not _is_label_type(schema.field(name).type):
            raise InputError(
                f"has type {schema.field(name).type}, expected one number, string or boolean per row (--by breaks the "
                "mismatch down by a per-row column: an environment, a data source, a replica, a policy version)",
                path=path,
                column=name,
            )
    if long and cols.seq is not None:
        seq_type = schema.field(cols.seq).type
        if not (pa.types.is_integer(seq_type) or pa.types.is_string(seq_type) or pa.types.is_large_string(seq_type)):
            raise InputError(
                f"has type {seq_type}, expected an integer or string sequence id", path=path, column=cols.seq
            )


def list_chunks(batch: Batch, cols: Resolved, chunk_tokens: int, token: str | None = None) -> Iterator[Chunk]:
    """Chunks of whole rows from one batch of list columns (with the ``token`` id column when it is read)."""
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
        steps = constant_steps(batch.step, data.num_rows)
    old = float_values(old_values)
    rollout = float_values(rollout_values)
    ids = id_array(data.column(cols.id)) if cols.id is not None else None
    labels = {name: id_array(data.column(name)) for name in cols.labels} or None
    tokens = None
    if token is not None:
        token_offsets, token_list = flatten_list(data.column(token), token, path, row)
        check_same_lengths(offsets, token_offsets, (cols.old, token), path, row)
        tokens = token_values(token_list, token, path, row, token_offsets)
    nulls = None if batch.nulls is None else (batch.nulls.get(cols.old), batch.nulls.get(cols.rollout))
    inputs = {key: _loss_input(data.column(name), name, offsets, path, row) for key, name in cols.loss_inputs().items()}
    yield from slice_chunks(
        old, rollout, offsets, mask, steps, cols, path, chunk_tokens, first_row=row, ids=ids, tokens=tokens,
        nulls=nulls,
        labels=labels,
        loss_inputs=inputs or None,
    )  # fmt: skip


def _loss_input(column: Any, name: str, offsets: np.ndarray, path: str, row: int) -> np.ndarray:
    """A loss input's values per position, float32: a list column as stored (its lengths those of the log-probs),
    a per-row number (the advantages) repeated over its row's positions; a null is NaN."""
    if is_list_type(column.type):
        input_offsets, values = flatten_list(column, name, path, row)
        check_same_lengths(offsets, input_offsets, ("the log-probs", name), path, row)
        return loss_values(values)
    per_row = loss_values(column)
    return np.repeat(per_row, np.diff(offsets))


def short(exc: BaseException) -> str:
    """The first line of an exception's message, for a one-line error."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
