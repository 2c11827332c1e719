"""Seeded benchmark dumps with realistic shapes (the calibration's model, see docs/performance.md).

Response lengths are lognormal (median 1,000 tokens, sigma 0.9) clipped to [16, 16,384]; old log-probs are
-|N(0, 1.5)|; the rollout engine adds N(0, 0.02) noise (1e-4 of tokens get an N(0, 5) outlier); 30% of responses
have one masked span covering 10-40% of them; one ``step`` per 512 responses; zstd Parquet, row groups of 1,024
responses. Files are cached under benchmarks/data/ (git-ignored) by token count and seed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DATA = Path(os.environ.get("RCDIAG_BENCH_DATA") or Path(__file__).resolve().parent / "data")
"""Where dumps are cached (``RCDIAG_BENCH_DATA`` overrides it, e.g. for the smoke test)."""
ROWS_PER_STEP = 512


def parse_tokens(text: str) -> int:
    """``100M`` -> 100_000_000; ``2.5e7`` -> 25_000_000."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgG]?)\s*", text)
    if not match:
        raise ValueError(f"not a token count: {text!r}")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def dump(tokens: int, seed: int = 0, compression: str = "zstd") -> Path:
    """Path of a cached dump of about ``tokens`` tokens (generated on first use)."""
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"bench_{tokens}_{seed}_{compression}.parquet"
    if not path.exists():
        _write(path, tokens, seed, compression)
    return path


def _write(path: Path, tokens: int, seed: int, compression: str) -> None:
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    writer = None
    total, step = 0, 0
    try:
        while total < tokens:
            lengths = np.clip(np.rint(rng.lognormal(np.log(1000), 0.9, ROWS_PER_STEP)), 16, 16384).astype(np.int64)
            n = int(lengths.sum())
            old = -np.abs(rng.normal(0, 1.5, n)).astype(np.float32)
            rollout = old + rng.normal(0, 0.02, n).astype(np.float32)
            outlier = rng.random(n) < 1e-4
            rollout[outlier] = old[outlier] + rng.normal(0, 5, int(outlier.sum())).astype(np.float32)
            rollout = np.minimum(rollout, 0.0)
            mask = np.ones(n, np.int8)
            offsets = np.zeros(ROWS_PER_STEP + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            for row in np.flatnonzero(rng.random(ROWS_PER_STEP) < 0.3):
                span = int(lengths[row] * rng.uniform(0.1, 0.4))
                begin = int(offsets[row] + rng.integers(0, lengths[row] - span + 1))
                mask[begin : begin + span] = 0
            o32 = pa.array(offsets.astype(np.int32))
            table = pa.table(
                {
                    "old_log_prob": pa.ListArray.from_arrays(o32, pa.array(old)),
                    "rollout_log_prob": pa.ListArray.from_arrays(o32, pa.array(rollout)),
                    "response_mask": pa.ListArray.from_arrays(o32, pa.array(mask)),
                    "step": pa.array(np.full(ROWS_PER_STEP, step, np.int64)),
                }
            )
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression=compression)
            writer.write_table(table, row_group_size=1024)
            total += n
            step += 1
    finally:
        if writer is not None:
            writer.close()
    tmp.replace(path)


def ipc_copy(parquet: Path) -> Path:
    """The same dump as an uncompressed Arrow IPC file (``.arrow``, read memory-mapped), written on first use
    row group by row group."""
    path = parquet.with_suffix(".arrow")
    if not path.exists():
        source = pq.ParquetFile(parquet)
        tmp = path.with_suffix(".arrow.tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, source.schema_arrow) as writer:
            for group in range(source.metadata.num_row_groups):
                writer.write_table(source.read_row_group(group))
        tmp.replace(path)
    return path
