"""Shared test helpers: random batches, conversions between padded and ragged layouts, dump writers."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from missing_components import pytest_runtest_makereport  # noqa: F401  (the CI=true rule: missing means fail)

import rcdiag
from rcdiag.io import Chunk

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_data"


def random_batch(
    rng: np.random.Generator,
    rows: int = 24,
    width: int = 40,
    noise: float = 0.1,
    empty_rows: int = 2,
    hole_rate: float = 0.1,
    outliers: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded ``(old, rollout, mask)`` float32/float32/int64 with ragged lengths, holes and empty rows."""
    lengths = rng.integers(1, width + 1, rows)
    if empty_rows:
        lengths[rng.choice(rows, size=min(empty_rows, rows), replace=False)] = 0
    old = -np.abs(rng.normal(0, 1.5, (rows, width))).astype(np.float32)
    delta = rng.normal(0, noise, (rows, width))
    if outliers:
        hit = rng.random((rows, width)) < outliers
        delta[hit] = rng.normal(0, 8.0, hit.sum())
    rollout = np.minimum(old + delta, 0).astype(np.float32)
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    mask[rng.random((rows, width)) < hole_rate] = 0
    return old, rollout, mask


def padded_chunk(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, steps: np.ndarray | None = None) -> Chunk:
    """A padded batch as one chunk (padding stays in, with mask 0)."""
    rows, width = old.shape
    return Chunk(
        old=np.ascontiguousarray(old, dtype=np.float32).reshape(-1),
        rollout=np.ascontiguousarray(rollout, dtype=np.float32).reshape(-1),
        offsets=np.arange(rows + 1, dtype=np.int64) * width,
        mask=mask.astype(bool).reshape(-1),
        steps=steps,
    )


def ragged_lists(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray) -> dict[str, list]:
    """Ragged per-row lists, trimmed after the last valid token (what a canonical dump holds)."""
    out: dict[str, list] = {"old_log_prob": [], "rollout_log_prob": [], "response_mask": []}
    for i in range(old.shape[0]):
        valid = np.flatnonzero(mask[i])
        end = int(valid[-1]) + 1 if valid.size else 0
        out["old_log_prob"].append(old[i, :end].tolist())
        out["rollout_log_prob"].append(rollout[i, :end].tolist())
        out["response_mask"].append(mask[i, :end].astype(int).tolist())
    return out


def write_dump(path: Path, columns: dict, *, types: dict | None = None, metadata: dict | None = None) -> Path:
    """Write a Parquet dump from Python lists (float32 lists and int8 masks unless ``types`` says otherwise)."""
    types = types or {}
    arrays = {}
    for name, values in columns.items():
        default = {
            "old_log_prob": pa.list_(pa.float32()),
            "rollout_log_prob": pa.list_(pa.float32()),
            "response_mask": pa.list_(pa.int8()),
            "step": pa.int64(),
        }.get(name)
        arrays[name] = pa.array(values, type=types.get(name, default))
    table = pa.table(arrays)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return path


def run_padded(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, **config: object) -> rcdiag.Report:
    """rcdiag over one padded batch."""
    return rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], rcdiag.CorrectionConfig(**config))


def assert_metrics_close(
    ours: dict[str, float | None], expected: dict[str, float | None], rel: float = 1e-5, abs_tol: float = 1e-6
) -> None:
    """Same keys in the same order, values within tolerance; ``None`` matches ``None`` or a non-finite value."""
    assert list(ours) == list(expected)
    bad = []
    for key, want in expected.items():
        got = ours[key]
        if want is None or not math.isfinite(want):
            if got is not None:
                bad.append((key, got, want))
            continue
        if got is None or not math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol):
            bad.append((key, got, want))
    assert not bad, bad


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def browser() -> object:
    """The headless-Chromium harness (tests/browser.py), or a skip saying what to install (a failure under
    CI=true)."""
    import browser as harness
    from missing_components import missing

    if harness.find_chromium() is None:
        missing("chromium")
    pytest.importorskip("websocket")
    return harness
