"""JSON Lines files (one JSON object per response): the reader behind the JSONL, NeMo-RL and prime-rl formats.

The first record tells which keys exist and what they hold (a list of numbers, a number, a string); the file is
then parsed a few thousand records at a time into Arrow record batches with those keys as columns, so the column
mapping, type checks and chunking are those of every other table. Errors name the 0-based record index (blank
lines are not records), as every other format names its row.

A record is parsed only within bounds Python's parser does not keep itself (docs/input.md, "Limits"): nesting at
most ``MAX_JSON_DEPTH`` deep (measured before parsing: deeper would overflow the parser's recursion), no integer of
more digits than Python converts, and no key twice in one object (which value would be read is not the file's
to decide). Each is one error naming the file and record, whichever key holds it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rcdiag.io.base import ColumnMap
from rcdiag.io.limits import JSON_LINE_CHARS, MAX_JSON_DEPTH
from rcdiag.io.paths import open_text
from rcdiag.io.record_batches import Batch
from rcdiag.io.tables import TableFile
from rcdiag.runtime.errors import InputError


def unwrap(value: Any) -> Any:
    """``[[...]]`` (a batch of one, as NeMo-RL's logger writes tensors) -> ``[...]``; ``[x]`` stays."""
    while isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    return value


def _kind(value: Any, nulls: bool = False) -> pa.DataType:
    """The column type a first record's value gives its key; a value no column type fits (an object, a null, a
    list of strings) still makes a column (of nulls), so that a log-prob key holding one is refused for what it
    holds (``_odd_value``), never reported missing. ``nulls``: a list of numbers may hold nulls (prime-rl's
    non-finite values)."""
    value = unwrap(value)
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    numbers = (int, float, type(None)) if nulls else (int, float)
    if isinstance(value, list) and all(isinstance(v, numbers) for v in value[:64]):
        return pa.list_(pa.float64())
    return pa.list_(pa.null())  # a list of other things, an object, a null: refused if used, by _odd_value


PLURALS = {"str": "strings", "list": "lists", "dict": "objects", "NoneType": "nulls"}


def _odd_value(value: Any) -> str | None:
    """What a first record's value holds when it is neither a number, a string nor a list of numbers: a list of
    strings (``strings ("a" at position 0)``), a list of lists, an object, a null; else ``None``."""
    value = unwrap(value)
    if isinstance(value, list):
        at = next((i for i, v in enumerate(value) if isinstance(v, bool) or not isinstance(v, (int, float))), None)
        if at is None or isinstance(value[at], bool):
            return None
        kind = type(value[at]).__name__
        return f"{PLURALS.get(kind, kind + ' values')} ({_short(value[at])} at position {at})"
    if value is None or isinstance(value, dict):
        return "null" if value is None else "an object"
    return None


def _short(value: Any) -> str:
    """A value from the file as JSON, shortened for a message (the CLI escapes it for the terminal)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    ``mask_factor`` names a per-record 0/1 key that multiplies the mask (NeMo-RL's ``sample_loss_mask``);
    ``null_floats``: a null among a response's log-probs is a non-finite value whose kind the writer dropped,
    read as NaN (so ``--on-bad-row`` decides at a valid position), counted per column and said in a notice."""

    def __init__(
        self,
        path: str | Path,
        columns: ColumnMap | None = None,
        *,
        format: str,
        step: int | None = None,
        step_origin: str = "file name",
        mask_factor: str | None = None,
        null_floats: bool = False,
    ) -> None:
        name = str(path)
        self.null_floats = null_floats
        self.nulls = NullCount()
        try:
            first = next((record for _, record in records(name)), None)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot be read ({exc})", path=name) from None
        if first is None:
            raise InputError("has no records: there is nothing to analyze", path=name)
        fields = [(key, _kind(value, null_floats)) for key, value in first.items()]
        try:
            super().__init__(name, columns, format=format, schema=pa.schema(fields), step=step, step_origin=step_origin)
        except InputError as exc:  # a used key's type refused: say what the record holds, where
            odd = _odd_value(first[exc.column]) if exc.column in first and exc.row is None else None
            if odd is None:
                raise
            raise InputError(
                f"holds {odd}, expected a list of numbers (one per token)", path=name, row=0, column=exc.column
            ) from None
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
        if self.nulls.count:
            from rcdiag.runtime.notices import notify

            notify(self.nulls.notice(self.path))
            self.nulls = NullCount()

    def _batch(self, rows: list[dict], columns: list[str], first_row: int) -> Batch:
        nulls: dict[str, np.ndarray] = {}
        arrays = [self._column(rows, name, first_row, nulls) for name in columns]
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
        data = pa.RecordBatch.from_arrays(arrays, names=columns)
        return Batch(data, self.path, first_row, self.step, nulls or None)

    def _column(self, rows: list[dict], name: str, first_row: int, nulls: dict[str, np.ndarray]) -> pa.Array:
        """One column of a batch as Arrow; with ``null_floats``, a log-prob column's nulls as NaN, their positions
        put in ``nulls`` (the screen names such a value as the file holds it)."""
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
            array = pa.array(values, type=kind)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            at = _first_unconvertible(values, kind)
            odd = _odd_value(values[at]) if pa.types.is_list(kind) else None
            raise InputError(
                f"holds {odd}, expected a list of numbers (one per token)"
                if odd is not None
                else f"cannot be read as {kind} ({str(exc).splitlines()[0][:120]})",
                path=self.path,
                row=first_row + at,
                column=name,
            ) from None
        if self.null_floats and name in (self.cols.old, self.cols.rollout) and pa.types.is_list(kind):
            array, where = self.nulls.filled(array, name, first_row)
            if where is not None:
                nulls[name] = where
        return array


@dataclass
class NullCount:
    """Nulls read as NaN among the log-probs of one file: how many per column, and where the first was."""

    count: dict[str, int] = field(default_factory=dict)
    first: dict[str, tuple[int, int]] = field(default_factory=dict)

    def filled(self, array: pa.ListArray, name: str, first_row: int) -> tuple[pa.ListArray, np.ndarray | None]:
        """``array`` (a list column of one batch, starting at ``first_row``) with its null values as NaN, and where
        they were over its flat values (``None`` when it had none: the usual case costs one count)."""
        values = array.values
        if not values.null_count:
            return array, None
        where = values.is_null().to_numpy(zero_copy_only=False)
        if name not in self.first:
            at = int(np.flatnonzero(where)[0])
            offsets = np.asarray(array.offsets)
            row = int(np.searchsorted(offsets, at, side="right") - 1)
            self.first[name] = (first_row + row, at - int(offsets[row]))
        self.count[name] = self.count.get(name, 0) + values.null_count
        return pa.ListArray.from_arrays(array.offsets, pc.fill_null(values, float("nan"))), where

    def notice(self, path: str) -> str:
        """One line: the nulls read as NaN, per column with the first one's row and position."""
        parts = [
            f"'{name}' {n:,} (first at row {self.first[name][0]}, position {self.first[name][1]})"
            for name, n in self.count.items()
        ]
        total = sum(self.count.values())
        return (
            f"note: {path}: read {total:,} JSON null log-prob{'s' if total != 1 else ''} as NaN: {', '.join(parts)}; "
            "prime-rl writes every non-finite value (NaN, +inf, -inf) as null, so at a valid position each makes its "
            "row bad under 'nan' (--on-bad-row), and at a masked one it is padding"
        )


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


STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
"""A JSON string (its brackets are no nesting)."""
DEPTH_BLOCK = 1 << 20
"""Characters measured at a time: a 256M-character line is measured in bounded memory."""
STEPS = np.zeros(128, dtype=np.int8)
STEPS[[ord("["), ord("{")]] = 1
STEPS[[ord("]"), ord("}")]] = -1


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads``' object hook: a dict, refusing a key that appears twice (json keeps the last silently)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return record


def depth(line: str) -> int:
    """How deep ``line``'s arrays and objects nest (brackets inside strings not counted): counted by numpy in
    blocks, and only when the line holds more opening brackets than ``MAX_JSON_DEPTH`` (else it cannot be deeper)."""
    opening = line.count("[") + line.count("{")
    if opening <= MAX_JSON_DEPTH:
        return opening
    text = STRING.sub('""', line) if '"' in line else line
    deepest = level = 0
    for start in range(0, len(text), DEPTH_BLOCK):
        codes = np.frombuffer(text[start : start + DEPTH_BLOCK].encode("ascii", "replace"), dtype=np.uint8)
        levels = level + np.cumsum(STEPS[codes], dtype=np.int64)  # one byte per character, all below 128
        if levels.size:
            deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def _parse(line: str, path: str, row: int) -> dict:
    deep = depth(line)
    if deep > MAX_JSON_DEPTH:
        raise InputError(
            f"nests arrays or objects {deep:,} deep, beyond rcdiag's limit of {MAX_JSON_DEPTH} (a dump's "
            "values nest a few levels: a list of numbers, a batch of one)",
            path=path,
            row=row,
        )
    try:
        record = json.loads(line, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"is not valid JSON ({exc.msg} at column {exc.colno}); is the file complete?", path=path, row=row
        ) from None
    except _DuplicateKeyError as exc:
        raise InputError(
            "appears twice in one object of this record; rcdiag cannot tell which value to read: keep one",
            path=path,
            row=row,
            column=exc.key,
        ) from None
    except ValueError:  # Python's bound on integer digits (sys.get_int_max_str_digits)
        raise InputError(
            f"holds an integer of more than {sys.get_int_max_str_digits():,} digits, beyond what Python reads "
            "(a dump's numbers are log-probs, masks, ids, steps)",
            path=path,
            row=row,
        ) from None
    except RecursionError:  # not reached within MAX_JSON_DEPTH; kept so the parser's own bound is never a crash
        raise InputError(
            f"nests arrays or objects beyond rcdiag's limit of {MAX_JSON_DEPTH}", path=path, row=row
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
