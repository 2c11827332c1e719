"""A dump made of one or several ``TableFile`` objects of one kind: a file, a directory, a glob, a run directory.

Every file must map the same columns with the same types; the first that does not is an error naming both files.
Rows are read file by file in the order given; in the long layout tokens are grouped by sequence id across files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from rcdiag.io.arrow_lists import is_list_type
from rcdiag.io.base import DEFAULT_CHUNK_TOKENS, Chunk, Part, Source, SourceInfo, balanced_runs
from rcdiag.io.integrity import check_batch
from rcdiag.io.limits import memory_named
from rcdiag.io.long import group_sequences
from rcdiag.io.paths import identity, map_files
from rcdiag.io.record_batches import Batch
from rcdiag.io.tables import TableFile, check_unmasked, list_chunks
from rcdiag.runtime.errors import InputError

MAX_METADATA_VALUES = 8


class TableSource(Source):
    """Files of one kind read as one dump, labelled ``path`` (what the user gave); ``kind`` is their registry
    format name (what a worker opens a ``Part`` with)."""

    def __init__(self, path: str, files: Sequence[TableFile], kind: str = "") -> None:
        first = files[0]
        for file in files[1:]:
            _check_consistent(first, file)
        self.files = list(files)
        self.kind = kind
        self.long = first.long
        self.cols = first.cols
        totals = [file.total_rows for file in files]
        self.total_rows = None if None in totals else sum(t for t in totals if t is not None)
        layout = " (long)" if self.long else ""
        self.info = SourceInfo(
            path=path,
            format=first.format + layout + (f", {len(files)} files" if len(files) > 1 else ""),
            columns=dict(first.columns_used),
            dtypes={name: str(first.schema.field(name).type) for name in first.read_columns()},
            metadata=dict(first.kv_metadata),
            total_rows=None if self.long else self.total_rows,
            files=len(files),
            step_source=first.step_source,
            reads=[dict(read, part=None) for read in map_files(identity, [file.path for file in files])],
        )
        self._metadata_values: dict[str, set[str]] = {}

    def partitions(self, n: int) -> list[Part]:
        """Up to ``n`` parts for parallel workers: the file's own parts (a Parquet file's row groups), or runs of
        consecutive files of about equal size. A dump in the long layout is one part: a response's tokens may sit
        anywhere."""
        refs = tuple((self.kind, file.path) for file in self.files)
        if self.long or n < 2:
            return [Part(self.info.path, refs)]
        if len(self.files) == 1:
            return [Part(self.info.path, refs, within) for within in self.files[0].partitions(n)]
        runs = balanced_runs([read["size"] for read in self.info.reads], n)
        return [Part(self.info.path, tuple(refs[i] for i in run)) for run in runs]

    def want_loss_inputs(self, wanted: bool) -> None:
        """``InputFacts.columns["advantages"|"log_prob"]``: each loss input's column once read (``--as``), left out
        otherwise."""
        for file in self.files:
            file.want_loss_inputs(wanted)
        first = self.files[0]
        self.cols = first.cols
        for key, name in first.loss_cols.loss_inputs().items():
            if wanted:
                self.info.columns[key] = name
                self.info.dtypes[name] = str(first.schema.field(name).type)
            else:
                self.info.columns.pop(key, None)

    def want_tokens(self, wanted: bool) -> None:
        """``InputFacts.columns["token_ids"]``: the column when it is read; ``None`` when the dump has none (an
        absent optional column, which the verdict names); left out when the dump has one that is not read."""
        for file in self.files:
            file.tokens_wanted = wanted
        token = self.files[0].token_column
        if token is not None:
            self.info.columns["token_ids"] = token
            self.info.dtypes[token] = str(self.files[0].schema.field(token).type)
        elif self.files[0].cols.token is None:
            self.info.columns["token_ids"] = None
        else:
            self.info.columns.pop("token_ids", None)

    def seen_metadata(self) -> dict[str, list[str]]:
        return {key: sorted(values) for key, values in self._metadata_values.items()}

    def add_metadata(self, seen: dict[str, list[str]]) -> None:
        for key, values in seen.items():
            self._metadata_values.setdefault(key, set()).update(values)
        self._finish_metadata()

    def chunks(self, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, part: Any = None) -> Iterator[Chunk]:
        batches = self._with_metadata(self._batches(chunk_tokens, part))
        if self.long:
            cols = self.cols if self.files[0].token_column else dataclasses.replace(self.cols, token=None)
            yield from group_sequences(batches, cols, self.info.path, chunk_tokens, self.total_rows)
        else:
            candidates = self.files[0].mask_candidates
            for batch in batches:
                for chunk in list_chunks(batch, self.cols, chunk_tokens, self.files[0].token_column):
                    if candidates:
                        check_unmasked(chunk, candidates)
                    yield chunk
        self._finish_metadata()

    def _batches(self, chunk_tokens: int, part: Any) -> Iterator[Batch]:
        if part is not None and len(self.files) > 1:
            raise ValueError("a part within a file applies to a single-file source")
        for file in self.files:
            with memory_named(file.path):
                for batch in file.batches(chunk_tokens, file.read_columns() + list(file.metadata_columns), part):
                    check_batch(batch)  # before any kernel or pyarrow compute function reads it
                    yield batch

    def _with_metadata(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        for batch in batches:
            for name in batch.data.schema.names:
                key = self.files[0].metadata_columns.get(name)
                if key is not None:
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


def _check_consistent(first: TableFile, file: TableFile) -> None:
    if first.long != file.long or first.cols != file.cols:
        raise InputError(
            f"uses columns {_roles(file)} but {first.path} uses {_roles(first)}; all shards of a dump need the "
            "same columns (move the odd file out, or point rcdiag at the files you mean)",
            path=file.path,
        )
    for name in first.read_columns():
        a, b = first.schema.field(name).type, file.schema.field(name).type
        if a != b:
            raise InputError(
                f"has type {b} but {first.path} has {a}; all shards of a dump need one schema (rewrite the odd "
                "file, or point rcdiag at the files you mean)",
                path=file.path,
                column=name,
            )


def _roles(file: TableFile) -> str:
    return ", ".join(f"{k}={v}" for k, v in file.cols.used(file.long).items() if v is not None)
