"""Arrow IPC dumps: the file format (``.arrow``, ``.feather`` v2) and the stream format (``.arrows``).

Both are read batch by batch; the file format is memory-mapped, so only the batches being converted are paged in.
Every open (the map, the stream) is closed when reading ends, also when it stops early.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap
from rcdiag.io.paths import arrow_input, open_input
from rcdiag.io.record_batches import Batch
from rcdiag.io.tables import TableFile, schema_metadata, short

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
                with arrow_input(name, memory_map=True) as source:
                    reader = pa.ipc.open_file(source)
                    schema = reader.schema
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
        try:
            with arrow_input(self.path, memory_map=self.is_file) as source:
                if self.is_file:
                    reader = pa.ipc.open_file(source)
                    stream = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    stream = iter(pa.ipc.open_stream(source))
                for batch in stream:
                    yield Batch(batch.select(columns), self.path, row)
                    row += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot be read after row {row} ({short(exc)})", path=self.path) from None
        if row == 0:
            raise InputError("has no rows: there is nothing to analyze", path=self.path)
