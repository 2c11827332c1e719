"""Arrow IPC dumps: the file format (``.arrow``, ``.feather`` v2) and the stream format (``.arrows``).

Both are read batch by batch through plain reads (``pa.OSFile``), one record batch in memory at a time. The file
format is never memory-mapped: a file that shrinks while it is read (a trainer rewriting it, ``rcdiag watch``
reading a file still being written) would make a read of a mapped page past its new end kill the process with
SIGBUS (exit 135, nothing said); a read past the end is an error naming the file instead. Reading through reads
costs about what the map did (docs/formats.md). Every open file is closed when reading ends, also when it stops early.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from rcdiag.io.base import ColumnMap
from rcdiag.io.paths import arrow_input, open_input
from rcdiag.io.record_batches import Batch
from rcdiag.io.tables import TableFile, schema_metadata, short
from rcdiag.runtime.errors import InputError

FILE_MAGIC = b"ARROW1"


class ArrowIpcFile(TableFile):
    """An Arrow IPC file or stream (recognised by its first bytes, whatever the suffix)."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        name = str(path)
        total_rows = None
        try:
            with open_input(name) as handle:
                self.is_file = handle.read(6) == FILE_MAGIC
            if self.is_file:
                with arrow_input(name) as source:
                    schema = pa.ipc.open_file(source).schema
                    reader = pa.ipc.open_file(source, options=_reading([_cheapest(schema)] if schema else []))
                    total_rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            else:
                with arrow_input(name) as source:
                    schema = pa.ipc.open_stream(source).schema
            schema.names  # noqa: B018 - column names that are not UTF-8 fail here, as a damaged file
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"cannot be read as Arrow IPC ({short(exc)}); is it a complete .arrow/.feather file?", path=name
            ) from None
        if total_rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=name)
        super().__init__(
            name,
            columns,
            format="arrow-ipc-file" if self.is_file else "arrow-ipc-stream",
            schema=schema,
            kv_metadata=schema_metadata(schema),
            total_rows=total_rows,
        )

    def batches(self, chunk_tokens: int, columns: list[str], part: Any = None) -> Iterator[Batch]:
        row = 0
        wanted = set(columns)
        options = _reading([i for i, name in enumerate(self.schema.names) if name in wanted])
        try:
            with arrow_input(self.path) as source:
                if self.is_file:
                    reader = pa.ipc.open_file(source, options=options)
                    stream = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    stream = iter(pa.ipc.open_stream(source, options=options))
                for batch in stream:
                    yield Batch(batch.select(columns), self.path, row)
                    row += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot be read after row {row} ({short(exc)})", path=self.path) from None
        if row == 0:
            raise InputError("has no rows: there is nothing to analyze", path=self.path)


def _reading(fields: list[int]) -> pa.ipc.IpcReadOptions:
    """Read only these top-level fields: a file's reader then reads only their buffers of each record batch, so
    the columns rcdiag does not use are neither read nor held in memory."""
    return pa.ipc.IpcReadOptions(included_fields=fields)


def _cheapest(schema: pa.Schema) -> int:
    """The field whose buffers are likely smallest (a scalar column before a list, narrow values before wide): the
    one read to count a file's rows, since a batch's row count comes only with the batch."""

    def cost(kind: pa.DataType) -> int:
        if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            return (1 << 10) + cost(kind.value_type)
        try:
            return kind.bit_width
        except ValueError:  # not fixed-width (strings, structs): read only when nothing cheaper is there
            return 1 << 20

    return min(range(len(schema)), key=lambda i: cost(schema.field(i).type))
