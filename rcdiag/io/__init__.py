"""Readers: any dump -> chunks of whole sequences (flat values + offsets).

``open_dump`` is the one place that picks a reader: from the path (a file, a directory, a glob) and, where the
suffix does not say, from the file's first bytes. Adding an input format means one module with a
``TableSource`` subclass and a line here.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Callable
from pathlib import Path

from rcdiag.errors import InputError
from rcdiag.io.base import DEFAULT_CHUNK_TOKENS, Chunk, ColumnMap, Source, SourceInfo, prefetch, split_rows
from rcdiag.io.parquet import ParquetSource
from rcdiag.io.tables import TableSource

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

Opener = Callable[[Path, ColumnMap | None], TableSource]

KINDS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".arrows": "arrow",
    ".jsonl": "jsonl",
    ".pt": "torch",
    ".pth": "torch",
    ".npz": "npz",
}
MAGIC = {b"PAR1": "parquet", b"ARROW1": "arrow", b"PK\x03\x04": "npz"}


def _opener(kind: str) -> Opener:
    if kind == "parquet":
        return ParquetSource
    if kind == "arrow":
        from rcdiag.io.arrow_ipc import ArrowIpcSource

        return ArrowIpcSource
    if kind == "jsonl":
        return _open_jsonl
    if kind == "torch":
        from rcdiag.io.torch_pt import TorchSource

        return TorchSource
    from rcdiag.io.npz import NpzSource

    return NpzSource


def _open_jsonl(path: Path, columns: ColumnMap | None) -> TableSource:
    from rcdiag.io.jsonl import JsonlSource
    from rcdiag.io.nemo_rl import NemoRlSource, is_nemo_rl
    from rcdiag.io.prime_rl import PrimeRlSource, is_prime_rl

    if is_nemo_rl(path) or _first_keys(path) >= {"prev_logprobs", "generation_logprobs"}:
        return NemoRlSource(path, columns)
    if is_prime_rl(path) or _first_keys(path) >= {"trainer_logprobs", "inference_logprobs"}:
        return PrimeRlSource(path, columns)
    return JsonlSource(path, columns, format="jsonl")


def _first_keys(path: Path) -> set[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    return set(record) if isinstance(record, dict) else set()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    return set()


def _kind_of_file(path: Path) -> str:
    kind = KINDS.get(path.suffix.lower())
    if kind is not None:
        return kind
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror})", path=str(path)) from None
    for magic, magic_kind in MAGIC.items():
        if head.startswith(magic):
            return magic_kind
    if head[:1] in (b"\xff", b"\x00") and len(head) >= 8:  # Arrow IPC stream: continuation marker or length
        return "arrow"
    if head.lstrip()[:1] == b"{":
        return "jsonl"
    raise InputError(
        "is not a dump format rcdiag recognises (Parquet, Arrow IPC, JSONL, .pt, .npz); give it the usual suffix",
        path=str(path),
    )


def _open_files(label: str, files: list[Path], columns: ColumnMap | None) -> TableSource:
    from rcdiag.io.shards import ShardSource

    kinds = sorted({_kind_of_file(f) for f in files})
    if len(kinds) > 1:
        raise InputError(
            f"mixes {' and '.join(kinds)} files; point rcdiag at one kind (e.g. a glob such as '{label}/*.parquet')",
            path=label,
        )
    opener = _opener(kinds[0])
    if len(files) == 1:
        return opener(files[0], columns)
    return ShardSource(label, files, columns, opener)


def _directory_files(root: Path) -> list[Path]:
    from rcdiag.io.shards import list_files, natural_key

    nemo = sorted(root.rglob("train_data_step*.jsonl"), key=natural_key)
    if nemo:
        return nemo
    exports = root if root.name == "token_exports" else root / "token_exports"
    if exports.is_dir():
        return list_files(exports, (".jsonl",))
    return list_files(root, tuple(KINDS))


def open_dump(path: str | Path, columns: ColumnMap | None = None) -> Source:
    """Open a dump for streaming; raises ``InputError`` with one clear line if it cannot be read.

    ``path`` is a file, a directory of shards (or a NeMo-RL log directory, or prime-rl's ``token_exports``), or
    a glob such as ``"dumps/step_*.parquet"``.
    """
    text = str(path)
    p = Path(path)
    if not p.exists() and any(ch in text for ch in "*?["):
        from rcdiag.io.shards import is_hidden, natural_key

        files = sorted(
            (Path(f) for f in glob.glob(text, recursive=True) if Path(f).is_file() and not is_hidden(Path(f))),
            key=natural_key,
        )
        if not files:
            raise InputError("matches no file", path=text)
        return _open_files(text, files, columns)
    if not p.exists():
        raise InputError("file not found", path=text)
    if p.is_dir():
        files = _directory_files(p)
        if not files:
            raise InputError(
                "is a directory without dump files (.parquet, .arrow, .feather, .jsonl, .pt, .npz)", path=text
            )
        return _open_files(text, files, columns)
    return _open_files(text, [p], columns)
