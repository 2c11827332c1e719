"""The things a benchmark times: the decode floor, rcdiag end to end, and the padded approach trainers use."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

import rcdiag
from rcdiag.io.parquet import READ_BUFFER, ParquetFile

CONFIG = rcdiag.CorrectionConfig(
    rollout_is="sequence",
    rollout_is_threshold=2.0,
    rollout_rs="token_k1,seq_mean_k1",
    rollout_rs_threshold="0.5_2.0,0.999_1.001",
)
"""A realistic configuration: ``--is sequence --is-threshold 2.0 --rs token_k1,seq_mean_k1
--rs-threshold 0.5_2.0,0.999_1.001`` (sequence IS plus token and geometric-mean RS)."""
COLUMNS = ["old_log_prob", "rollout_log_prob", "response_mask"]


def rows_per_batch(path: Path, chunk_tokens: int) -> int:
    """The batch size rcdiag's reader uses for this file and chunk size (so all methods read alike)."""
    return ParquetFile(path)._rows_per_batch(chunk_tokens)


def open_parquet(path: Path) -> pq.ParquetFile:
    """The file opened as rcdiag opens it (1 MiB read buffer, no pre-buffering)."""
    return pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)


def decode(path: Path, chunk_tokens: int = 0) -> int:
    """The floor: a bare pyarrow decode. Each row group is read with pyarrow's threads and the three list columns
    are flattened to numpy (zero-copy), nothing else: what any tool reading this dump has to pay."""
    file = open_parquet(path)
    tokens = 0
    for group in range(file.metadata.num_row_groups):
        table = file.read_row_group(group, columns=COLUMNS, use_threads=True)
        for column in table.columns:
            flat = [chunk.values.to_numpy(zero_copy_only=False) for chunk in column.chunks]
        tokens += sum(len(values) for values in flat)
    return tokens


def scan_sum(path: Path, chunk_tokens: int) -> int:
    """The benchmark's former "I/O floor": a pyarrow batch scan of the three list columns, each flattened and
    summed in float64. Not a floor (the sums are work a decode does not do); kept as a second reference."""
    file = open_parquet(path)
    tokens = 0
    for batch in file.iter_batches(batch_size=rows_per_batch(path, chunk_tokens), columns=COLUMNS, use_threads=True):
        for column in batch.columns:
            offsets = np.asarray(column.offsets)
            values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy(zero_copy_only=False)
            np.add.reduce(values, dtype=np.float64)
        tokens += len(values)
    return tokens


def rcdiag_e2e(path: Path, chunk_tokens: int, device: str = "cpu", config: str = "is_rs", **options: Any) -> int:
    """``rcdiag analyze`` (the library call the CLI makes) with the realistic configuration, or with verl's default
    one (``config="default"``: metrics only, no IS or RS)."""
    chosen = CONFIG if config == "is_rs" else rcdiag.CorrectionConfig()
    return rcdiag.analyze(path, chosen, chunk_tokens=chunk_tokens, device=device, **options).input.tokens


def rcdiag_explain(path: Path, chunk_tokens: int, device: str = "cpu") -> int:
    """``rcdiag analyze --explain`` with the realistic configuration (breakdowns, worst responses, detectors)."""
    return rcdiag.analyze(path, CONFIG, chunk_tokens=chunk_tokens, device=device, explain=True).input.tokens


def padded(path: Path, chunk_tokens: int, max_tokens: int | None = None) -> int:
    """What trainers do: per batch, pad rows to [B, T_max] float32 tensors and run verl's own rollout-correction
    helper (masked ops over the padded batch). Needs torch and verl (``pip install --no-deps verl==0.9.0``)."""
    import torch

    helper = _verl_helper()
    file = open_parquet(path)
    tokens = 0
    for batch in file.iter_batches(batch_size=rows_per_batch(path, chunk_tokens), columns=COLUMNS, use_threads=True):
        offsets = np.asarray(batch.column(0).offsets, dtype=np.int64)
        offsets = offsets - offsets[0]
        lengths = np.diff(offsets)
        rows, width = len(lengths), int(lengths.max())
        inside = np.arange(width)[None, :] < lengths[:, None]
        tensors = []
        for column, dtype in zip(batch.columns, (np.float32, np.float32, np.int64), strict=True):
            flat = column.values.to_numpy(zero_copy_only=False)
            dense = np.zeros((rows, width), dtype=dtype)
            dense[inside] = flat[int(column.offsets[0].as_py()) : int(column.offsets[-1].as_py())]
            tensors.append(torch.from_numpy(dense))
        helper.compute_rollout_correction_and_rejection_mask(
            *tensors,
            rollout_is=CONFIG.rollout_is,
            rollout_is_threshold=CONFIG.rollout_is_threshold,
            rollout_rs=CONFIG.rollout_rs,
            rollout_rs_threshold=CONFIG.rollout_rs_threshold,
        )
        tokens += int(offsets[-1])
        if max_tokens is not None and tokens >= max_tokens:
            break
    return tokens


def _verl_helper():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from verl_oracle import load_verl

    loaded = load_verl()
    if loaded is None:
        raise RuntimeError(
            "the padded baseline needs torch and verl: pip install torch && pip install --no-deps --target "
            ".gl/verl-0.9.0 verl==0.9.0 (see .ci/run)"
        )
    return loaded[0]


def analyze_token_k1(path: Path, chunk_tokens: int) -> int:
    """``rcdiag analyze --rs token_k1`` (the sweep's baseline in the issue)."""
    config = rcdiag.CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    return rcdiag.analyze(path, config, chunk_tokens=chunk_tokens).input.tokens


def sweep_default(path: Path, chunk_tokens: int, recommend: bool = True) -> int:
    """``rcdiag sweep`` with the default grids (every option), with or without recommendations."""
    from rcdiag.sweep import sweep

    report = sweep(path, chunk_tokens=chunk_tokens, target_reject=0.01 if recommend else None)
    return report.input.tokens
