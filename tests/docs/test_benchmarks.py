"""The benchmark scripts run end to end on a tiny dump and print the tables docs/performance.md quotes (their
numbers are measured by running them, never asserted here: see docs/performance.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"


def _run(tmp_path: Path, script: str, *args: str) -> str:
    env = os.environ | {"RCDIAG_BENCH_DATA": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], cwd=BENCHMARKS, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        (
            "throughput.py",
            ("--tokens", "200k", "--rounds", "1", "--padded-tokens", "0", "--maths-tokens", "100k", "--no-features"),
            ["| decode |", "| rcdiag is_rs, IPC mmap |", "| rcdiag / decode |", "IPC mmap / maths alone", "--help`:"],
        ),
        ("memory.py", ("--tokens", "100k,200k", "--padded-tokens", "0"), ["| rcdiag is_rs | IPC mmap |", "RssAnon"]),
        (
            "cpu_time.py",
            ("--tokens", "200k", "--repeats", "1"),
            ["| decode (the floor) |", "| engine, is_rs |", "| engine, is_rs --explain |"],
        ),
        (
            "explain_tokens.py",
            ("--tokens", "200k", "--rounds", "1", "--vocab", "1000"),
            ["new: explain, with ids / plain ", "new: explain, with ids / plain, reading ids", '"load_average"'],
        ),
        (
            "explain_tokens.py",
            ("--tokens", "200k", "--rounds", "1", "--vocab", "1000", "--kernels"),
            ["the ids add", "inside the explain pass", "in separate passes"],
        ),
        (
            "small_path.py",
            ("--tokens", "50k", "--rounds", "1", "--no-cli"),
            ["| numpy path / kernels |", "| break-even"],
        ),
        (
            "many_steps.py",
            ("--rows", "200", "--length", "4", "--rounds", "1"),
            ["| tree | one step | a step per row | many / one | per distinct step |", "| new | "],
        ),
        ("signatures.py", ("--tokens", "200k", "--rounds", "1"), ["ratio", "default  without", "is_rs    without"]),
        ("signatures.py", ("--tokens", "200k", "--rounds", "1", "--pass"), ["signature pass", "pass / analyze:"]),
        (
            "signatures.py",
            ("--tokens", "200k", "--rounds", "1", "--history"),
            ["ids, history on / ids, history off:", "ids, history on / no ids:"],
        ),
        (
            "exact.py",
            ("--tokens", "200k", "--rounds", "1", "--repeats", "1", "--baseline", ".."),
            ["| engine |", "| engine, no section |", "| analyze |", "engine / this: "],
        ),
        (
            "default_detectors.py",
            ("--tokens", "200k", "--rounds", "1", "--baseline", str(BENCHMARKS.parent)),  # this tree as the baseline
            ["detectors / baseline: wall", "no detectors / baseline", "detectors / baseline without signatures"],
        ),
        ("default_detectors.py", ("--tokens", "200k", "--rounds", "1", "--kernels"), ["CPU ns a valid token"]),
        (
            "cli_end_to_end.py",
            ("--tokens", "100k", "--small", "50k", "--rounds", "1"),
            ["| decode / analyze (default) |", "new: CPU", "| peak RSS sweep (default), small -> large |"],
        ),
    ],
)
def test_benchmark_scripts_run(tmp_path: Path, script: str, args: tuple[str, ...], expected: list[str]) -> None:
    out = _run(tmp_path, script, *args)
    for text in expected:
        assert text in out
