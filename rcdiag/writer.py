"""``DumpWriter``: write a dump from inside a training loop, one durable file per step.

Each ``write`` call appends one step to a Parquet *dataset* (a directory of part files) in the canonical schema:
``old_log_prob`` and ``rollout_log_prob`` as ``list<float32>``, ``response_mask`` as ``list<int8>``, ``step`` as
int64, with the run facts as key-value metadata. A step is durable when ``write`` returns: the part file is
written under a hidden temporary name, flushed and fsync'd, then atomically renamed, and the directory is
fsync'd. A process killed at any moment leaves complete steps and at most one hidden temporary file, which
readers ignore (names starting with ``.``). ``rcdiag analyze DIR`` reads the directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag._version import __version__
from rcdiag.io.base import Chunk
from rcdiag.validate import OnBadRow, Screen

PART = re.compile(r"^step-(-?\d+)-(\d+)\.parquet$")


def _numpy(value: Any, dtype: type) -> np.ndarray | list[np.ndarray]:
    """A 2-D array, or a list of 1-D arrays, from a tensor, an array or (nested) lists."""
    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        value = value.detach()
        if value.dtype.is_floating_point:
            value = value.float()
        return value.cpu().numpy().astype(dtype, copy=False)
    if isinstance(value, np.ndarray):
        return value.astype(dtype, copy=False)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        rows = [_numpy(row, dtype) if not isinstance(row, (int, float)) else None for row in value]
        if any(row is None for row in rows):
            return np.asarray(value, dtype=dtype)
        return [np.asarray(row, dtype=dtype).reshape(-1) for row in rows]  # type: ignore[arg-type]
    raise TypeError(f"expected a tensor, an array or a list of rows, got {type(value).__name__}")


def _rows(value: np.ndarray | list[np.ndarray], name: str) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        if value.ndim == 1:
            return [value]
        if value.ndim != 2:
            raise ValueError(f"{name} must be 2-D (responses x tokens) or a list of 1-D rows, got shape {value.shape}")
        return list(value)
    return value


def _lists(rows: list[np.ndarray], lengths: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([row[:n] for row, n in zip(rows, lengths, strict=True)]) if rows else np.zeros(0)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, type=arrow_type.value_type)).cast(arrow_type)


class DumpWriter:
    """Append steps to a Parquet dataset directory.

    >>> writer = DumpWriter("dumps/run1", metadata={"temperature": 1.0, "model": "Qwen3-8B"})  # doctest: +SKIP
    >>> writer.write(step=3, old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)  # doctest: +SKIP

    ``old_log_prob``, ``rollout_log_prob`` and ``response_mask`` are torch tensors, numpy arrays or lists: 2-D
    padded (responses x tokens; padding must carry mask 0) or a list of 1-D rows. Padding after a row's last
    valid token is not written. Without a mask every position is valid. ``token_ids`` (the same shape: verl's
    ``responses``) adds a ``token_ids`` column (``list<int32>``) for ``--explain``'s by-token breakdown; a
    dataset's steps all have it or all lack it.
    """

    def __init__(
        self, directory: str | Path, *, metadata: Mapping[str, object] | None = None, compression: str = "zstd"
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compression = compression
        self.metadata = {str(k): str(v) for k, v in (metadata or {}).items()}
        self.metadata.setdefault("rcdiag.writer", f"rcdiag {__version__} DumpWriter")
        self.schema = pa.schema(
            [
                ("old_log_prob", pa.list_(pa.float32())),
                ("rollout_log_prob", pa.list_(pa.float32())),
                ("response_mask", pa.list_(pa.int8())),
                ("step", pa.int64()),
            ],
            metadata=self.metadata,
        )
        self.with_tokens: bool | None = _has_tokens(self.directory)
        """Whether the dataset's steps carry token ids (``None``: no step written yet)."""

    def write(
        self,
        *,
        step: int,
        old_log_prob: Any,
        rollout_log_prob: Any,
        response_mask: Any | None = None,
        token_ids: Any | None = None,
    ) -> Path:
        """Write one step (durable on return); returns the part file. Writing a step twice adds a second part.

        Raises ``ValueError`` for what ``rcdiag analyze`` would refuse later: a step that is not an integer,
        arrays that disagree in shape, a mask value other than 0/1, or a NaN, ``+inf`` or positive log-prob at a
        valid position (``-inf`` is legal); token ids given for some steps and not others, or a negative id (or one
        of 2^31 or more) at a valid position."""
        step = _step(step)
        given_tokens = token_ids is not None
        if self.with_tokens is not None and given_tokens != self.with_tokens:
            have = "with" if self.with_tokens else "without"
            raise ValueError(
                f"step {step}: token_ids {'given' if given_tokens else 'missing'}, but {self.directory} holds steps "
                f"{have} them; every step of a dump needs the same columns"
            )
        old = _rows(_numpy(old_log_prob, np.float32), "old_log_prob")
        rollout = _rows(_numpy(rollout_log_prob, np.float32), "rollout_log_prob")
        given = {"old_log_prob": old, "rollout_log_prob": rollout}
        if response_mask is None:
            mask = [np.ones(row.shape[0], dtype=np.int8) for row in old]
        else:
            mask = given["response_mask"] = _rows(_numpy(response_mask, np.int8), "response_mask")
        if given_tokens:
            given["token_ids"] = _rows(_numpy(token_ids, np.int64), "token_ids")
        names = " and ".join(", ".join(given).rsplit(", ", 1))
        if len({len(rows) for rows in given.values()}) > 1:
            counts = " and ".join(", ".join(str(len(rows)) for rows in given.values()).rsplit(", ", 1))
            raise ValueError(f"{names} have {counts} rows; they must describe the same responses")
        lengths = np.zeros(len(old), dtype=np.int64)
        for i, m in enumerate(mask):
            tokens = [rows[i].shape[0] for rows in given.values()]
            if len(set(tokens)) > 1:
                counts = " and ".join(", ".join(map(str, tokens)).rsplit(", ", 1))
                raise ValueError(f"row {i}: {names} have {counts} tokens; they must have one value per token")
            valid = np.flatnonzero(m)
            lengths[i] = int(valid[-1]) + 1 if valid.size else 0
        columns = [
            _lists(old, lengths, self.schema.field("old_log_prob").type),
            _lists(rollout, lengths, self.schema.field("rollout_log_prob").type),
            _lists(mask, lengths, self.schema.field("response_mask").type),
            pa.array(np.full(len(old), step, dtype=np.int64)),
        ]
        schema = self.schema
        if given_tokens:
            ids = given["token_ids"]
            _check_token_range(ids, mask, lengths)
            columns.append(_lists([row.astype(np.int32) for row in ids], lengths, pa.list_(pa.int32())))
            schema = schema.append(pa.field("token_ids", pa.list_(pa.int32())))
        table = pa.table(columns, schema=schema)
        _check_values(table)
        path = self._commit(table, step)
        self.with_tokens = given_tokens
        return path

    def _commit(self, table: pa.Table, step: int) -> Path:
        taken = [
            int(m.group(2)) for p in self.directory.iterdir() if (m := PART.match(p.name)) and int(m.group(1)) == step
        ]
        final = self.directory / f"step-{step:09d}-{max(taken, default=-1) + 1:04d}.parquet"
        temporary = self.directory / f".{final.name}.{os.getpid()}.tmp"
        with open(temporary, "wb") as handle:
            pq.write_table(table, handle, compression=self.compression)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        _fsync_directory(self.directory)
        return final

    def close(self) -> None:
        """Nothing is buffered; kept so the writer can be used as a context manager."""

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _step(step: Any) -> int:
    value = step.item() if hasattr(step, "item") else step
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise ValueError(f"step must be an integer training step, got {step!r}")
    return int(value)


def _check_values(table: pa.Table) -> None:
    """The screen ``rcdiag analyze`` runs (one set of value rules), so a bad step fails here and not at analysis."""
    lists = [table.column(name).combine_chunks() for name in ("old_log_prob", "rollout_log_prob", "response_mask")]
    old, rollout, mask = (column.values.to_numpy(zero_copy_only=False) for column in lists)
    screen = Screen(OnBadRow.error)
    screen.screen(Chunk(old=old, rollout=rollout, offsets=np.asarray(lists[0].offsets, dtype=np.int64), mask=mask))
    if screen.first is not None:
        first = screen.first
        raise ValueError(f"row {first.where['row']}, position {first.position}: {first.column} holds {first.what}")


def _check_token_range(ids: list[np.ndarray], mask: list[np.ndarray], lengths: np.ndarray) -> None:
    """Token ids at valid positions fit ``int32`` and are not negative (what ``analyze`` would refuse)."""
    for i, (row, m) in enumerate(zip(ids, mask, strict=True)):
        kept = row[: lengths[i]][np.asarray(m[: lengths[i]], dtype=bool)]
        bad = np.flatnonzero((kept < 0) | (kept >= 2**31))
        if bad.size:
            position = int(np.flatnonzero(np.asarray(m[: lengths[i]], dtype=bool))[bad[0]])
            raise ValueError(f"row {i}, position {position}: token_ids holds {int(kept[bad[0]])}, not a token id")


def _has_tokens(directory: Path) -> bool | None:
    """Whether the dataset's existing steps carry token ids (``None``: it has none yet)."""
    parts = sorted(p for p in directory.iterdir() if PART.match(p.name))
    if not parts:
        return None
    return "token_ids" in pq.read_schema(parts[0]).names


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened; the rename is durable enough there
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
