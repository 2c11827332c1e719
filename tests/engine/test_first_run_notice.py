"""The first run on a machine compiles the kernels for seconds: one line on stderr says so, only then (a fresh
``NUMBA_CACHE_DIR`` in real subprocesses: cold, then warm). The sample dumps are small enough for the numpy path,
which compiles nothing (tests/engine/test_small_path.py): these runs take the kernels (``RCDIAG_SMALL_DUMP_BYTES=0``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SAMPLES

from rcdiag.kernels.small import SWITCH

LINE = "rcdiag: compiling kernels (first run on this machine only)...\n"


def analyze(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLES / "healthy.parquet"), "--format", "json", *args]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "RCDIAG_COMPILE_NOTICE": "1", SWITCH: "0"}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)


def test_compiling_is_said_once_on_a_cold_cache_and_not_on_a_warm_one(tmp_path: Path) -> None:
    cold = analyze(tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert cold.stderr == LINE
    assert any(tmp_path.rglob("*.nbi"))  # numba wrote its cache there
    warm = analyze(tmp_path)
    assert warm.returncode == 0 and warm.stderr == "", warm.stderr
    assert warm.stdout == cold.stdout


def test_worker_processes_say_it_once_through_the_driver(tmp_path: Path) -> None:
    """Each spawned worker compiles on a cold cache; their notices reach stderr once, as the CLI's line, not as
    a Python warning from each process."""
    from rcdiag.io import synthetic

    dump = tmp_path / "two_parts.parquet"
    synthetic.write(synthetic.generate("healthy", rows=200, seed=0), dump, row_group_size=100)
    command = [sys.executable, "-m", "rcdiag", "analyze", str(dump), "--workers", "2", "--format", "json"]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "RCDIAG_COMPILE_NOTICE": "1", SWITCH: "0"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines(keepends=True)
    assert lines[0] == LINE  # at once; the note that two workers do not pay on so small a dump comes at the end
    assert len(lines) == 2 and lines[1].startswith("rcdiag: note: --workers 2 starts 2 processes, more than help")
