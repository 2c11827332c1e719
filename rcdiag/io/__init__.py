"""Readers: any dump -> chunks of whole sequences (flat values + offsets).

``open_dump`` picks the reader from the path. Adding an input format means adding one module with a ``Source``
subclass and registering it here.
"""

from __future__ import annotations

from pathlib import Path

from rcdiag.errors import InputError
from rcdiag.io.base import DEFAULT_CHUNK_TOKENS, Chunk, ColumnMap, Source, SourceInfo, prefetch, split_rows
from rcdiag.io.parquet import ParquetSource

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "Chunk",
    "ColumnMap",
    "ParquetSource",
    "Source",
    "SourceInfo",
    "open_dump",
    "prefetch",
    "split_rows",
]


def open_dump(path: str | Path, columns: ColumnMap | None = None) -> Source:
    """Open a dump for streaming; raises ``InputError`` with one clear line if it cannot be read."""
    p = Path(path)
    if not p.exists():
        raise InputError("file not found", path=str(path))
    if p.is_dir():
        raise InputError("is a directory; give a .parquet file", path=str(path))
    return ParquetSource(p, columns)
