"""A Parquet footer, read and checked against its file before any row group is read.

The footer lists row groups and, per column, where the column chunk lies; Arrow trusts it. A hostile footer may
list one row group many times (20,001 times: 1.28M rows read from a file of 64), point past the end of the file, or
claim rows its row groups do not hold. ``read_footer`` requires every column chunk to lie between the leading magic
and the footer, no two to overlap, and the row groups' rows to sum to the footer's row count.

The column chunks are read here from the footer's Thrift bytes, read from the file, not through pyarrow's
``RowGroupMetaData.column(i)``: its Python binding does not catch the C++ exception a malformed column chunk raises
there (a size-statistics histogram of the wrong length: ``terminate called after throwing an instance of
'parquet::ParquetException'``, the process aborts), and pyarrow's own serialisation of a damaged footer may crash;
its reader, which rcdiag uses for the data, turns the same faults into errors. Reading is linear in the footer's
bytes (about 0.1 ms per column chunk); every list is checked against the bytes left before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.runtime.errors import InputError

MAGIC = 4
"""Bytes of ``PAR1`` at the start of the file (and at its end, after the footer length)."""
MAX_DEPTH = 64
"""Nesting of Thrift structs and lists a footer may use (the Parquet format needs under 10)."""


@dataclass(frozen=True)
class ColumnChunk:
    num_values: int
    start: int
    end: int


@dataclass(frozen=True)
class Footer:
    """What rcdiag reads from a footer: rows per row group and, per row group, its column chunks in schema order."""

    num_rows: int
    group_rows: list[int]
    chunks: list[list[ColumnChunk]]


def read_footer(source: pa.NativeFile, metadata: pq.FileMetaData, path: str) -> Footer:
    """The footer of the Parquet file ``source`` (whose ``metadata`` pyarrow has parsed), read from the file and
    checked against it; ``InputError`` when it does not fit the file."""
    size = source.size()
    length = metadata.serialized_size
    try:
        footer = _parse(bytes(source.read_at(length, size - MAGIC - 4 - length)))
    except (_MalformedError, IndexError, KeyError, TypeError) as exc:
        raise InputError(f"has a malformed footer ({exc or 'truncated'})", path=path) from None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read its footer ({exc})", path=path) from None
    _check(footer, metadata, size - length - 2 * MAGIC, size, path)
    return footer


def _check(footer: Footer, metadata: pq.FileMetaData, data_end: int, file_size: int, path: str) -> None:
    spans: list[tuple[int, int, int, int]] = []
    for group, (rows, chunks) in enumerate(zip(footer.group_rows, footer.chunks, strict=True)):
        if rows < 0:
            raise InputError(f"has a footer whose row group {group} holds {rows} rows", path=path)
        if len(chunks) != metadata.num_columns:
            raise InputError(
                f"has a footer whose row group {group} has {len(chunks)} columns but the schema {metadata.num_columns}",
                path=path,
            )
        for column, chunk in enumerate(chunks if rows else ()):  # an empty group's chunks are not read
            if chunk.start < MAGIC or chunk.end < chunk.start or chunk.end > data_end:
                raise InputError(
                    f"has a footer whose row group {group} places column '{metadata.schema.column(column).path}' at "
                    f"bytes {chunk.start}-{chunk.end}, outside the data of this {file_size:,}-byte file (a damaged "
                    "or hostile file)",
                    path=path,
                )
            spans.append((chunk.start, chunk.end, group, column))
    spans.sort()
    for (_, end, group, _), (start, _, other, column) in pairwise(spans):
        if start < end:
            raise InputError(
                f"has a footer whose row group {other} (column '{metadata.schema.column(column).path}') overlaps row "
                f"group {group}: the footer lists the same bytes twice (a damaged or hostile file; its rows would be "
                "counted twice)",
                path=path,
            )
    rows = sum(footer.group_rows)
    if rows != footer.num_rows:
        raise InputError(
            f"has a footer that says {footer.num_rows:,} rows but its row groups hold {rows:,} (a damaged or "
            "hostile file)",
            path=path,
        )


class _MalformedError(ValueError):
    """Bytes that are not a Thrift compact-protocol footer."""


_COLUMN_META = {5: "int", 7: "int", 9: "int", 11: "int"}
_COLUMN_CHUNK = {3: _COLUMN_META}
_ROW_GROUP = {1: [_COLUMN_CHUNK], 3: "int"}
_FILE_META = {3: "int", 4: [_ROW_GROUP]}
"""The fields rcdiag reads, by Thrift field id: ``FileMetaData`` 3 num_rows, 4 row groups; ``RowGroup`` 1 columns,
3 num_rows; ``ColumnChunk`` 3 its ``ColumnMetaData``: 5 num_values, 7 total_compressed_size, 9 data_page_offset,
11 dictionary_page_offset. Every other field is skipped without being built."""


def _parse(data: bytes) -> Footer:
    meta = _Compact(data).struct(_FILE_META, 0)
    group_rows: list[int] = []
    chunks: list[list[ColumnChunk]] = []
    for group in meta.get(4) or []:
        group_rows.append(_int(group, 3))
        row: list[ColumnChunk] = []
        for column in group.get(1) or []:
            info = column.get(3)
            if not isinstance(info, dict):
                raise _MalformedError("a column chunk without its metadata")
            start = _int(info, 9)
            dictionary = info.get(11)
            if isinstance(dictionary, int) and 0 < dictionary < start:
                start = dictionary
            row.append(ColumnChunk(_int(info, 5), start, start + _int(info, 7)))
        chunks.append(row)
    return Footer(_int(meta, 3), group_rows, chunks)


def _int(fields: dict[int, Any], key: int) -> int:
    value = fields.get(key)
    if not isinstance(value, int):
        raise _MalformedError(f"field {key} missing or not an integer")
    return value


class _Compact:
    """Thrift's compact protocol, as much as a Parquet footer uses: a struct becomes ``{field id: value}`` of the
    fields its spec names (``"int"``, a nested spec, or ``[spec]`` for a list of structs); the rest is skipped."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        data, pos = self.data, self.pos
        value = data[pos]
        pos += 1
        out = value & 0x7F
        shift = 7
        while value & 0x80:
            if shift > 63:
                raise _MalformedError("a varint longer than 64 bits")
            value = data[pos]
            pos += 1
            out |= (value & 0x7F) << shift
            shift += 7
        self.pos = pos
        return out

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def struct(self, spec: dict, depth: int) -> dict[int, Any]:
        if depth > MAX_DEPTH:
            raise _MalformedError("nested too deeply")
        fields: dict[int, Any] = {}
        field = 0
        data = self.data
        while True:
            header = data[self.pos]
            self.pos += 1
            if header == 0:
                return fields
            delta, kind = header >> 4, header & 0x0F
            field = field + delta if delta else self.zigzag()
            want = spec.get(field)
            if want is None or kind in (1, 2):
                self.skip(kind, depth)
            elif want == "int" and kind in (4, 5, 6):
                fields[field] = self.zigzag()
            elif isinstance(want, dict) and kind == 12:
                fields[field] = self.struct(want, depth + 1)
            elif isinstance(want, list) and kind == 9 and (self.data[self.pos] & 0x0F) == 12:
                fields[field] = [self.struct(want[0], depth + 1) for _ in range(self.list_size())]
            else:
                raise _MalformedError(f"field {field} has Thrift type {kind}")

    def list_size(self) -> int:
        header = self.data[self.pos]
        self.pos += 1
        size = header >> 4
        if size == 15:
            size = self.varint()
        if size > len(self.data) - self.pos:  # every element takes a byte at least
            raise _MalformedError(f"a list of {size:,} elements in a footer of {len(self.data):,} bytes")
        return size

    def skip(self, kind: int, depth: int) -> None:
        if kind in (1, 2):  # a bool field: the value is in the type
            return
        if kind == 3:
            self.pos += 1
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.pos += 8
        elif kind == 8:
            size = self.varint()  # first: ``self.pos += self.varint()`` would add to the position before the length
            self.pos += size
        elif kind in (9, 10):
            element = self.data[self.pos] & 0x0F
            size = self.list_size()
            if element in (1, 2, 3):  # bools in a list take a byte each
                self.pos += size
            else:
                for _ in range(size):
                    self.skip(element, depth + 1)
        elif kind == 11:
            size = self.varint()
            if size > len(self.data) - self.pos:
                raise _MalformedError(f"a map of {size:,} entries in a footer of {len(self.data):,} bytes")
            if size:
                types = self.data[self.pos]
                self.pos += 1
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct({}, depth + 1)
        else:
            raise _MalformedError(f"an unknown Thrift type {kind}")
        if self.pos > len(self.data):
            raise _MalformedError("a value past the end of the footer")
