"""Token ids in the dump (issue 22, item 1): the column role, its names, every layout, the checks, DumpWriter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, one_line_error, run

import rcdiag

ROWS = [
    ([-0.5, -1.0, -0.2], [-0.6, -1.0, -0.1], [1, 1, 1], [5, 7, 2]),
    ([-0.3, -0.4], [-0.3, -0.6], [1, 0], [9, -100]),
    ([-2.0], [-2.5], [1], [7]),
]


def dump(path: Path, token_name: str = "responses", tokens: list | None = None, token_type: pa.DataType | None = None):
    old, rollout, mask, ids = (list(column) for column in zip(*ROWS, strict=True))
    table = pa.table(
        {
            "old_log_prob": pa.array(old, pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(rollout, pa.list_(pa.float32())),
            "response_mask": pa.array(mask, pa.list_(pa.int8())),
            token_name: pa.array(ids if tokens is None else tokens, token_type or pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, path)
    return path


def table_ids(report: rcdiag.Report) -> dict[int, int]:
    """id -> valid tokens, from the by-token breakdown (every id has fewer than MIN_COUNT tokens: read the file)."""
    return {entry.id: entry.tokens for entry in report.explain.breakdowns.token.by_k3_share}


@pytest.mark.parametrize("name", ["responses", "response_ids", "token_ids", "output_ids"])
def test_recognised_names_are_read_with_explain_or_for_the_repeated_token_test(tmp_path: Path, name: str) -> None:
    """A plain analyze reads the ids only where its verdict names a class a penalty on repeated tokens could
    replace (noise, unexplained: ``rcdiag.diagnosis.verdict.history_untested``), in its second pass."""
    from rcdiag.diagnosis.verdict import HISTORY_OPEN

    path = dump(tmp_path / "d.parquet", name)
    plain = rcdiag.analyze(path)
    assert plain.verdict is not None
    opened = any(cause.cls in HISTORY_OPEN for cause in plain.verdict.causes)
    assert ("token_ids" in plain.input.columns) == opened
    explained = rcdiag.analyze(path, explain=True, tokens=tmp_path / "t.parquet")
    assert explained.input.columns["token_ids"] == name
    assert explained.explain.breakdowns.token.tokens == 5  # valid tokens only: the padding's -100 is not read
    import polars as pl

    table = pl.read_parquet(tmp_path / "t.parquet")
    assert dict(zip(table["id"].to_list(), table["tokens"].to_list(), strict=True)) == {2: 1, 5: 1, 7: 2, 9: 1}


def test_a_recognised_name_holding_text_is_not_token_ids(tmp_path: Path) -> None:
    path = dump(tmp_path / "d.parquet", "responses", tokens=["a", "b", "c"], token_type=pa.string())
    report = rcdiag.analyze(path, explain=True)
    assert report.input.columns["token_ids"] is None and report.explain.breakdowns.token is None
    assert report.explain.not_run["token_specific"].startswith("not run: the dump has no token ids")


def test_token_col_names_any_column_and_must_hold_integers(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = dump(tmp_path / "d.parquet", "ids_of_tokens")
    assert rcdiag.analyze(path, explain=True).explain.breakdowns.token is None
    code, out, _ = run(capsys, "analyze", str(path), "--explain", "--token-col", "ids_of_tokens", "--format", "json")
    assert code == 0 and json.loads(out)["breakdowns"]["token"]["ids"] == 4
    bad = dump(
        tmp_path / "bad.parquet", "ids_of_tokens", tokens=[[0.5], [1.5], [2.5]], token_type=pa.list_(pa.float32())
    )
    wrong = dump(tmp_path / "wrong.parquet", "t", tokens=["a", "b", "c"], token_type=pa.string())
    err = one_line_error(capsys, "analyze", str(wrong), "--token-col", "t")
    assert "column 't'" in err and "expected a list of integers (the token id of each position)" in err
    err = one_line_error(capsys, "analyze", str(bad), "--explain", "--token-col", "ids_of_tokens")
    assert "'old_log_prob' has 3 values but 'ids_of_tokens' has 1" in err


def test_length_mismatch_names_file_row_and_column(tmp_path: Path) -> None:
    path = dump(tmp_path / "d.parquet", tokens=[[5, 7, 2], [9], [7]])
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(path), "--explain"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"rcdiag: error: {path}, row 1, column 'responses': 'old_log_prob' has 2 values but 'responses' has 1; every "
        "column must have one value per token of the response\n"
    )


def test_negative_id_at_a_valid_position_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = dump(tmp_path / "d.parquet", tokens=[[5, -3, 2], [9, -100], [7]])
    err = one_line_error(capsys, "analyze", str(path), "--explain")
    assert err == (
        f"rcdiag: error: {path}, row 0, column 'responses': holds the token id -3 at valid position 1 of the response; "
        "token ids are 0 or more\n"
    )
    code, _, err = run(capsys, "analyze", str(path), "--format", "json")  # read only for the repeated-token test
    assert code == 0
    verdict_reads_ids = "the repeated-token test did not run: the dump's token ids cannot be read" in err
    assert verdict_reads_ids == ("holds the token id -3" in err)


def test_vocab_size_bounds_the_ids(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = dump(tmp_path / "d.parquet")
    assert run(capsys, "analyze", str(path), "--explain", "--vocab-size", "10", "--format", "json")[0] == 0
    err = one_line_error(capsys, "analyze", str(path), "--explain", "--vocab-size", "9")
    assert err == (
        f"rcdiag: error: {path}, row 1, column 'responses': holds the token id 9 at valid position 0 of the response; "
        "beyond the vocabulary (--vocab-size 9)\n"
    )
    with pytest.raises(rcdiag.ConfigError, match="vocab_size must be"):
        rcdiag.ReadOptions(vocab_size=0)


def test_nemo_rl_and_prime_rl_token_ids(tmp_path: Path) -> None:
    nemo = tmp_path / "train_data_step3.jsonl"
    record = {"token_ids": [[11, 12, 13]], "token_loss_mask": [[0, 1, 1]], "sample_loss_mask": [1.0],
              "prev_logprobs": [[0.0, -0.5, -0.2]], "generation_logprobs": [[0.0, -0.7, -0.2]]}  # fmt: skip
    nemo.write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    report = rcdiag.analyze(nemo, explain=True)
    assert report.input.columns["token_ids"] == "token_ids"
    assert report.explain.breakdowns.token.ids == 2 and report.explain.breakdowns.token.tokens == 4
    prime = tmp_path / "run" / "token_exports" / "step_1"
    prime.mkdir(parents=True)
    line = {"step": 1, "token_ids": [4, 4, 5], "loss_mask": [False, True, True],
            "trainer_logprobs": [0.0, -1.0, -2.0], "inference_logprobs": [0.0, -1.1, -2.0]}  # fmt: skip
    (prime / "rank_0.jsonl").write_text(json.dumps(line) + "\n")
    report = rcdiag.analyze(tmp_path / "run", explain=True)
    assert report.explain.breakdowns.token.ids == 2


def test_json_token_ids_must_be_whole_numbers(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [{"old_log_prob": [-1.0, -2.0], "rollout_log_prob": [-1.0, -2.0], "token_ids": [3, 4]},
            {"old_log_prob": [-1.0, -2.0], "rollout_log_prob": [-1.0, -2.0], "token_ids": [3, 4.5]}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = one_line_error(capsys, "analyze", str(path), "--explain")
    assert err == (
        f"rcdiag: error: {path}, row 1, column 'token_ids': holds 4.5 at position 1 of the list, which is not a token "
        "id (a whole number)\n"
    )


def test_long_layout_and_tensor_files_carry_ids(tmp_path: Path) -> None:
    long = tmp_path / "long.parquet"
    pq.write_table(
        pa.table(
            {
                "seq_id": [2, 1, 2, 1],
                "old_log_prob": pa.array([-1.0, -0.5, -2.0, -0.1], pa.float32()),
                "rollout_log_prob": pa.array([-1.5, -0.5, -2.0, -0.3], pa.float32()),
                "token_ids": [8, 6, 9, 6],
            }
        ),
        long,
    )
    token = rcdiag.analyze(long, explain=True).explain.breakdowns.token
    assert token.ids == 3 and token.tokens == 4
    npz = tmp_path / "step_4.npz"
    np.savez(npz, old_log_probs=-np.ones((2, 3), np.float32), rollout_log_probs=-np.ones((2, 3), np.float32),
             response_mask=np.array([[1, 1, 0], [1, 0, 0]]), responses=np.array([[1, 2, -1], [2, -1, -1]]))  # fmt: skip
    token = rcdiag.analyze(npz, explain=True).explain.breakdowns.token
    assert token.ids == 2 and token.tokens == 3


def test_dump_writer_writes_token_ids(tmp_path: Path) -> None:
    writer = rcdiag.DumpWriter(tmp_path / "run")
    old = -np.ones((2, 3), np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    writer.write(step=1, old_log_prob=old, rollout_log_prob=old - 0.1 * mask, response_mask=mask,
                 token_ids=np.array([[3, 4, -1], [3, 5, 6]]))  # fmt: skip
    report = rcdiag.analyze(tmp_path / "run", explain=True)
    assert report.input.columns["token_ids"] == "token_ids"
    assert report.explain.breakdowns.token.ids == 4
    with pytest.raises(ValueError, match=r"step 2 gives no optional column but .* holds steps with token_ids"):
        writer.write(step=2, old_log_prob=old, rollout_log_prob=old, response_mask=mask)
    with pytest.raises(ValueError, match=r"row 0, position 1: token_ids holds -1, not a token id"):
        writer.write(
            step=2, old_log_prob=old, rollout_log_prob=old, response_mask=mask, token_ids=-np.arange(6).reshape(2, 3)
        )
    fresh = rcdiag.DumpWriter(tmp_path / "run")  # a writer reopening the dataset knows its columns
    with pytest.raises(ValueError, match=r"step 3 gives no optional column but .* holds steps with token_ids"):
        fresh.write(step=3, old_log_prob=old, rollout_log_prob=old)


def test_tokens_file_needs_token_ids(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = dump(tmp_path / "d.parquet", "ids_of_tokens")
    err = one_line_error(capsys, "analyze", str(path), "--tokens", str(tmp_path / "t.parquet"))
    assert err == (
        f"rcdiag: error: {path}: has no column of token ids (looked for 'responses', 'response_ids', "
        "'response_token_ids', 'token_ids', ...); --tokens needs one: name it with --token-col NAME\n"
    )
    assert not (tmp_path / "t.parquet").exists()
