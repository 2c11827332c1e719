"""A Parquet footer is checked against the file before any row group is read.

The footer lists row groups and, per column, where the column chunk lies; Arrow trusts it. A hostile footer may
list one row group many times (20,001 times: 1.28M rows read from a file of 64), point past the end of the file, or
claim rows its row groups do not hold. ``check_row_groups`` requires every column chunk to lie between the leading
magic and the footer, no two to overlap, and the row groups' rows to sum to the footer's row count. It is linear in
the number of column chunks (one sort), so a footer of many row groups opens quickly.
"""

from __future__ import annotations

from itertools import pairwise

import pyarrow.parquet as pq

from rcdiag.errors import InputError

MAGIC = 4
"""Bytes of ``PAR1`` at the start of the file (and at its end, after the footer length)."""


def check_row_groups(metadata: pq.FileMetaData, file_size: int, path: str) -> None:
    """Raise ``InputError`` unless every column chunk lies in the file's data area, none overlaps another and the
    row groups' rows add up to the footer's ``num_rows``."""
    data_end = file_size - metadata.serialized_size - 2 * MAGIC
    spans: list[tuple[int, int, int, int]] = []
    rows = 0
    for group in range(metadata.num_row_groups):
        meta = metadata.row_group(group)
        if meta.num_rows < 0:
            raise InputError(f"has a footer whose row group {group} holds {meta.num_rows} rows", path=path)
        rows += meta.num_rows
        for column in range(meta.num_columns if meta.num_rows else 0):  # an empty group's chunks are not read
            chunk = meta.column(column)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                start = chunk.dictionary_page_offset
            end = start + chunk.total_compressed_size
            if start < MAGIC or chunk.total_compressed_size < 0 or end > data_end:
                raise InputError(
                    f"has a footer whose row group {group} places column '{chunk.path_in_schema}' at bytes "
                    f"{start}-{end}, outside the data of this {file_size:,}-byte file (a damaged or hostile file)",
                    path=path,
                )
            spans.append((start, end, group, column))
    spans.sort()
    for (_, end, group, _), (start, _, other, column) in pairwise(spans):
        if start < end:
            name = metadata.row_group(other).column(column).path_in_schema
            raise InputError(
                f"has a footer whose row group {other} (column '{name}') overlaps row group {group}: the footer "
                "lists the same bytes twice (a damaged or hostile file; its rows would be counted twice)",
                path=path,
            )
    if rows != metadata.num_rows:
        raise InputError(
            f"has a footer that says {metadata.num_rows:,} rows but its row groups hold {rows:,} (a damaged or "
            "hostile file)",
            path=path,
        )
