"""Many files read as one dump: a directory, a glob, a NeMo-RL log directory or prime-rl ``token_exports``.

Files are read in natural order (``step_2`` before ``step_10``), so the result and any error are reproducible.
Every shard must map the same columns with the same types; the first that does not is an error naming both
files. Names starting with ``.`` or ``_`` (temporary and marker files, e.g. a half-written DumpWriter part or
``_SUCCESS``) are never read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap, balanced_runs
from rcdiag.io.tables import Batch, TableSource


def natural_key(path: Path) -> list:
    """Sort key that orders digit runs by value."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def is_hidden(path: Path, root: Path | None = None) -> bool:
    """Temporary or marker files: any path component below ``root`` starting with ``.`` or ``_``."""
    parts = path.relative_to(root).parts if root is not None else (path.name,)
    return any(part.startswith((".", "_")) for part in parts)


class ShardSource(TableSource):
    """Several files of one kind, opened with ``open_file``, read in order."""

    def __init__(
        self,
        path: str,
        files: Sequence[Path],
        columns: ColumnMap | None,
        open_file: Callable[[Path, ColumnMap | None], TableSource],
    ) -> None:
        self.path = path
        self.shards = [open_file(file, columns) for file in files]
        first = self.shards[0]
        for shard in self.shards[1:]:
            _check_consistent(first, shard)
        self.format = first.format
        self.schema = first.schema
        self.kv_metadata = first.kv_metadata
        self.long = first.long
        self.cols = first.cols
        self.metadata_columns = first.metadata_columns
        self._metadata_values = {}
        totals = [shard.total_rows for shard in self.shards]
        self.total_rows = None if any(t is None for t in totals) else sum(totals)  # type: ignore[misc]
        self.info = first.info
        self.info.path = path
        self.info.format = f"{first.info.format}, {len(files)} files"
        self.info.files = len(files)
        self.info.total_rows = None if self.long else self.total_rows

    def partitions(self, n: int) -> list[tuple[int, ...] | None]:
        """Up to ``n`` runs of consecutive shards of about equal size on disk, for parallel workers. A dump in
        the long layout is one part: a response's tokens may sit in several files."""
        if self.long or n < 2 or len(self.shards) < 2:
            return [None]
        return balanced_runs([Path(shard.path).stat().st_size for shard in self.shards], n)

    def batches(self, chunk_tokens: int, columns: list[str], part: tuple[int, ...] | None = None) -> Iterator[Batch]:
        """Record batches of every shard in order, or of the shards of one part (``partitions``)."""
        for index in part if part is not None else range(len(self.shards)):
            shard = self.shards[index]
            yield from shard.batches(chunk_tokens, [c for c in columns if c in shard.schema.names])


def _check_consistent(first: TableSource, shard: TableSource) -> None:
    if first.long != shard.long or first.cols != shard.cols:
        raise InputError(
            f"uses columns {_roles(shard)} but {first.path} uses {_roles(first)}; all shards of a dump need the "
            "same columns (move the odd file out, or point rcdiag at the files you mean)",
            path=shard.path,
        )
    for name in first.read_columns():
        a, b = first.schema.field(name).type, shard.schema.field(name).type
        if a != b:
            raise InputError(
                f"has type {b} but {first.path} has {a}; all shards of a dump need one schema (rewrite the odd "
                "file, or point rcdiag at the files you mean)",
                path=shard.path,
                column=name,
            )


def _roles(source: TableSource) -> str:
    return ", ".join(f"{k}={v}" for k, v in source.cols.used(source.long).items() if v is not None)


def list_files(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Data files under ``root`` (recursively), hidden ones left out, in natural order."""
    found = [p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes and not is_hidden(p, root)]
    return sorted(found, key=natural_key)
