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
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag._version import __version__
from rcdiag.io.base import Chunk
from rcdiag.io.screen import OnBadRow, Screen

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
        return [np.asarray(row, dtype=dtype).reshape(-1) for row in rows]
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
    valid token is not written. Without a mask every position is valid.
    """

    def __init__(
        self, directory: str | Path, *, metadata: Mapping[str, object] | None = None, compression: str = "zstd"
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compression = compression
        self.metadata = {str(k): str(v) for k, v in (metadata or {}).items()}
        self.metadata.setdefault("rcdiag.io.dump_writer", f"rcdiag {__version__} DumpWriter")
        self.schema = pa.schema(
            [
                ("old_log_prob", pa.list_(pa.float32())),
                ("rollout_log_prob", pa.list_(pa.float32())),
                ("response_mask", pa.list_(pa.int8())),
                ("step", pa.int64()),
            ],
            metadata=self.metadata,
        )
        self._optional: tuple[str, ...] | None = _existing_optional(self.directory)
        """The optional columns (``temperature``, ``token_ids``) of the dataset's steps (``None``: none written yet;
        a writer reopening a dataset reads them from its first part)."""

    def write(
        self,
        *,
        step: int,
        old_log_prob: Any,
        rollout_log_prob: Any,
        response_mask: Any | None = None,
        temperature: float | None = None,
        token_ids: Any | None = None,
    ) -> Path:
        """Write one step (durable on return); returns the part file. Writing a step twice adds a second part.

        ``temperature`` (the step's rollout temperature) becomes a ``temperature`` column (float64, one value per
        row), ``token_ids`` (the response tokens, same shape as the log-probs) a ``token_ids`` column
        (``list<int32>``). Give the same ones at every step: the parts of one dump share one schema.

        Raises ``ValueError`` for what ``rcdiag analyze`` would refuse later: a step that is not an integer,
        arrays that disagree in shape, a mask value other than 0/1, or a NaN, ``+inf`` or positive log-prob at a
        valid position (``-inf`` is legal); for optional columns other than the dataset's other steps'; and for a
        negative token id (or one of 2^31 or more) at a valid position."""
        step = _step(step)
        old = _rows(_numpy(old_log_prob, np.float32), "old_log_prob")
        rollout = _rows(_numpy(rollout_log_prob, np.float32), "rollout_log_prob")
        given = {"old_log_prob": old, "rollout_log_prob": rollout}
        if response_mask is None:
            mask = [np.ones(row.shape[0], dtype=np.int8) for row in old]
        else:
            mask = given["response_mask"] = _rows(_numpy(response_mask, np.int8), "response_mask")
        temperature = _temperature(temperature)
        optional = _optional_columns(temperature, token_ids)
        if self._optional is not None and tuple(optional) != self._optional:
            raise ValueError(
                f"step {step} gives {_names(optional)} but {self.directory} holds steps with {_names(self._optional)}; "
                "give the same optional columns at every step (the parts of one dump share one schema)"
            )
        if token_ids is not None:
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
        table = pa.table(
            [
                _lists(old, lengths, self.schema.field("old_log_prob").type),
                _lists(rollout, lengths, self.schema.field("rollout_log_prob").type),
                _lists(mask, lengths, self.schema.field("response_mask").type),
                pa.array(np.full(len(old), step, dtype=np.int64)),
            ],
            schema=self.schema,
        )
        if temperature is not None:
            table = table.append_column(optional["temperature"], pa.array(np.full(len(old), temperature)))
        if token_ids is not None:
            ids = given["token_ids"]
            _check_token_range(ids, mask, lengths)
            table = table.append_column(
                optional["token_ids"], _lists([row.astype(np.int32) for row in ids], lengths, TOKEN_IDS)
            )
        _check_values(table)
        written = self._commit(table, step)
        self._optional = tuple(optional)
        return written

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


TOKEN_IDS = pa.list_(pa.int32())


def _temperature(temperature: Any) -> float | None:
    value = temperature.item() if hasattr(temperature, "item") else temperature
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    return float(value)


def _optional_columns(temperature: float | None, token_ids: Any | None) -> dict[str, pa.Field]:
    fields = {}
    if temperature is not None:
        fields["temperature"] = pa.field("temperature", pa.float64())
    if token_ids is not None:
        fields["token_ids"] = pa.field("token_ids", TOKEN_IDS)
    return fields


def _names(columns: Collection[str]) -> str:
    return " and ".join(columns) if columns else "no optional column"


def _check_token_range(ids: list[np.ndarray], mask: list[np.ndarray], lengths: np.ndarray) -> None:
    """Token ids at valid positions fit ``int32`` and are not negative (what ``analyze`` would refuse); padding may
    hold anything."""
    for i, (row, m) in enumerate(zip(ids, mask, strict=True)):
        valid = np.flatnonzero(np.asarray(m[: lengths[i]], dtype=bool))
        kept = row[valid]
        bad = np.flatnonzero((kept < 0) | (kept >= 2**31))
        if bad.size:
            raise ValueError(
                f"row {i}, position {int(valid[bad[0]])}: token_ids holds {int(kept[bad[0]])}, not a token id"
            )


def _existing_optional(directory: Path) -> tuple[str, ...] | None:
    """The optional columns of a dataset's existing steps (``None``: it has none yet)."""
    parts = sorted(p for p in directory.iterdir() if PART.match(p.name))
    if not parts:
        return None
    names = pq.read_schema(parts[0]).names
    return tuple(name for name in ("temperature", "token_ids") if name in names)


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


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened; the rename is durable enough there
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
