"""Nothing is left out silently: files of a directory or prefix that are not read are named on stderr with why,
every run (real subprocesses), and the library warns with ``rcdiag.runtime.notices.Notice``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES

import rcdiag
from rcdiag.runtime.notices import Notice


def mixed(tmp_path: Path) -> Path:
    root = tmp_path / "mixed"
    root.mkdir()
    shutil.copy(SAMPLES / "healthy.parquet", root / "a.parquet")
    (root / "b.csv").write_text("a,b\n1,2\n")
    (root / "notes.txt").write_text("hello\n")
    (root / "_SUCCESS").write_text("")
    return root


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rcdiag", "analyze", *args, "-q", "--format", "json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_a_directory_names_the_files_it_does_not_read(tmp_path: Path) -> None:
    root = mixed(tmp_path)
    expected = (
        f"rcdiag: {root}: left out 3 files: _SUCCESS (hidden: a name starts with '.' or '_'), b.csv ('.csv' is not "
        "a dump suffix), notes.txt ('.txt' is not a dump suffix)\n"
    )
    for _ in range(2):  # every run, not once
        result = analyze(str(root))
        assert result.returncode == 0, result.stderr
        assert result.stderr == expected
        report = json.loads(result.stdout)
        assert report["input"]["format"] == "parquet" and report["input"]["files"] == 1


def test_many_left_out_files_are_counted_after_the_first_five(tmp_path: Path) -> None:
    root = mixed(tmp_path)
    for k in range(4):
        (root / "logs" / f"{k}").mkdir(parents=True)
        (root / "logs" / f"{k}" / "train.log").write_text("x")
    with pytest.warns(Notice) as caught:
        rcdiag.analyze(root)
    assert [str(w.message) for w in caught] == [
        f"{root}: left out 7 files: _SUCCESS (hidden: a name starts with '.' or '_'), b.csv ('.csv' is not a dump "
        "suffix), logs/0/train.log ('.log' is not a dump suffix), logs/1/train.log ('.log' is not a dump suffix), "
        "logs/2/train.log ('.log' is not a dump suffix) and 2 more"
    ]


def test_a_directory_of_dumps_only_says_nothing(tmp_path: Path) -> None:
    root = tmp_path / "clean"
    root.mkdir()
    shutil.copy(SAMPLES / "healthy.parquet", root / "a.parquet")
    result = analyze(str(root))
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_nemo_rl_validation_files_are_named_as_left_out(tmp_path: Path) -> None:
    row = {"token_ids": [1, 2, 3], "token_loss_mask": [0, 1, 1], "prev_logprobs": [0.0, -0.5, -0.2],
           "generation_logprobs": [0.0, -0.4, -0.3]}  # fmt: skip
    (tmp_path / "train_data_step1.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "val_data_step1.jsonl").write_text(json.dumps(row) + "\n")
    result = analyze(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        f"rcdiag: {tmp_path}: left out 1 file: val_data_step1.jsonl (a file NeMo-RL JSONL writes beside its dumps)\n"
    )
