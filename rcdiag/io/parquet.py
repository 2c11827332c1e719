"""The canonical dump: a Parquet file with one row per response.

Columns: ``old_log_prob`` and ``rollout_log_prob`` as ``list<float32|float64>``, optional ``response_mask`` as
``list<int|bool>`` (absent = all ones), optional integer ``step``. The file is streamed with a 1 MiB read
buffer, so memory stays flat even when the whole file is one row group.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.errors import InputError
from rcdiag.io.arrow_lists import (
    check_logprob_type,
    check_mask_type,
    check_same_lengths,
    check_step_type,
    flatten_list,
    float_values,
    mask_values,
)
from rcdiag.io.base import DEFAULT_CHUNK_TOKENS, Chunk, ColumnMap, Source, SourceInfo, split_rows

READ_BUFFER = 1 << 20


class ParquetSource(Source):
    """A canonical Parquet dump."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        self.path = str(path)
        self.columns = columns or ColumnMap()
        if not Path(path).exists():
            raise InputError("file not found", path=self.path)
        try:
            # pre_buffer=False: pyarrow's default pre-buffering keeps every column chunk read so far in memory
            # until the file is closed (RSS grows with the file: 178 MB held for a 178 MB dump).
            self.file = pq.ParquetFile(self.path, buffer_size=READ_BUFFER, pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot be read as Parquet ({_short(exc)}); is it a complete .parquet file?", path=self.path
            ) from None
        if self.file.metadata.num_rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=self.path)
        schema = self.file.schema_arrow
        names = set(schema.names)
        cols = self.columns
        missing = [name for name in (cols.old, cols.rollout) if name not in names]
        if missing:
            raise InputError(
                f"has no column {', '.join(repr(m) for m in missing)} (columns present: "
                f"{', '.join(schema.names) or 'none'}); a dump needs per-token log-probs from the trainer "
                f"('{ColumnMap.old}') and the rollout engine ('{ColumnMap.rollout}')",
                path=self.path,
            )
        check_logprob_type(schema.field(cols.old).type, cols.old, self.path)
        check_logprob_type(schema.field(cols.rollout).type, cols.rollout, self.path)
        self.has_mask = cols.mask in names
        self.has_step = cols.step in names
        if self.has_mask:
            check_mask_type(schema.field(cols.mask).type, cols.mask, self.path)
        if self.has_step:
            check_step_type(schema.field(cols.step).type, cols.step, self.path)
        metadata = {
            key.decode(errors="replace"): value.decode(errors="replace")
            for key, value in (schema.metadata or {}).items()
            if not key.startswith(b"ARROW:") and key != b"pandas"
        }
        self.info = SourceInfo(
            path=self.path,
            format="parquet",
            columns={
                "old_log_prob": cols.old,
                "rollout_log_prob": cols.rollout,
                "response_mask": cols.mask if self.has_mask else None,
                "step": cols.step if self.has_step else None,
            },
            dtypes={name: str(schema.field(name).type) for name in self._read_columns()},
            metadata=metadata,
        )

    def _read_columns(self) -> list[str]:
        cols = self.columns
        names = [cols.old, cols.rollout]
        if self.has_mask:
            names.append(cols.mask)
        if self.has_step:
            names.append(cols.step)
        return names

    def _rows_per_batch(self, chunk_tokens: int) -> int:
        meta = self.file.metadata
        if meta.num_rows == 0:
            return 1024
        leaf = next(
            (i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == self.columns.old),
            None,
        )
        values = (
            sum(meta.row_group(g).column(leaf).num_values for g in range(meta.num_row_groups))
            if leaf is not None
            else 0
        )
        mean_length = max(values / meta.num_rows, 1.0)
        return int(min(max(chunk_tokens / mean_length, 1), 1 << 20))

    def partitions(self, n: int) -> list[tuple[int, ...]]:
        """Up to ``n`` contiguous runs of row groups of about equal size, for parallel workers."""
        meta = self.file.metadata
        sizes = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
        total = sum(sizes) or 1
        parts: list[list[int]] = [[]]
        done = 0
        for group, size in enumerate(sizes):
            if parts[-1] and done >= total * len(parts) / n and len(parts) < n:
                parts.append([])
            parts[-1].append(group)
            done += size
        return [tuple(part) for part in parts if part]

    def chunks(self, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, part: tuple[int, ...] | None = None) -> Iterator[Chunk]:
        """Chunks of the whole file, or of a part: a run of contiguous row groups from ``partitions``."""
        row_groups = part
        meta = self.file.metadata
        row = sum(meta.row_group(g).num_rows for g in range(row_groups[0])) if row_groups else 0
        batches = self.file.iter_batches(
            batch_size=self._rows_per_batch(chunk_tokens),
            row_groups=list(row_groups) if row_groups is not None else None,
            columns=self._read_columns(),
            use_threads=True,
        )
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise InputError(f"cannot be read after row {row} ({_short(exc)})", path=self.path) from None
            yield from self._batch_chunks(batch, row, chunk_tokens)
            row += batch.num_rows

    def _batch_chunks(self, batch: pa.RecordBatch, row: int, chunk_tokens: int) -> Iterator[Chunk]:
        cols, path = self.columns, self.path
        offsets, old_values = flatten_list(batch.column(cols.old), cols.old, path, row)
        rollout_offsets, rollout_values = flatten_list(batch.column(cols.rollout), cols.rollout, path, row)
        check_same_lengths(offsets, rollout_offsets, (cols.old, cols.rollout), path, row)
        mask = None
        if self.has_mask:
            mask_offsets, mask_arrow = flatten_list(batch.column(cols.mask), cols.mask, path, row)
            check_same_lengths(offsets, mask_offsets, (cols.old, cols.mask), path, row)
            mask = mask_values(mask_arrow, offsets, cols.mask, path, row)
        steps = None
        if self.has_step:
            step_column = batch.column(cols.step)
            if step_column.null_count:
                null_row = int(np.flatnonzero(~np.asarray(step_column.is_valid()))[0])
                raise InputError("is null; every row needs a step", path=path, row=row + null_row, column=cols.step)
            steps = step_column.to_numpy().astype(np.int64, copy=False)
        old = float_values(old_values)
        rollout = float_values(rollout_values)
        lengths = np.diff(offsets)
        for start, stop in split_rows(lengths, chunk_tokens):
            lo, hi = int(offsets[start]), int(offsets[stop])
            yield Chunk(
                old=old[lo:hi],
                rollout=rollout[lo:hi],
                offsets=offsets[start : stop + 1] - lo,
                mask=None if mask is None else mask[lo:hi],
                steps=None if steps is None else steps[start:stop],
                first_row=row + start,
                source=path,
                column_names=(cols.old, cols.rollout),
            )


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
