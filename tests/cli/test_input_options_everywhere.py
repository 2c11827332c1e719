"""The input options of ``analyze`` (column mapping, bad-row policy, workers) apply to ``compare`` and ``check``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import ragged_lists, random_batch, run, write_dump


@pytest.fixture
def renamed(tmp_path: Path) -> Path:
    old, rollout, mask = random_batch(np.random.default_rng(3), rows=30, width=20, noise=0.05, empty_rows=0)
    lists = ragged_lists(old, rollout, mask)
    lists["old_log_prob"][4] = [float("nan")] * len(lists["old_log_prob"][4])
    columns = {"logp_train": lists["old_log_prob"], "logp_infer": lists["rollout_log_prob"]}
    return write_dump(tmp_path / "renamed.parquet", columns, types={k: pa.list_(pa.float32()) for k in columns})


def test_compare_and_check_take_the_input_options(capsys: pytest.CaptureFixture, renamed: Path) -> None:
    mapping = ("--old-col", "logp_train", "--rollout-col", "logp_infer")
    code, _, err = run(capsys, "compare", str(renamed), str(renamed), *mapping)
    assert code == 2 and "NaN" in err  # the bad row stops it by default
    code, out, _ = run(
        capsys, "compare", str(renamed), str(renamed), *mapping, "--on-bad-row", "skip", "--format", "json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["a"]["input"]["skipped_rows"] == 1 and data["a"]["input"]["columns"]["old_log_prob"] == "logp_train"
    code, out, _ = run(
        capsys, "check", str(renamed), *mapping, "--on-bad-row", "skip", "--max", "kl=1", "--format", "json"
    )
    assert code == 0, out
    code, _, err = run(capsys, "check", str(renamed), "--max", "kl=1")
    assert code == 2 and "logp_train" in err
