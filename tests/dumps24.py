"""Dumps for issue 24's findings, built from parameters: saturated sequence IS, swapped columns, rare huge tokens
at uniform positions, short responses without steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.io import synthetic


def write_padded(path: Path, old: np.ndarray, rollout: np.ndarray, steps: np.ndarray | None = None) -> Path:
    """Every position valid; one row per response."""
    columns = {
        "old_log_prob": pa.array(old.astype(np.float32).tolist(), pa.list_(pa.float32())),
        "rollout_log_prob": pa.array(rollout.astype(np.float32).tolist(), pa.list_(pa.float32())),
        "response_mask": pa.array(np.ones(old.shape, np.int8).tolist(), pa.list_(pa.int8())),
    }
    if steps is not None:
        columns["step"] = pa.array(steps, pa.int64())
    pq.write_table(pa.table(columns), path)
    return path


def long_biased(path: Path, *, rows: int = 24, length: int = 1000, bias: float = 0.01, seed: int = 0) -> Path:
    """Long responses whose trainer log-probs sit ``bias`` nats above the rollout's at every token (plus noise):
    every sequence weight exp(sum of log-ratios) ~ e^(bias x length) is far beyond a sequence IS cap of 2."""
    rng = np.random.default_rng(seed)
    rollout = rng.uniform(-3.0, -0.5, (rows, length))
    old = rollout + bias + rng.normal(0.0, 0.02, (rows, length))
    return write_padded(path, np.minimum(old, 0.0), rollout)


def uniform_spikes(path: Path, *, seed: int, rows: int = 192, length: int = 1024, rate: float = 0.002) -> Path:
    """Gaussian log-ratio noise (std 0.05) at every position, plus ``rate`` of the tokens at |log-ratio| 3 to 15
    (3 + an exponential tail) spread uniformly over positions: the only anomaly is rare huge tokens."""
    rng = np.random.default_rng(seed)
    d = rng.normal(0.0, 0.05, (rows, length))
    spikes = rng.random((rows, length)) < rate
    d[spikes] = rng.choice([-1.0, 1.0], spikes.sum()) * np.minimum(3.0 + rng.exponential(2.0, spikes.sum()), 15.0)
    rollout = np.full((rows, length), -16.0)
    return write_padded(path, rollout + d, rollout)


def swapped(path: Path, source: Path) -> Path:
    """``source`` with its two log-prob columns swapped."""
    table = pq.read_table(source)
    names = ["rollout_log_prob" if n == "old_log_prob" else "old_log_prob" if n == "rollout_log_prob" else n
             for n in table.column_names]  # fmt: skip
    pq.write_table(table.rename_columns(names), path)
    return path


def short_without_steps(path: Path, *, seed: int = 1) -> Path:
    """A healthy dump of short responses (none reaches position 256) and no step column."""
    table = synthetic.generate("healthy", rows=200, median_length=60, max_length=200, seed=seed)
    synthetic.write(table.drop_columns(["step"]), path)
    return path
