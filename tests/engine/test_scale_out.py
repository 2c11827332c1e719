"""Scale-out by merging: shard states merged == one run; --workers == one process; refusals are exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ragged_lists, random_batch, run, write_dump

import rcdiag

P = "rollout_corr/"
FLAGS = ("--is", "sequence", "--batch-normalize", "--rs", "token_k1,seq_mean_k3", "--rs-threshold", "0.6_1.5,0.02")
CONFIG = rcdiag.CorrectionConfig(
    rollout_is="sequence",
    rollout_is_batch_normalize=True,
    rollout_rs="token_k1,seq_mean_k3",
    rollout_rs_threshold="0.6_1.5,0.02",
)


def close(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        if a[key] is None or b[key] is None:
            assert a[key] is None and b[key] is None, key
        else:
            assert math.isclose(a[key], b[key], rel_tol=1e-9, abs_tol=1e-12), (key, a[key], b[key])


@pytest.fixture
def dump(tmp_path: Path) -> tuple[Path, list[Path]]:
    """One dump with 5 steps, and the same rows cut into 3 shards (a step crosses two shards)."""
    old, rollout, mask = random_batch(np.random.default_rng(8), rows=90, width=30, noise=0.3, empty_rows=3)
    columns = ragged_lists(old, rollout, mask)
    columns["step"] = [i // 18 for i in range(90)]
    whole = write_dump(tmp_path / "whole.parquet", columns)
    shards = []
    for k, (a, b) in enumerate([(0, 25), (25, 61), (61, 90)]):
        part = {name: values[a:b] for name, values in columns.items()}
        shards.append(write_dump(tmp_path / f"shard{k}.parquet", part))
    return whole, shards


def test_merged_shard_states_equal_one_run(capsys: pytest.CaptureFixture, tmp_path: Path, dump: tuple) -> None:
    whole, shards = dump
    states = []
    for k, shard in enumerate(shards):
        state = tmp_path / f"s{k}.json"
        code, _, _ = run(capsys, "analyze", str(shard), *FLAGS, "--save-state", str(state), "--format", "json")
        assert code == 0 and json.loads(state.read_text())["format"] == "rcdiag-state"
        states.append(str(state))
    code, out, _ = run(capsys, "merge", *states, "--format", "json")
    assert code == 0
    merged = json.loads(out)
    one = json.loads(run(capsys, "analyze", str(whole), *FLAGS, "--format", "json")[1])
    close(merged["metrics"], one["metrics"])
    close(merged["extras"], one["extras"])
    assert [s["step"] for s in merged["steps"]] == [0, 1, 2, 3, 4]
    for a, b in zip(merged["steps"], one["steps"], strict=True):
        close(a["metrics"], b["metrics"])
        assert a["rows"] == b["rows"]
    assert [f["code"] for f in merged["findings"]] == [f["code"] for f in one["findings"]]
    assert merged["input"]["rows"] == 90 and merged["input"]["valid_tokens"] == one["input"]["valid_tokens"]
    assert merged["input"]["path"] == ", ".join(str(s) for s in shards)
    # the table renders too
    assert "Findings checklist" in run(capsys, "merge", *states, "--details")[1]


def test_state_round_trip_keeps_non_finite_values(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "x.parquet", {"old_log_prob": [[-0.1, -0.2]], "rollout_log_prob": [[-99.0, -0.2]]})
    report = rcdiag.analyze(path, save_state=tmp_path / "s.json")
    assert report.metrics[P + "k3_kl"] is None  # inf in the state: exp(98.9) overflows float32
    merged = rcdiag.merge_states([tmp_path / "s.json"])
    assert merged.metrics == report.metrics
    assert [f.code for f in merged.findings] == [f.code for f in report.findings]


def test_merge_refuses_different_configs(capsys: pytest.CaptureFixture, tmp_path: Path, dump: tuple) -> None:
    _, shards = dump
    run(capsys, "analyze", str(shards[0]), "--is", "token", "--save-state", str(tmp_path / "a.json"))
    run(capsys, "analyze", str(shards[1]), "--is", "sequence", "--save-state", str(tmp_path / "b.json"))
    run(
        capsys,
        "analyze",
        str(shards[2]),
        "--is",
        "token",
        "--is-threshold",
        "2.0",
        "--save-state",
        str(tmp_path / "c.json"),
    )
    code, _, err = run(capsys, "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 2 and "different configuration" in err and err.count("\n") == 1
    # "2.0" and the default 2.0 compute the same thing: these merge
    assert run(capsys, "merge", str(tmp_path / "a.json"), str(tmp_path / "c.json"))[0] == 0


def test_bad_state_files(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    for name, expected in (("junk.json", "is not an rcdiag state file"), ("other.json", "is not an rcdiag state file"),
                           ("missing.json", "file not found")):  # fmt: skip
        code, _, err = run(capsys, "merge", str(tmp_path / name))
        assert code == 2 and expected in err, err


def test_workers_split_row_groups_and_give_the_same_report(tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(9), rows=120, width=20, noise=0.3, empty_rows=2)
    columns = ragged_lists(old, rollout, mask)
    table = pa.table(
        {
            "old_log_prob": pa.array(columns["old_log_prob"], pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(columns["rollout_log_prob"], pa.list_(pa.float32())),
            "response_mask": pa.array(columns["response_mask"], pa.list_(pa.int8())),
            "step": pa.array([i // 50 for i in range(120)], pa.int64()),
        }
    )
    path = tmp_path / "groups.parquet"
    pq.write_table(table, path, row_group_size=16)
    one = rcdiag.analyze(path, CONFIG)
    two = rcdiag.analyze(path, CONFIG, workers=2)
    close(two.metrics, one.metrics)
    for a, b in zip(two.steps, one.steps, strict=True):
        close(a.metrics, b.metrics)
    assert two.input.rows == 120
    from rcdiag.io import open_dump

    source = open_dump(path)
    parts = source.partitions(3)
    assert len(parts) == 3 and sorted(g for part in parts for g in part.within) == list(range(8))


def test_workers_report_bad_rows_with_their_global_row(tmp_path: Path) -> None:
    columns = {"old_log_prob": [[-1.0]] * 40, "rollout_log_prob": [[-1.0]] * 40}
    columns["old_log_prob"][33] = [float("nan")]
    path = tmp_path / "bad.parquet"
    table = pa.table({k: pa.array(v, pa.list_(pa.float32())) for k, v in columns.items()})
    pq.write_table(table, path, row_group_size=10)
    with pytest.raises(rcdiag.InputError, match="row 33"):
        rcdiag.analyze(path, workers=2)


def test_workers_and_states_carry_skipped_rows(tmp_path: Path) -> None:
    columns = {"old_log_prob": [[-1.0, -0.5]] * 40, "rollout_log_prob": [[-1.1, -0.4]] * 40}
    columns["old_log_prob"][3] = [float("nan"), -0.5]
    columns["old_log_prob"][33] = [0.7, -0.5]
    path = tmp_path / "bad.parquet"
    table = pa.table({k: pa.array(v, pa.list_(pa.float32())) for k, v in columns.items()})
    pq.write_table(table, path, row_group_size=10)
    one = rcdiag.analyze(path, on_bad_row="skip", save_state=tmp_path / "s.json")
    two = rcdiag.analyze(path, on_bad_row="skip", workers=2)
    merged = rcdiag.merge_states([tmp_path / "s.json"])
    for report in (one, two, merged):
        assert report.input.skipped_rows == 2 and report.input.rows == 38
        assert report.input.skipped_by_reason["nan"] == 1 and report.input.skipped_by_reason["positive_logprob"] == 1
    close(two.metrics, one.metrics)
    close(merged.metrics, one.metrics)


def test_workers_split_shards_of_a_directory(tmp_path: Path, dump: tuple) -> None:
    whole, shards = dump
    directory = tmp_path / "shards"
    directory.mkdir()
    for shard in shards:
        shard.rename(directory / shard.name)
    from rcdiag.io import open_dump

    parts = open_dump(directory).partitions(2)
    assert len(parts) == 2 and sorted(Path(f).name for part in parts for _, f in part.files) == [
        "shard0.parquet", "shard1.parquet", "shard2.parquet"]  # fmt: skip
    one = rcdiag.analyze(whole, CONFIG)
    two = rcdiag.analyze(directory, CONFIG, workers=2)
    close(two.metrics, one.metrics)
    for a, b in zip(two.steps, one.steps, strict=True):
        close(a.metrics, b.metrics)
    assert two.input.rows == one.input.rows == 90


def test_workers_judge_bad_rows_over_the_whole_dump(tmp_path: Path) -> None:
    """A part whose rows are all bad is no error when other parts have good rows (skip mode), and in error mode
    the count covers every part."""
    columns = {"old_log_prob": [[-1.0, -0.5]] * 40, "rollout_log_prob": [[-1.1, -0.4]] * 40}
    for row in range(30, 40):  # the whole last part
        columns["old_log_prob"][row] = [float("nan"), -0.5]
    columns["old_log_prob"][5] = [0.9, -0.5]
    path = tmp_path / "bad.parquet"
    table = pa.table({k: pa.array(v, pa.list_(pa.float32())) for k, v in columns.items()})
    pq.write_table(table, path, row_group_size=10)
    one = rcdiag.analyze(path, on_bad_row="skip")
    four = rcdiag.analyze(path, on_bad_row="skip", workers=4)
    assert four.input.skipped_rows == one.input.skipped_rows == 11 and four.input.rows == 29
    close(four.metrics, one.metrics)
    with pytest.raises(
        rcdiag.InputError, match=r"row 5.*11 row\(s\) of the dump are bad \(nan 10, positive_logprob 1\)"
    ):
        rcdiag.analyze(path, workers=4)
