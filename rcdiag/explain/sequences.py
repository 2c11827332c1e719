"""``--sequences FILE.parquet``: one row per response, written with polars in batches (never all rows at once).

Rows are buffered per ``BATCH_ROWS`` and written as numbered part files in a temporary directory next to the
target; at the end polars streams the parts, in reading order, into the one target file (``sink_parquet``), so
memory holds one batch however large the dump. With ``--workers`` each worker writes its own parts and the
parent shifts their row numbers by the rows read before them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

import rcdiag.io.outputs as outputs
from rcdiag.core.formulas import is_weight
from rcdiag.explain.breakdowns import token_positions
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.block import Block, RowContext, on_host
from rcdiag.metrics.importance import ISMetrics
from rcdiag.metrics.rejection import rejection
from rcdiag.runtime.errors import InputError, OutputError
from rcdiag.runtime.fields import INT64_MAX
from rcdiag.settings.correction import ResolvedConfig

BATCH_ROWS = 1 << 16

COLUMNS = (
    "row",
    "step",
    "id",
    "length",
    "valid_tokens",
    "log_ratio_sum",
    "mean_log_ratio",
    "max_abs_log_ratio",
    "position_of_max",
    "seq_is_weight",
    "tokens_different",
    "max_ulp",
    "first_difference",
)
"""Fixed columns; each enabled RS option adds ``rs_<option>_stat`` and ``rs_<option>_rejected``."""


def sequence_columns(resolved: ResolvedConfig) -> list[str]:
    """Every column of the file, in order."""
    extra = [f"rs_{option.name}_{what}" for option in resolved.rs_options for what in ("stat", "rejected")]
    return [*COLUMNS, *extra]


class SequenceWriter:
    """Buffers per-response records and writes them as part files (an ``ExplainState`` observer)."""

    def __init__(self, resolved: ResolvedConfig, directory: str | Path, target: str | Path | None = None) -> None:
        self.resolved = resolved
        self.directory = Path(directory)
        self.target = target if target is not None else self.directory
        """The ``--sequences`` file these parts become: what a failed write names."""
        self.directory.mkdir(parents=True, exist_ok=True)
        spec = resolved.is_spec
        self.importance = ISMetrics(spec, resolved.version) if spec is not None and spec.level == "sequence" else None
        self.buffer: list[dict[str, Any]] = []
        self.buffered = 0
        self.parts = 0

    def __call__(self, block: Block, context: RowContext) -> None:
        block = on_host(block)  # per-row sums and RS statistics as on the host: the same file on every device
        self.buffer.append(self._columns(block, context, token_positions(context.lengths, context.mask)))
        self.buffered += block.n_rows
        if self.buffered >= BATCH_ROWS:
            self.flush()

    def _columns(self, block: Block, context: RowContext, positions: np.ndarray) -> dict[str, Any]:
        """The block's rows' columns (any backend's block; its per-row values brought to the host)."""
        b, host = block.b, block.b.to_numpy
        n = host(block.row_len)
        s = np.asarray(host(block.row_sum_lr), dtype=np.float64)
        abs_lr = b.abs(block.lr)
        row_max = host(block.seg.max(abs_lr, np.nan))
        abs_lr = host(abs_lr)
        raw = is_weight(np, s)
        weight = raw if self.importance is None else self.importance.apply(NumpyBackend(), raw)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, s / np.maximum(n, 1.0), np.nan)
        if context.step is not None and context.step > INT64_MAX:
            raise OutputError(
                self.target,
                f"step {context.step} is beyond int64, the type of the file's step column (a uint64 step of 2**63 "
                "or more cannot be written exactly); leave out --sequences, or renumber the steps",
            )
        columns: dict[str, Any] = {
            "row": context.rows,
            "step": None if context.step is None else np.full(block.n_rows, context.step, dtype=np.int64),
            "id": context.ids,
            "length": context.lengths.astype(np.int64),
            "valid_tokens": n.astype(np.int64),
            "log_ratio_sum": s,
            "mean_log_ratio": mean,
            "max_abs_log_ratio": row_max.astype(np.float64),
            "position_of_max": _position_of_max(abs_lr, row_max, n.astype(np.int64), positions),
            "seq_is_weight": np.where(n > 0, weight, np.nan),
            **_differences(block),
        }
        for option in self.resolved.rs_options:
            found = rejection(block, option)  # the engine's own, shared with the RS accumulators (memoised)
            columns[f"rs_{option.name}_stat"] = np.asarray(host(found.seq_value), dtype=np.float64)
            columns[f"rs_{option.name}_rejected"] = np.asarray(host(found.rows_hit), dtype=bool)
        return columns

    def flush(self) -> None:
        """Write the buffered rows as the next part file."""
        if not self.buffer:
            return
        import polars as pl

        frame = _frame(self.buffer, self.resolved)
        part = self.directory / f"part-{self.parts:06d}.parquet"
        try:
            frame.write_parquet(part)
        except (OSError, pl.exceptions.PolarsError) as exc:  # a full disk
            raise OutputError(self.target, _reason(exc)) from None
        self.parts += 1
        self.buffer, self.buffered = [], 0


def _differences(block: Block) -> dict[str, np.ndarray]:
    """Each row's exact match (``rcdiag.metrics.token_passes.BitDifferences``, the token pass's): its valid tokens whose
    two log-probs differ in any bit, their greatest ulp distance, the list position of the first (-1: none)."""
    found = block.sums.differences
    return {"tokens_different": found.tokens, "max_ulp": found.max_ulp, "first_difference": found.first}


def _position_of_max(abs_lr: np.ndarray, row_max: np.ndarray, n: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per row, the response position of its first largest |log-ratio| (-1 where there is none)."""
    out = np.full(n.shape[0], -1, dtype=np.int64)
    if not abs_lr.size:
        return out
    hits = np.flatnonzero(abs_lr == np.repeat(row_max, n))
    starts = np.concatenate([[0], np.cumsum(n)[:-1]])
    row_of = np.searchsorted(starts, hits, side="right") - 1
    rows, first = np.unique(row_of, return_index=True)
    out[rows] = positions[hits[first]]
    return out


def _frame(buffer: list[dict[str, Any]], resolved: ResolvedConfig) -> Any:
    import polars as pl

    data: dict[str, Any] = {}
    for name in sequence_columns(resolved):
        parts = [columns[name] for columns in buffer]
        if name in ("step", "id") and all(p is None for p in parts):
            data[name] = pl.Series(name, [None] * sum(len(c["row"]) for c in buffer), dtype=pl.Int64)
            continue
        values = np.concatenate(
            [p if p is not None else np.full(len(c["row"]), None) for p, c in zip(parts, buffer, strict=True)]
        )
        data[name] = _series(pl, name, values)
    return pl.DataFrame(data)


def _series(pl: Any, name: str, values: np.ndarray) -> Any:
    if name == "id":
        if values.dtype.kind in "iu":
            return pl.Series(name, values, dtype=pl.Int64)
        return pl.Series(name, [None if v is None else str(v) for v in values.tolist()], dtype=pl.String)
    series = pl.Series(name, values)
    if name in ("max_abs_log_ratio", "mean_log_ratio", "seq_is_weight"):
        series = series.fill_nan(None)
    if name in ("position_of_max", "first_difference"):
        series = pl.Series(name, np.where(values < 0, np.array(None, dtype=object), values).tolist(), dtype=pl.Int64)
    return series


def finish(parts: list[tuple[Path, int]], target: str | Path) -> None:
    """Stream the part files of every part directory (with the row offset of each) into ``target``."""
    import polars as pl

    frames = [
        pl.scan_parquet(str(directory / "*.parquet")).with_columns(pl.col("row") + offset)
        for directory, offset in parts
        if any(directory.glob("*.parquet"))
    ]
    if not frames:
        return
    with outputs.replacing(target) as temporary:  # whole or not at all, never a half-written file
        try:
            pl.concat(frames, how="vertical").sink_parquet(str(temporary))
        except (OSError, pl.exceptions.PolarsError) as exc:  # a full disk is polars' ComputeError
            raise OutputError(target, _reason(exc)) from None


def _reason(exc: BaseException) -> str:
    """The system's words for a failed write (polars wraps them: "... File too large (os error 27)")."""
    text = getattr(exc, "strerror", None) or str(exc)
    code = re.search(r"\(os error (\d+)\)", text)
    if code:
        return os.strerror(int(code.group(1)))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def temporary_directory(target: str | Path) -> Path:
    """A scratch directory beside ``target`` for part files (the same disk, removed by ``cleanup`` or on an
    abort)."""
    parent = Path(target).resolve().parent
    if not parent.is_dir():
        raise InputError("cannot write the sequences file here (no such directory)", path=str(target))
    return outputs.temporary_directory(target, ".rcdiag-sequences-")


def cleanup(directory: Path) -> None:
    outputs.remove_directory(directory)


def check_target(path: str | Path) -> None:
    """``--sequences`` takes a ``.parquet`` path."""
    if Path(path).suffix.lower() not in (".parquet", ".pq"):
        raise InputError("--sequences writes Parquet: give the file a .parquet suffix", path=str(path))
