"""Arrow IPC dumps: the file format (``.arrow``, ``.feather`` v2) and the stream format (``.arrows``).

Both are read batch by batch; the file format is memory-mapped, so only the batches being converted are paged in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap
from rcdiag.io.parquet import schema_metadata
from rcdiag.io.tables import Batch, TableSource, short

FILE_MAGIC = b"ARROW1"


class ArrowIpcSource(TableSource):
    """An Arrow IPC file or stream (recognised by its first bytes, whatever the suffix)."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        self.path = str(path)
        with open(self.path, "rb") as handle:
            self.is_file = handle.read(6) == FILE_MAGIC
        self.format = "arrow-ipc-file" if self.is_file else "arrow-ipc-stream"
        try:
            if self.is_file:
                reader = pa.ipc.open_file(pa.memory_map(self.path))
                self.schema = reader.schema
                self.total_rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            else:
                with pa.OSFile(self.path) as handle:
                    self.schema = pa.ipc.open_stream(handle).schema
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot be read as Arrow IPC ({short(exc)}); is it a complete .arrow/.feather file?", path=self.path
            ) from None
        if self.total_rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=self.path)
        self.kv_metadata = schema_metadata(self.schema)
        self.setup(columns)

    def batches(self, chunk_tokens: int, columns: list[str]) -> Iterator[Batch]:
        row = 0
        try:
            if self.is_file:
                reader = pa.ipc.open_file(pa.memory_map(self.path))
                stream = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                stream = iter(pa.ipc.open_stream(pa.OSFile(self.path)))
            for batch in stream:
                yield Batch(batch.select(columns), self.path, row)
                row += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot be read after row {row} ({short(exc)})", path=self.path) from None
        if row == 0:
            raise InputError("has no rows: there is nothing to analyze", path=self.path)
