"""JSON Lines files (one JSON object per response): the reader behind the JSONL, NeMo-RL and prime-rl formats.

The first record tells which keys exist and what they hold (a list of numbers, a number, a string); the file is
then parsed a few thousand records at a time into Arrow record batches with those keys as columns, so the column
mapping, type checks and chunking are those of every other table. Errors name the 0-based record index (blank
lines are not records), as every other format names its row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap
from rcdiag.io.limits import JSON_LINE_CHARS
from rcdiag.io.paths import open_text
from rcdiag.io.record_batches import Batch
from rcdiag.io.tables import TableFile


def unwrap(value: Any) -> Any:
    """``[[...]]`` (a batch of one, as NeMo-RL's logger writes tensors) -> ``[...]``; ``[x]`` stays."""
    while isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    return value


def _kind(value: Any) -> pa.DataType | None:
    value = unwrap(value)
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value[:64]):
        return pa.list_(pa.float64())
    return None


def records(path: str) -> Iterator[tuple[int, dict]]:
    """``(record index, record)`` of every non-blank line; a line beyond ``JSON_LINE_CHARS`` is refused before it
    is read whole (``readline`` with a bound: a line of hundreds of MB never reaches memory at once)."""
    limit = JSON_LINE_CHARS.value
    with open_text(path) as handle:
        index = 0
        while line := handle.readline(limit + 1 if limit else -1):
            if limit and len(line) > limit and not line.endswith("\n"):
                raise InputError(
                    f"is a line of more than {limit:,} characters, beyond rcdiag's limit for one record; if the file "
                    f"is genuine and memory allows, raise it: {JSON_LINE_CHARS.variable}=<characters>",
                    path=path,
                    row=index,
                )
            if line.strip():
                yield index, _parse(line, path, index)
                index += 1


def first_keys(path: Path) -> set[str]:
    """The keys of the first record, or nothing when the file is no JSONL (for recognising a format)."""
    try:
        for _, record in records(str(path)):
            return set(record)
    except (OSError, UnicodeDecodeError, InputError):
        return set()
    return set()


class JsonRecordsFile(TableFile):
    """A JSONL file; ``step`` (with ``step_origin``) is every row's step when the container says it,
    ``mask_factor`` names a per-record 0/1 key that multiplies the mask (NeMo-RL's ``sample_loss_mask``)."""

    def __init__(
        self,
        path: str | Path,
        columns: ColumnMap | None = None,
        *,
        format: str,
        step: int | None = None,
        step_origin: str = "file name",
        mask_factor: str | None = None,
    ) -> None:
        name = str(path)
        try:
            first = next((record for _, record in records(name)), None)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot be read ({exc})", path=name) from None
        if first is None:
            raise InputError("has no records: there is nothing to analyze", path=name)
        fields = [(key, kind) for key, value in first.items() if (kind := _kind(value)) is not None]
        super().__init__(name, columns, format=format, schema=pa.schema(fields), step=step, step_origin=step_origin)
        self.mask_factor = mask_factor
        if self.cols.mask is not None and mask_factor is not None and mask_factor in first:
            self.columns_used["response_mask"] = f"{self.cols.mask} * {mask_factor}"
        else:
            self.mask_factor = None

    def batches(self, chunk_tokens: int, columns: list[str], part: Any = None) -> Iterator[Batch]:
        batch: list[dict] = []
        tokens = 0
        first_row = 0
        for row, record in records(self.path):
            if not batch:
                first_row = row
            batch.append(record)
            value = unwrap(record.get(self.cols.old))
            tokens += len(value) if isinstance(value, list) else 1
            if tokens >= chunk_tokens:
                yield self._batch(batch, columns, first_row)
                batch, tokens = [], 0
        if batch:
            yield self._batch(batch, columns, first_row)

    def _batch(self, rows: list[dict], columns: list[str], first_row: int) -> Batch:
        arrays = [self._column(rows, name, first_row) for name in columns]
        if self.mask_factor is not None and self.cols.mask in columns:
            index = columns.index(self.cols.mask)
            factor = np.array(
                [_number(unwrap(r.get(self.mask_factor, 1)), self.path, first_row + i, self.mask_factor)
                 for i, r in enumerate(rows)],
                dtype=np.float64,
            )  # fmt: skip
            mask = arrays[index]
            lengths = np.diff(np.asarray(mask.offsets))
            values = mask.values.to_numpy(zero_copy_only=False) * np.repeat(factor, lengths)
            arrays[index] = pa.ListArray.from_arrays(mask.offsets, pa.array(values))
        return Batch(pa.RecordBatch.from_arrays(arrays, names=columns), self.path, first_row, self.step)

    def _column(self, rows: list[dict], name: str, first_row: int) -> pa.Array:
        kind = self.schema.field(name).type
        values = []
        for i, record in enumerate(rows):
            if name not in record:
                raise InputError(
                    "is missing from this record (it is in the first one)",
                    path=self.path,
                    row=first_row + i,
                    column=name,
                )
            values.append(unwrap(record[name]))
        if pa.types.is_list(kind):
            for i, value in enumerate(values):
                if not isinstance(value, list):
                    raise InputError(
                        f"holds {type(value).__name__}, expected a list of numbers",
                        path=self.path,
                        row=first_row + i,
                        column=name,
                    )
        try:
            return pa.array(values, type=kind)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputError(
                f"cannot be read as {kind} ({str(exc).splitlines()[0][:120]})",
                path=self.path,
                row=first_row + _first_unconvertible(values, kind),
                column=name,
            ) from None


def _first_unconvertible(values: list, kind: pa.DataType) -> int:
    """The index of the first value Arrow cannot convert to ``kind`` (found by halving: few conversions)."""
    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _converts(values[lo:mid], kind):
            lo = mid
        else:
            hi = mid
    return lo


def _converts(values: list, kind: pa.DataType) -> bool:
    try:
        pa.array(values, type=kind)
    except (pa.ArrowException, TypeError, ValueError):
        return False
    return True


def _parse(line: str, path: str, row: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"is not valid JSON ({exc.msg} at column {exc.colno}); is the file complete?", path=path, row=row
        ) from None
    if not isinstance(record, dict):
        raise InputError(f"is a JSON {type(record).__name__}, expected an object per line", path=path, row=row)
    return record


def _number(value: Any, path: str, row: int, column: str) -> float:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, (int, float)):
        raise InputError(f"holds {value!r}, expected a number", path=path, row=row, column=column)
    return float(value)
