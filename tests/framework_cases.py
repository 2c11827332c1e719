"""The dumps ``--as NAME`` is checked on, read back as each framework holds them: per step, padded (B, T) tensors.

A dump's rows are read with pyarrow directly (not rcdiag's readers): each row's lists as stored, padding included,
each step padded to its longest row (pads: log-prob 0, mask 0), as a trainer pads its batch. The synthetic dumps
hold what the real-model ones lack: masked padding inside the lists, empty and fully masked rows, long responses and
outlier tokens far enough out to trip every bound.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

Rows = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def dump_rows(path: Path) -> dict[int | None, Rows]:
    """Every row of a Parquet dump (a file or a directory of them) by step: (old, rollout, mask) as stored."""
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    steps: dict[int | None, Rows] = {}
    for file in files:
        table = pq.read_table(file)
        columns = table.column_names
        old = table.column("old_log_prob").to_pylist()
        rollout = table.column("rollout_log_prob").to_pylist()
        mask = table.column("response_mask").to_pylist() if "response_mask" in columns else [None] * len(old)
        step = table.column("step").to_pylist() if "step" in columns else [None] * len(old)
        for a, b, m, s in zip(old, rollout, mask, step, strict=True):
            a32, b32 = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
            m8 = np.ones(len(a), dtype=bool) if m is None else np.asarray(m, dtype=bool)
            steps.setdefault(s, []).append((a32, b32, m8))
    return steps


def padded(rows: Rows) -> tuple[Any, Any, Any]:
    """(old, rollout, mask) (B, T) torch tensors padded to the longest row (pads: 0, mask 0)."""
    import torch

    width = max((len(old) for old, _, _ in rows), default=0)
    old = np.zeros((len(rows), width), dtype=np.float32)
    rollout = np.zeros_like(old)
    mask = np.zeros(old.shape, dtype=bool)
    for i, (a, b, m) in enumerate(rows):
        old[i, : len(a)], rollout[i, : len(b)], mask[i, : len(m)] = a, b, m
    return torch.from_numpy(old), torch.from_numpy(rollout), torch.from_numpy(mask)


def all_rows(steps: dict[int | None, Rows]) -> Rows:
    """Every step's rows, in step order (the pooled view)."""
    return [row for step in sorted(steps, key=lambda s: (s is None, s or 0)) for row in steps[step]]


def synthetic_dump(
    directory: Path, seed: int, *, scale: float = 0.05, outliers: float = 3.0, masked_step: int | None = None
) -> Path:
    """Three steps of rows with masked padding at their ends and inside, empty and fully masked rows, a few long
    responses (up to 3,000 tokens) and rare outlier tokens (``outliers`` nats); written as one Parquet file.
    ``masked_step``: every row of that step fully masked (a step without a valid token)."""
    rng = np.random.default_rng(seed)
    old_rows, rollout_rows, mask_rows, step_rows = [], [], [], []
    for step in range(3):
        for i in range(40):
            n = int(rng.choice([0, 1, 7, 60, 300, 3000], p=[0.05, 0.05, 0.2, 0.4, 0.25, 0.05]))
            old = np.minimum(rng.normal(-1.2, 1.0, n), -1e-4)
            gap = rng.normal(rng.normal(0.0, scale / 4), scale, n)  # a per-row bias: sequence ratios spread
            far = rng.random(n) < 0.004
            gap[far] += rng.choice([-outliers, outliers], far.sum())
            rollout = np.minimum(old - gap, 0.0)
            mask = np.ones(n, dtype=np.int8)
            if n and i % 5 == 1:
                mask[-max(1, n // 4) :] = 0  # padding at the end (values present, masked)
            if n > 10 and i % 7 == 2:
                mask[n // 3 : n // 2] = 0  # masked inside (a tool's output)
            if (n and i % 11 == 3) or step == masked_step:
                mask[:] = 0  # a fully masked row
            old_rows.append(old.astype(np.float32).tolist())
            rollout_rows.append(rollout.astype(np.float32).tolist())
            mask_rows.append(mask.tolist())
            step_rows.append(step)
    table = pa.table(
        {
            "old_log_prob": pa.array(old_rows, pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(rollout_rows, pa.list_(pa.float32())),
            "response_mask": pa.array(mask_rows, pa.list_(pa.int8())),
            "step": pa.array(step_rows, pa.int64()),
        }
    )
    path = directory / f"synthetic_s{seed}.parquet"
    pq.write_table(table, path)
    return path


def close(ours: float | None, theirs: float, *, rel: float = 2e-6, abs_: float = 1e-7) -> bool:
    """Equal to float32 rounding: ``None`` (rcdiag's non-finite) matches a non-finite value; otherwise within a few
    float32 ulps, relative, or ``abs_`` near 0."""
    if ours is None:
        return not math.isfinite(theirs)
    return math.isclose(ours, theirs, rel_tol=rel, abs_tol=abs_)


def readings(weights: Any, mask: Any, truncated: Any = None) -> dict[str, float | None]:
    """rcdiag's five readings of a correction (``rcdiag/NAME/*``), by brute force from the weight a framework's own
    code put on each token of a padded (B, T) batch (0 where it drops the token) and, for a clamp, where the clamp
    moved the weight (``truncated``, (B, T) bool; ``None``: nothing clamped)."""
    m = mask.bool()
    kept = weights[m].double()
    n = kept.numel()
    square = float((kept * kept).sum())
    responses = int(m.shape[0])  # every row, an empty one too (verl's seq_masked_fraction counts them so)
    zeroed_rows = int(((weights == 0) & m).any(-1).sum())
    return {
        "weight_mean": float(kept.mean()) if n else None,
        "zeroed_fraction": float((kept == 0).double().mean()) if n else None,
        "zeroed_response_fraction": zeroed_rows / responses if responses else None,
        "truncated_fraction": (0.0 if truncated is None else float(truncated[m].double().mean())) if n else None,
        "ess": float(kept.sum()) ** 2 / (n * square) if n and square else None,
    }


def check_readings(name: str, extras: dict[str, Any], expected: dict[str, float | None], where: Any = "") -> None:
    """rcdiag's ``rcdiag/NAME/*`` equal the brute-force ``expected`` (float32 rounding of the weights' sums)."""
    for key, want in expected.items():
        got = extras[f"rcdiag/{name}/{key}"]
        if want is None:
            assert got is None, (where, key, got)
            continue
        assert got is not None and math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-12), (where, key, got, want)


def with_loss_inputs(source: Path, directory: Path, seed: int, *, per_row: bool = True) -> Path:
    """``source`` (a Parquet dump) with the loss inputs a trainer may dump beside the two engines' log-probs: the
    current policy's log-probs ``log_prob`` (the old ones moved by a per-row drift and per-token noise, a few far
    out) and ``advantages`` (one per response, some exactly 0, or ``per_row=False`` one per token, its sign changing
    inside a row); drawn from their own seed, so the log-probs and mask stay the source's."""
    rng = np.random.default_rng(1000 + seed)
    files = sorted(source.glob("*.parquet")) if source.is_dir() else [source]
    table = pa.concat_tables([pq.read_table(file) for file in files])
    old_rows = table.column("old_log_prob").to_pylist()
    current, advantages = [], []
    for old in old_rows:
        a = np.asarray(old, dtype=np.float32)
        move = rng.normal(rng.normal(0.0, 0.1), 0.15, a.shape[0])
        move[rng.random(a.shape[0]) < 0.01] *= 20.0
        current.append((a + move).astype(np.float32).tolist())
        if per_row:
            advantages.append(float(rng.choice([0.0, rng.normal(0.0, 1.0)], p=[0.1, 0.9])))
        else:
            advantages.append(np.round(rng.normal(0.0, 1.0, a.shape[0]), 1).astype(np.float32).tolist())
    kind = pa.float32() if per_row else pa.list_(pa.float32())
    table = table.append_column("log_prob", pa.array(current, pa.list_(pa.float32())))
    table = table.append_column("advantages", pa.array(advantages, kind))
    path = directory / f"{source.stem}_inputs{'' if per_row else '_tokens'}.parquet"
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def dump_inputs(path: Path) -> dict[int | None, list[tuple[np.ndarray, np.ndarray]]]:
    """Each row's (current log-probs, advantages per token) by step, like ``dump_rows`` (a per-row advantage
    repeated over the row)."""
    table = pq.read_table(path)
    current = table.column("log_prob").to_pylist()
    advantages = table.column("advantages").to_pylist()
    steps = table.column("step").to_pylist() if "step" in table.column_names else [None] * len(current)
    out: dict[int | None, list[tuple[np.ndarray, np.ndarray]]] = {}
    for c, a, s in zip(current, advantages, steps, strict=True):
        c32 = np.asarray(c, dtype=np.float32)
        a32 = np.full(len(c), a, dtype=np.float32) if not isinstance(a, list) else np.asarray(a, dtype=np.float32)
        out.setdefault(s, []).append((c32, a32))
    return out


def padded_inputs(rows: list[tuple[np.ndarray, np.ndarray]]) -> tuple[Any, Any]:
    """(current, advantages) (B, T) torch tensors padded like ``padded`` (pads 0)."""
    import torch

    width = max((len(c) for c, _ in rows), default=0)
    current = np.zeros((len(rows), width), dtype=np.float32)
    advantages = np.zeros_like(current)
    for i, (c, a) in enumerate(rows):
        current[i, : len(c)], advantages[i, : len(a)] = c, a
    return torch.from_numpy(current), torch.from_numpy(advantages)


def loss_dumps(tmp_path: Path) -> list[Path]:
    """The dumps the loss keys are checked on: a real-model bf16 dump, and two synthetic ones (padding, empty and
    fully masked rows, long responses), given a current policy and advantages per response, and per token."""
    from shape_dumps import dump

    return [
        with_loss_inputs(dump("bf16", 0), tmp_path / "real", 0),
        with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "s0", 0),
        with_loss_inputs(synthetic_dump(tmp_path, 1, scale=0.3), tmp_path / "s1", 1, per_row=False),
    ]


def loss_views(report: Any, path: Path) -> list[tuple[dict[str, Any], Any, Any, Any, Any, Any]]:
    """Each step's metrics and the pooled ones, with the rows they are of as a framework's trainer holds them: padded
    (B, T) ``(metrics, old, rollout, mask, current, advantages)``."""
    steps, inputs = dump_rows(path), dump_inputs(path)
    order = sorted(steps, key=lambda s: (s is None, s or 0))
    views = [(s.metrics, steps[s.step], inputs[s.step]) for s in report.steps]
    views.append((report.metrics, all_rows(steps), [r for s in order for r in inputs[s]]))
    return [(metrics, *padded(rows), *padded_inputs(loss_inputs)) for metrics, rows, loss_inputs in views]
