"""The long layout: one row per token, a sequence-id column saying which response each token belongs to.

Rows of a sequence may be anywhere: interleaved with other sequences, across record batches and across files.
Metrics need whole sequences, so tokens are grouped by sequence id before any chunk is made:

* a dump of at most ``IN_MEMORY_FACTOR * chunk_tokens`` rows is grouped in memory with one stable sort;
* a larger one is hash-partitioned by sequence id into bucket files (Arrow IPC streams in anonymous temporary
  files: unlinked as they are created, so nothing is left on disk whatever ends the process, SIGTERM and SIGKILL
  included), then each bucket is loaded and sorted on its own. Peak memory is one bucket: about
  ``BUCKET_FACTOR * chunk_tokens`` rows when the row count is known before reading (Parquet, Arrow IPC files
  and directories of them), otherwise the dump divided into ``UNKNOWN_TOTAL_BUCKETS`` buckets. There are never
  more than ``MAX_SPILL_BUCKETS`` buckets (one open file each), and fewer where the limit on open files
  (``ulimit -n``) allows fewer: a small ``--chunk-tokens`` makes buckets larger instead of opening a file per few
  tokens. The temporary files take about as much disk as the columns read.

Within a sequence, tokens keep the order in which they appear in the dump; no metric depends on that order.
"""

from __future__ import annotations

import errno
import math
import tempfile
import zlib
from collections.abc import Iterator
from typing import IO

import numpy as np
import pyarrow as pa

from rcdiag.io.arrow_lists import float_values
from rcdiag.io.base import Chunk
from rcdiag.io.columns import Resolved
from rcdiag.io.limits import MAX_SPILL_BUCKETS
from rcdiag.io.open_files import ensure_open_files, room
from rcdiag.io.record_batches import (
    Batch,
    exact_steps,
    id_array,
    loss_values,
    mask_array,
    slice_chunks,
    token_values,
)
from rcdiag.runtime.errors import InputError

IN_MEMORY_FACTOR = 4
BUCKET_FACTOR = 2
UNKNOWN_TOTAL_BUCKETS = 64
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def group_sequences(
    batches: Iterator[Batch], cols: Resolved, path: str, chunk_tokens: int, total_rows: int | None
) -> Iterator[Chunk]:
    """Chunks of whole sequences from token rows in any order."""
    limit = IN_MEMORY_FACTOR * chunk_tokens
    held: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        check_nulls(batch, cols)
        held.append(batch.data)
        rows += batch.data.num_rows
        if rows > limit:
            break
    else:
        if rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=path)
        yield from bucket_chunks(pa.Table.from_batches(held), cols, path, chunk_tokens)
        return
    n_buckets = max(2, math.ceil(total_rows / (BUCKET_FACTOR * chunk_tokens))) if total_rows else UNKNOWN_TOTAL_BUCKETS
    free = room()
    n_buckets = max(2, min(n_buckets, MAX_SPILL_BUCKETS, free if free is not None else n_buckets))
    ensure_open_files(n_buckets, "temporary files to group the long layout's tokens by sequence", path, hint=".")
    spill = _Spill(n_buckets, cols.seq or "", path)
    try:
        for data in held:
            spill.add(data)
        held.clear()
        for batch in batches:
            check_nulls(batch, cols)
            spill.add(batch.data)
        for table in spill.tables():
            yield from bucket_chunks(table, cols, path, chunk_tokens)
    finally:
        spill.close()


def check_nulls(batch: Batch, cols: Resolved) -> None:
    """A null in a used column is an ``InputError`` naming the file and row (known only before grouping)."""
    for name in (cols.old, cols.rollout, cols.mask, cols.step, cols.seq, cols.token):
        if name is None:
            continue
        column = batch.data.column(name)
        if column.null_count:
            row = int(np.flatnonzero(~np.asarray(column.is_valid()))[0])
            raise InputError(
                "is null; every token row needs a value", path=batch.path, row=batch.first_row + row, column=name
            )


class _Spill:
    """Hash-partition token rows by sequence id into Arrow IPC streams, one anonymous temporary file per bucket."""

    def __init__(self, n_buckets: int, seq: str, path: str) -> None:
        self.n_buckets = n_buckets
        self.seq = seq
        self.path = path
        self.files: dict[int, IO[bytes]] = {}
        self.writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}

    def add(self, data: pa.RecordBatch) -> None:
        buckets = bucket_of(data.column(self.seq), self.n_buckets)
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        data = data.take(pa.array(order))
        bounds = np.flatnonzero(np.diff(sorted_buckets)) + 1
        starts = np.concatenate([[0], bounds])
        stops = np.concatenate([bounds, [len(sorted_buckets)]])
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            if stop > start:
                self._writer(int(sorted_buckets[start]), data.schema).write_batch(data.slice(start, stop - start))

    def _writer(self, bucket: int, schema: pa.Schema) -> pa.ipc.RecordBatchStreamWriter:
        writer = self.writers.get(bucket)
        if writer is None:
            try:
                file = self.files[bucket] = tempfile.TemporaryFile(prefix="rcdiag-long-")  # noqa: SIM115 (closed in close)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                raise InputError(
                    f"cannot open temporary bucket file {len(self.files) + 1} of {self.n_buckets} ({exc.strerror}); "
                    "raise the limit on open files (ulimit -n)",
                    path=self.path,
                ) from None
            writer = self.writers[bucket] = pa.ipc.new_stream(pa.PythonFile(file, mode="w"), schema)
        return writer

    def tables(self) -> Iterator[pa.Table]:
        for writer in self.writers.values():
            writer.close()
        for bucket in sorted(self.files):
            file = self.files.pop(bucket)
            try:
                file.seek(0)
                table = pa.ipc.open_stream(pa.PythonFile(file, mode="r")).read_all()
            finally:
                file.close()
            yield table

    def close(self) -> None:
        """Close (and so free) every bucket file still open: on failure, or when the reader is abandoned."""
        for file in self.files.values():
            file.close()
        self.files.clear()


def bucket_of(seq: pa.Array, n_buckets: int) -> np.ndarray:
    """A bucket per row, the same for equal ids in any batch or file."""
    if pa.types.is_integer(seq.type):
        ids = seq.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
        return ((ids * _GOLDEN) >> np.uint64(33)) % np.uint64(n_buckets)
    encoded = seq.dictionary_encode()
    per_value = np.array(
        [zlib.crc32(str(v).encode()) % n_buckets for v in encoded.dictionary.to_pylist()], dtype=np.uint64
    )
    return per_value[encoded.indices.to_numpy(zero_copy_only=False)]


def bucket_chunks(table: pa.Table, cols: Resolved, path: str, chunk_tokens: int) -> Iterator[Chunk]:
    """Group one bucket's tokens by sequence (stable: dump order within a sequence) and yield whole sequences."""
    import pyarrow.compute as pc  # here, not at the top: every other dump's run is spared its import (25-60 ms)

    seq_name = cols.seq or ""
    table = table.combine_chunks()
    table = table.take(pc.sort_indices(table, sort_keys=[(seq_name, "ascending")]))
    seq = table.column(seq_name).to_numpy()
    n = seq.shape[0]
    if n == 0:
        return
    starts = np.concatenate([[0], np.flatnonzero(seq[1:] != seq[:-1]) + 1]).astype(np.int64)
    offsets = np.concatenate([starts, [n]]).astype(np.int64)
    seq_ids = seq[starts]
    old = float_values(table.column(cols.old).combine_chunks())
    rollout = float_values(table.column(cols.rollout).combine_chunks())
    mask = mask_array(table.column(cols.mask).combine_chunks()) if cols.mask is not None else None
    steps = None
    if cols.step is not None:
        token_steps = exact_steps(table.column(cols.step).to_numpy())
        changes = np.flatnonzero(token_steps[1:] != token_steps[:-1]) + 1
        inside = changes[~np.isin(changes, starts)]
        if inside.size:
            at = int(inside[0])
            row = int(np.searchsorted(offsets, at, side="right") - 1)
            raise InputError(
                f"has tokens at steps {int(token_steps[at - 1])} and {int(token_steps[at])}; all tokens of a "
                "sequence belong to one step (are sequence ids reused across steps? make them unique)",
                path=path,
                column=cols.step,
                sequence=_plain(seq_ids[row]),
            )
        steps = token_steps[starts]
    ids = seq_ids if cols.id in (None, cols.seq) else id_array(table.column(cols.id).combine_chunks())[starts]
    labels = {name: id_array(table.column(name).combine_chunks())[starts] for name in cols.labels} or None
    tokens = None
    if cols.token is not None:
        tokens = token_values(table.column(cols.token).combine_chunks(), cols.token, path, None)
    inputs = {key: loss_values(table.column(name)) for key, name in cols.loss_inputs().items()}
    yield from slice_chunks(
        old,
        rollout,
        offsets,
        mask,
        steps,
        cols,
        path,
        chunk_tokens,
        first_row=None,
        seq_ids=seq_ids,
        ids=ids,
        tokens=tokens,
        labels=labels,
        loss_inputs=inputs or None,
    )


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value
