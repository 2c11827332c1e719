"""Issue 19's smaller defects, through real subprocesses: a column already taken by another role, check's help,
``presets --verl-version``, position_drift's groups, torch's non-writable-array warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import SAMPLES, require


def rcdiag(*args: object, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rcdiag", *map(str, args)]
    environment = {**os.environ, **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment, check=False)


def test_a_column_taken_by_another_role_is_named_as_taken() -> None:
    path = SAMPLES / "healthy.parquet"
    result = rcdiag("analyze", path, "--old-col", "rollout_log_prob")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"rcdiag: error: {path}: has no column for the rollout engine's per-token log-probs left: 'rollout_log_prob' "
        "is already taken as the trainer's per-token log-probs (--old-col rollout_log_prob); name another with "
        "--rollout-col NAME\n"
    )


def test_check_help_describes_every_flag_and_the_units_the_tool_takes() -> None:
    result = rcdiag("check", "--help", COLUMNS="250", TERM="dumb", NO_COLOR="1")
    assert result.returncode == 0 and result.stderr == ""
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│ --")}
    assert "Write a JUnit XML report" in lines["--junit"] and "FILE" in lines["--junit"]
    assert "Write a Markdown summary" in lines["--markdown"] and "FILE" in lines["--markdown"]
    assert "kl=abs:1e-4 (absolute" in lines["--max-increase"]
    assert "kl=1e-4 (absolute)" not in result.stdout
    text = " ".join(result.stdout.replace("│", " ").split())
    assert "--fail-on" in lines and "or analyze: fail on every finding analyze rates warning or error" in text


def test_presets_follow_the_verl_version() -> None:
    default = rcdiag("presets")
    assert default.returncode == 0 and default.stdout.startswith("verl v0.9.1 presets")
    assert "decoupled_token_icepop" in default.stdout
    old = rcdiag("presets", "--verl-version", "0.7.1")
    assert old.returncode == 0 and old.stdout.startswith("verl v0.7.1 presets")
    assert "icepop" not in old.stdout and "decoupled_geo_rs" in old.stdout
    bad = rcdiag("presets", "--verl-version", "0.5")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "rcdiag: error: Unknown verl version '0.5'. rcdiag reproduces: 0.7.1, 0.8.0, 0.9.0, 0.9.1.\n"


def test_position_drift_speaks_of_hash_groups_not_row_groups() -> None:
    result = rcdiag("analyze", SAMPLES / "position_drift.parquet", "--explain", "--format", "json")
    assert result.returncode == 0, result.stderr
    (drift,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "position_drift"]
    assert "groups of responses dealt by hash" in drift["message"] and "row group" not in drift["message"]


def test_torch_cpu_prints_no_pytorch_warning(tmp_path: object) -> None:
    require("torch", "gpu")
    result = rcdiag(
        "analyze", SAMPLES / "healthy.parquet", "--device", "torch-cpu", "--chunk-tokens", "5000", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    assert "not writable" not in result.stderr and result.stderr == "", result.stderr
    assert json.loads(result.stdout)["input"]["rows"] == 384
