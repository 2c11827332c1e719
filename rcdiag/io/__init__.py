"""Readers: any dump -> chunks of whole sequences (flat values + offsets).

``open_dump`` is the one place that picks a reader: it expands the path (a file, a directory, a glob; see
``rcdiag.io.paths``), recognises each file's format from the registry (``rcdiag.io.registry``: suffix, else first
bytes) and reads files of one kind as one dump. Importing this package is cheap (the CLI lists the formats in its
help); the readers and their pyarrow/numpy imports load on first use.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcdiag.io.paths import GLOB_CHARS, FilePath, expand, map_files, read_head
from rcdiag.io.registry import NOT_DUMPS, InputFormat, candidates, format_names, suffixes
from rcdiag.runtime.errors import InputError

if TYPE_CHECKING:
    from rcdiag.io.base import ColumnMap, Part, Source

_EXPORTS = ("DEFAULT_CHUNK_TOKENS", "Chunk", "ColumnMap", "Part", "Source", "SourceInfo", "prefetch", "split_rows")
"""Names of ``rcdiag.io.base`` offered here too; loaded on first use so that importing this package stays cheap."""

__all__ = ["format_names", "format_of", "open_dump", "open_part", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module("rcdiag.io.base"), name)
    raise AttributeError(f"module 'rcdiag.io' has no attribute '{name}'")


def open_dump(path: str | Path, columns: ColumnMap | None = None) -> Source:
    """Open a dump for streaming; raises ``InputError`` with one clear line if it cannot be read.

    ``path`` is a file, a directory of shards (or a NeMo-RL log directory, or prime-rl's ``token_exports``), or
    a glob such as ``"dumps/step_*.parquet"``; on the local disk or as an ``s3://``, ``gs://``, ``hdfs://`` or
    ``file://`` URL (``rcdiag.io.storage``).
    """
    from rcdiag.io.limits import check_environment
    from rcdiag.io.table_source import TableSource

    check_environment()
    label = str(path)
    files = expand(path)
    kinds = _one_kind(label, dict(zip(files, map_files(format_of, files), strict=True)))
    fmt = next(iter(kinds.values()))
    kinds = dict.fromkeys(fmt.opened(list(kinds)), fmt)
    _make_room(list(kinds.items()), label)
    opened = map_files(lambda file: kinds[file].open(file, columns), list(kinds))
    return TableSource(label, opened, next(iter(kinds.values())).name)


def open_part(part: Part, columns: ColumnMap | None = None) -> Source:
    """Open one ``Part`` of a dump (``Source.partitions``) in a worker: only its files, with their known format."""
    from rcdiag.io.limits import check_environment
    from rcdiag.io.registry import FORMATS
    from rcdiag.io.table_source import TableSource

    check_environment()
    by_name = {fmt.name: fmt for fmt in FORMATS}
    _make_room([(path, by_name[kind]) for kind, path in part.files], part.label)
    return TableSource(part.label, [by_name[kind].open(path, columns) for kind, path in part.files], part.files[0][0])


def _make_room(files: list[tuple[Any, InputFormat]], label: str) -> None:
    """Room for the local files that stay open while the dump is read (``InputFormat.keeps_open``)."""
    from rcdiag.io import storage
    from rcdiag.io.open_files import ensure_open_files

    held = sum(1 for path, fmt in files if fmt.keeps_open and not storage.is_remote(str(path)))
    if held:
        ensure_open_files(held, "one per file of the dump, kept open while reading", label)


def format_of(path: FilePath) -> InputFormat:
    """The registered format of a file: by suffix, else by its first bytes; the first whose ``claims`` accepts it."""
    hint = NOT_DUMPS.get(path.suffix.lower())
    if hint is not None:
        raise InputError(hint.format(path=path, stem=path.with_suffix("")), path=str(path))
    for fmt in candidates(path, lambda: read_head(path)):
        if fmt.accepts(path):
            return fmt
    raise InputError(
        f"is not a dump format rcdiag recognises ({', '.join(format_names())}); give it the usual suffix "
        f"({', '.join(suffixes())})",
        path=str(path),
    )


def _one_kind(label: str, kinds: dict[FilePath, InputFormat]) -> dict[FilePath, InputFormat]:
    """Files of one format; files a present format writes beside its dumps (NeMo-RL's ``val_data_step*``) are left
    out; several formats are an error naming them."""
    present = {fmt.name: fmt for fmt in kinds.values()}
    skip = [(re.compile(fmt.companions), fmt.title) for fmt in present.values() if fmt.companions is not None]
    kept = {file: fmt for file, fmt in kinds.items() if not any(p.search(file.name) for p, _ in skip)} or kinds
    if len(kept) < len(kinds):
        from rcdiag.io.paths import describe_left_out
        from rcdiag.runtime.notices import notify

        why = {f.name: next(title for p, title in skip if p.search(f.name)) for f in kinds if f not in kept}
        notify(
            describe_left_out(label, [(name, f"a file {title} writes beside its dumps") for name, title in why.items()])
        )
    counts = Counter(fmt.name for fmt in kept.values())
    if len(counts) > 1:
        names = sorted(counts)
        listed = ", ".join(f"{counts[n]} {n}" for n in names)
        root = label.rstrip("/")
        if any(ch in label for ch in GLOB_CHARS):  # a glob: its directory
            root = str(Path(label).parent) if "://" not in label else root.rpartition("/")[0]
        example = f"{root}/**/*{present[names[0]].suffixes[0]}"
        from rcdiag.io.rank_files import TRAIN_DATA

        train = next((f.parent for f in kept if f.parent.name == TRAIN_DATA and f.suffix == ".pt"), None)
        if train is not None:  # Miles' or slime's --dump-details folder: said, never guessed
            raise InputError(
                f"mixes {', '.join(names[:-1])} and {names[-1]} files ({listed}): a --dump-details folder (Miles', "
                f"slime's) holds the rollout side beside the training dump in {TRAIN_DATA}/; give that subfolder: "
                f"{train}",
                path=label,
            )
        raise InputError(
            f"mixes {', '.join(names[:-1])} and {names[-1]} files ({listed}); point rcdiag at one kind, e.g. a "
            f"quoted glob such as '{example}', or move the others out",
            path=label,
        )
    return kept
