"""A Parquet file: the canonical dump, one row per response (or one per token, in the long layout).

The file is streamed with a 1 MiB read buffer, so memory stays flat even when the whole file is one row group; in
object storage the same reads are byte-range requests of 8 MiB (the footer, then each row group's column chunks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.io.base import ColumnMap, balanced_runs
from rcdiag.io.parquet_footer import read_footer
from rcdiag.io.paths import arrow_input, read_buffer
from rcdiag.io.record_batches import Batch, check_group_rows
from rcdiag.io.tables import TableFile, schema_metadata, short
from rcdiag.runtime.errors import InputError

READ_BUFFER = 1 << 20
GROUPS_AHEAD = 2
"""Row groups decoded at the same time (each with pyarrow's threads)."""
WHOLE_GROUP_CHUNKS = 4
"""Row groups of at most this many chunks of tokens are decoded whole; larger ones are streamed in batches."""


class ParquetFile(TableFile):
    """One Parquet file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        name = str(path)
        try:
            # pre_buffer=False: pyarrow's default pre-buffering keeps every column chunk read so far in memory
            # until the file is closed (RSS grows with the file: 178 MB held for a 178 MB dump).
            source = arrow_input(name)
            self.file = pq.ParquetFile(source, buffer_size=read_buffer(name, READ_BUFFER), pre_buffer=False)
            schema = self.file.schema_arrow
            schema.names  # noqa: B018 - column names that are not UTF-8 fail here, as a damaged file
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"cannot be read as Parquet ({short(exc)}); is it a complete .parquet file?", path=name
            ) from None
        self.footer = read_footer(source, self.file.metadata, name)
        rows = self.file.metadata.num_rows
        if rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=name)
        super().__init__(
            name, columns, format="parquet", schema=schema, kv_metadata=schema_metadata(schema), total_rows=rows
        )
        self.leaf = self._old_leaf()

    def _rows_per_batch(self, chunk_tokens: int) -> int:
        if self.long:
            return max(chunk_tokens, 1)
        leaf = self.leaf
        values = sum(chunks[leaf].num_values for chunks in self.footer.chunks) if leaf is not None else 0
        mean_length = max(values / max(self.footer.num_rows, 1), 1.0)
        return int(min(max(chunk_tokens / mean_length, 1), 1 << 20))

    def partitions(self, n: int) -> list[tuple[int, ...] | None]:
        """Up to ``n`` contiguous runs of row groups of about equal size, for parallel workers."""
        meta = self.file.metadata
        if n < 2:
            return [None]
        return [*balanced_runs([meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)], n)]

    def batches(self, chunk_tokens: int, columns: list[str], part: tuple[int, ...] | None = None) -> Iterator[Batch]:
        """Record batches of the whole file, or of a part: a run of contiguous row groups from ``partitions``.

        Row groups of at most ``WHOLE_GROUP_CHUNKS`` chunks are decoded whole, ``GROUPS_AHEAD`` at a time (each
        with pyarrow's threads) and handed on in order: one row group's columns keep about 1.7 of 2 cores busy,
        two keep both, so decoding fills the core the maths leaves (analyze with sequence IS and two RS options
        went from about 0.7 to 0.8 of a bare decode). Larger row groups are streamed batch by batch, so memory
        stays flat even when the whole file is one row group."""
        groups = list(part) if part is not None else list(range(len(self.footer.group_rows)))
        for group in groups if not self.long else ():  # a response beyond the limit is refused before decoding
            check_group_rows(self._group_tokens(group), self.footer.group_rows[group], self.path, group)
        row = sum(self.footer.group_rows[: part[0]]) if part else 0
        rows_per_batch = self._rows_per_batch(chunk_tokens)
        if all(self._group_tokens(g) <= WHOLE_GROUP_CHUNKS * chunk_tokens for g in groups):
            batches = self._whole_groups(groups, columns, rows_per_batch)
        else:
            batches = self.file.iter_batches(
                batch_size=rows_per_batch, row_groups=groups, columns=columns, use_threads=True
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

    def _group_tokens(self, group: int) -> int:
        """Values of the trainer log-prob column in a row group (its rows, in the long layout)."""
        if self.long:
            return self.footer.group_rows[group]
        leaf = self.leaf
        return self.footer.chunks[group][leaf].num_values if leaf is not None else self.footer.group_rows[group]

    def _old_leaf(self) -> int | None:
        """The Parquet leaf column of the trainer log-probs, by the schema (a column chunk's own path in the footer
        may be anything, even bytes that are not UTF-8)."""
        schema = self.file.metadata.schema
        return next((i for i in range(len(schema)) if schema.column(i).path.split(".")[0] == self.cols.old), None)

    def _whole_groups(self, groups: list[int], columns: list[str], rows_per_batch: int) -> Iterator[pa.RecordBatch]:
        """The row groups' batches in order, ``GROUPS_AHEAD`` groups decoding at once, each on its own reader of
        the file (a pyarrow reader is not shared between threads)."""
        readers = [self.file] + [
            pq.ParquetFile(
                arrow_input(self.path),
                metadata=self.file.metadata,
                buffer_size=read_buffer(self.path, READ_BUFFER),
                pre_buffer=False,
            )
            for _ in range(min(GROUPS_AHEAD, len(groups)) - 1)
        ]
        with ThreadPoolExecutor(max_workers=len(readers) or 1, thread_name_prefix="rcdiag-decode") as pool:
            pending: deque[Future] = deque()
            for i, group in enumerate(groups):
                reader = readers[i % len(readers)]
                pending.append(pool.submit(reader.read_row_group, group, columns=columns, use_threads=True))
                if len(pending) == len(readers):
                    yield from pending.popleft().result().to_batches(max_chunksize=rows_per_batch)
            while pending:
                yield from pending.popleft().result().to_batches(max_chunksize=rows_per_batch)
