"""A Parquet file: the canonical dump, one row per response (or one per token, in the long layout).

The file is streamed with a 1 MiB read buffer, so memory stays flat even when the whole file is one row group; in
object storage the same reads are byte-range requests of 8 MiB (the footer, then each row group's column chunks).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap, balanced_runs
from rcdiag.io.batch import Batch
from rcdiag.io.paths import arrow_input, read_buffer
from rcdiag.io.tables import TableFile, schema_metadata, short

READ_BUFFER = 1 << 20


class ParquetFile(TableFile):
    """One Parquet file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        name = str(path)
        try:
            # pre_buffer=False: pyarrow's default pre-buffering keeps every column chunk read so far in memory
            # until the file is closed (RSS grows with the file: 178 MB held for a 178 MB dump).
            self.file = pq.ParquetFile(arrow_input(name), buffer_size=read_buffer(name, READ_BUFFER), pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot be read as Parquet ({short(exc)}); is it a complete .parquet file?", path=name
            ) from None
        rows = self.file.metadata.num_rows
        if rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=name)
        schema = self.file.schema_arrow
        super().__init__(
            name, columns, format="parquet", schema=schema, kv_metadata=schema_metadata(schema), total_rows=rows
        )

    def _rows_per_batch(self, chunk_tokens: int) -> int:
        if self.long:
            return max(chunk_tokens, 1)
        meta = self.file.metadata
        leaf = next(
            (i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == self.cols.old),
            None,
        )
        values = (
            sum(meta.row_group(g).column(leaf).num_values for g in range(meta.num_row_groups))
            if leaf is not None
            else 0
        )
        mean_length = max(values / max(meta.num_rows, 1), 1.0)
        return int(min(max(chunk_tokens / mean_length, 1), 1 << 20))

    def partitions(self, n: int) -> list[tuple[int, ...] | None]:
        """Up to ``n`` contiguous runs of row groups of about equal size, for parallel workers."""
        meta = self.file.metadata
        if n < 2:
            return [None]
        return balanced_runs([meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)], n)

    def batches(self, chunk_tokens: int, columns: list[str], part: tuple[int, ...] | None = None) -> Iterator[Batch]:
        """Record batches of the whole file, or of a part: a run of contiguous row groups from ``partitions``."""
        meta = self.file.metadata
        row = sum(meta.row_group(g).num_rows for g in range(part[0])) if part else 0
        batches = self.file.iter_batches(
            batch_size=self._rows_per_batch(chunk_tokens),
            row_groups=list(part) if part is not None else None,
            columns=columns,
            use_threads=True,
        )
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise InputError(f"cannot be read after row {row} ({short(exc)})", path=self.path) from None
            yield Batch(batch, self.path, row)
            row += batch.num_rows
