"""A Parquet file: the canonical dump, one row per response (or one per token, in the long layout).

Row groups of up to ``GROUP_CHUNKS`` chunks are decoded whole, ``PARALLEL_GROUPS`` at a time by a small thread
pool (pyarrow releases the GIL while it decodes), and handed on in file order: on two cores decoding then keeps
both busy while the engine's maths runs. A larger row group is streamed in batches with a 1 MiB read buffer, so
memory stays flat even when the whole file is one row group.
"""

from __future__ import annotations

import itertools
import queue
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap, balanced_runs
from rcdiag.io.batch import Batch
from rcdiag.io.tables import TableFile, schema_metadata, short

READ_BUFFER = 1 << 20
PARALLEL_GROUPS = 2
"""Row groups decoded at once (each by one thread; docs/performance.md)."""
GROUP_CHUNKS = 2
"""A row group holding up to this many chunks' worth of values is decoded whole; a larger one is streamed."""


class ParquetFile(TableFile):
    """One Parquet file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        name = str(path)
        try:
            self.file = _open(name)
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
        mean_length = max(sum(self._group_values()) / max(self.file.metadata.num_rows, 1), 1.0)
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
        groups = list(part) if part is not None else list(range(meta.num_row_groups))
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        firsts = [0, *itertools.accumulate(rows)]
        row = firsts[groups[0]] if groups else 0
        values = self._group_values()
        limit = GROUP_CHUNKS * max(chunk_tokens, 1)
        with _GroupReader(self.path, columns, firsts) as reader:
            for g, table in reader.tables(groups, lambda g: values[g] <= limit):
                if table is None:  # too large to decode whole: stream it
                    yield from self._stream(g, chunk_tokens, columns, row)
                else:
                    start = row
                    for batch in table.to_batches():
                        yield Batch(batch, self.path, start)
                        start += batch.num_rows
                row += rows[g]

    def _group_values(self) -> list[int]:
        """List values of the log-prob column per row group (rows in the long layout)."""
        meta = self.file.metadata
        leaf = next(
            (i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == self.cols.old),
            None,
        )
        if self.long or leaf is None:
            return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        return [meta.row_group(g).column(leaf).num_values for g in range(meta.num_row_groups)]

    def _stream(self, group: int, chunk_tokens: int, columns: list[str], row: int) -> Iterator[Batch]:
        batches = self.file.iter_batches(
            batch_size=self._rows_per_batch(chunk_tokens), row_groups=[group], columns=columns, use_threads=True
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


def _open(path: str) -> pq.ParquetFile:
    # pre_buffer=False: pyarrow's default pre-buffering keeps every column chunk read so far in memory until the
    # file is closed (RSS grows with the file: 178 MB held for a 178 MB dump).
    return pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)


class _GroupReader:
    """Decodes row groups ``PARALLEL_GROUPS`` at a time and yields them in order. Each thread has its own open
    file, so no reader is shared between threads; at most ``PARALLEL_GROUPS`` decoded groups wait at once."""

    def __init__(self, path: str, columns: list[str], firsts: list[int]) -> None:
        self.path = path
        self.columns = columns
        self.firsts = firsts
        self.pool = ThreadPoolExecutor(PARALLEL_GROUPS, thread_name_prefix="rcdiag-decode")
        self.files: queue.SimpleQueue[pq.ParquetFile] = queue.SimpleQueue()
        self.pending: deque[tuple[int, Future]] = deque()

    def __enter__(self) -> _GroupReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _read(self, group: int) -> pa.Table:
        try:
            file = self.files.get_nowait()
        except queue.Empty:
            file = _open(self.path)
        try:
            return file.read_row_group(group, columns=self.columns, use_threads=False)
        finally:
            self.files.put(file)

    def tables(self, groups: list[int], whole: object) -> Iterator[tuple[int, pa.Table | None]]:
        """``(group, table)`` in order; ``table`` is ``None`` for a group ``whole(group)`` says to stream."""
        for group in groups:
            if whole(group):  # type: ignore[operator]
                self.pending.append((group, self.pool.submit(self._read, group)))
                if len(self.pending) > PARALLEL_GROUPS:
                    yield self._next()
            else:
                while self.pending:
                    yield self._next()
                yield group, None
        while self.pending:
            yield self._next()

    def _next(self) -> tuple[int, pa.Table]:
        group, future = self.pending.popleft()
        try:
            return group, future.result()
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"cannot be read after row {self.firsts[group]} ({short(exc)})", path=self.path) from None
