"""Every kind of malformed dump: exit 2 with one line naming file/row/column; bad rows: error or skip exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import assert_metrics_close, ragged_lists, random_batch, run, write_dump

import rcdiag

GOOD = {"old_log_prob": [[-1.0, -2.0], [-0.5]], "rollout_log_prob": [[-1.1, -2.0], [-0.4]]}


class Opaque:
    """Not a tensor: a .pt holding this must not be unpickled."""


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _truncated(tmp: Path) -> Path:
    path = write_dump(tmp / "t.parquet", GOOD)
    path.write_bytes(path.read_bytes()[:40])
    return path


def _clashing_shards(tmp: Path) -> Path:
    write_dump(tmp / "a.parquet", GOOD)
    write_dump(tmp / "b.parquet", GOOD, types={"rollout_log_prob": pa.list_(pa.float64())})
    return tmp


def _shards_with_different_columns(tmp: Path) -> Path:
    write_dump(tmp / "a.parquet", GOOD)
    write_dump(tmp / "b.parquet", dict(GOOD, response_mask=[[1, 1], [1]]))
    return tmp


def _jsonl(tmp: Path, lines: list[str], name: str = "train_data_step1.jsonl") -> Path:
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path


NEMO = json.dumps({"prev_logprobs": [[-1.0]], "generation_logprobs": [[-1.0]], "token_loss_mask": [[1]]})


def _pt(tmp: Path, obj: object) -> Path:
    torch = pytest.importorskip("torch")
    path = tmp / "d.pt"
    torch.save(obj, path)
    return path


def _long(tmp: Path, **extra: list) -> Path:
    columns = {"old_log_prob": [-1.0, -2.0], "rollout_log_prob": [-1.0, -2.0], **extra}
    path = tmp / "long.parquet"
    pq.write_table(pa.table(columns), path)
    return path


CASES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...], str]] = {
    "truncated parquet": (_truncated, (), "cannot be read as Parquet"),
    "not parquet": (lambda t: _file(t / "x.parquet", b"hello"), (), "cannot be read as Parquet"),
    "unknown format": (lambda t: _file(t / "x.bin", b"\x01\x02garbage!"), (), "not a dump format"),
    "missing column": (lambda t: write_dump(t / "m.parquet", {"old_log_prob": [[-1.0]], "rlp": [[-1.0]]}), (),
                       "has no column for the rollout engine's per-token log-probs"),
    "ambiguous columns": (lambda t: write_dump(t / "a.parquet", dict(GOOD, old_log_probs=GOOD["old_log_prob"]),
                                               types={"old_log_probs": pa.list_(pa.float32())}), (),
                          "several columns that could hold the trainer's per-token log-probs: 'old_log_prob', 'old_log_probs'; pick one with --old-col NAME"),
    "flag names a missing column": (lambda t: write_dump(t / "f.parquet", GOOD), ("--old-col", "lp"),
                                    "has no column 'lp' (given with --old-col)"),
    "wrong type": (lambda t: write_dump(t / "w.parquet", {"old_log_prob": [[1]], "rollout_log_prob": [[-1.0]]},
                                        types={"old_log_prob": pa.list_(pa.int64())}), (),
                   "column 'old_log_prob': has type list<element: int64>"),
    "length mismatch": (lambda t: write_dump(t / "l.parquet", {"old_log_prob": [[-1.0, -2.0]], "rollout_log_prob": [[-1.0]]}),
                        (), "row 0, column 'rollout_log_prob': 'old_log_prob' has 2 values but 'rollout_log_prob' has 1"),
    "empty dump": (lambda t: write_dump(t / "e.parquet", {"old_log_prob": [], "rollout_log_prob": []}), (), "has no rows"),
    "clashing shard types": (_clashing_shards, (), "b.parquet, column 'rollout_log_prob': has type list<element: double> but"),
    "shards with different columns": (_shards_with_different_columns, (), "all shards of a dump need the same columns"),
    "glob without match": (lambda t: Path(str(t / "*.parquet")), (), "matches no file"),
    "mixed directory": (lambda t: (write_dump(t / "a.parquet", GOOD), np.savez(t / "b.npz", x=np.ones(2)), t)[2], (),
                        "mixes npz and parquet files"),
    "invalid JSON": (lambda t: _jsonl(t, [NEMO, '{"prev_logprobs": [[-1.0'] ), (),
                     "train_data_step1.jsonl, row 1: is not valid JSON"),
    "missing JSON key": (lambda t: _jsonl(t, [NEMO, json.dumps({"prev_logprobs": [[-1.0]], "token_loss_mask": [[1]]})]),
                         (), "row 1, column 'generation_logprobs': is missing from this record"),
    "empty JSONL": (lambda t: _jsonl(t, [""]), (), "has no records"),
    "pt with an object": (lambda t: _pt(t, {"old_log_probs": Opaque()}), (), "never runs code from a dump"),
    "pt not a dict": (lambda t: _pt(t, [1, 2]), (), "holds a list, expected a dict of tensors"),
    "npz ragged object array": (lambda t: (np.savez(t / "o.npz", old_log_probs=np.array([np.ones(2), np.ones(3)], dtype=object)), t / "o.npz")[1],
                                (), "holds object arrays"),
    "npz rows disagree": (lambda t: (np.savez(t / "r.npz", old_log_probs=-np.ones((3, 4)), rollout_log_probs=-np.ones((2, 4))), t / "r.npz")[1],
                          (), "holds arrays with different numbers of rows ('old_log_probs': 3, 'rollout_log_probs': 2)"),
    "long without sequence ids": (lambda t: _long(t), (), "not lists of log-probs, so the dump is read as one row per token, which needs a column for the sequence id"),
    "long sequence across steps": (lambda t: _long(t, seq_id=[5, 5], step=[1, 2]), (),
                                   "sequence 5, column 'step': has tokens at steps 1 and 2"),
    "truncated arrow": (lambda t: _file(t / "x.arrow", b"ARROW1\x00\x00junk"), (),
                        "cannot be read as Arrow IPC"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_dump_is_one_line_exit_2(capsys: pytest.CaptureFixture, tmp_path: Path, case: str) -> None:
    build, flags, expected = CASES[case]
    path = build(tmp_path)
    code, out, err = run(capsys, "analyze", str(path), *flags)
    assert code == 2, (out, err)
    assert err.startswith("rcdiag: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert expected in err, err


def test_pt_without_torch_says_how_to_get_it(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(b"PK\x03\x04 not really")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    code, _, err = run(capsys, "analyze", str(path))
    assert code == 2 and "reading it needs PyTorch (pip install torch" in err


def _bad_batch(tmp_path: Path) -> tuple[Path, Path, dict[int, str]]:
    """A dump with bad rows of each kind, and the same dump without them."""
    old, rollout, mask = random_batch(np.random.default_rng(3), rows=30, width=12, noise=0.2, empty_rows=1)
    mask[:, 0] = 1
    bad = {4: "nan", 9: "pos_inf", 13: "positive_logprob", 20: "bad_mask", 25: "bad_mask"}
    old[4, 0] = np.nan
    rollout[9, 0] = np.inf
    old[13, 0] = 0.5
    mask[20, 1] = 2
    mask[25, 0] = 7
    rollout[25, 0] = np.nan  # two problems: counted once, under bad_mask
    old[2, 11], mask[2, 11] = np.nan, 0  # padding may hold anything
    old[6, 0] = -np.inf  # legal
    lists = ragged_lists(old, rollout, np.minimum(mask, 1))
    lists["response_mask"] = [[int(v) for v in mask[i, : len(lists["old_log_prob"][i])]] for i in range(mask.shape[0])]
    lists["step"] = [i % 3 for i in range(30)]
    dirty = write_dump(tmp_path / "dirty.parquet", lists)
    keep = [i for i in range(30) if i not in bad]
    clean = write_dump(tmp_path / "clean.parquet", {k: [v[i] for i in keep] for k, v in lists.items()})
    return dirty, clean, bad


def test_bad_rows_error_names_first_row_and_counts_all(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    dirty, _, _ = _bad_batch(tmp_path)
    code, _, err = run(capsys, "analyze", str(dirty), "--chunk-tokens", "50")
    assert code == 2
    assert err == (
        f"rcdiag: error: {dirty}, row 4, column 'old_log_prob': holds NaN at valid position 0 of the response; "
        "5 row(s) of the dump are bad (bad_mask 2, nan 1, pos_inf 1, positive_logprob 1); fix the dump, or pass "
        "--on-bad-row skip to leave those rows out\n"
    )


def test_skip_drops_exactly_the_bad_rows(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    dirty, clean, bad = _bad_batch(tmp_path)
    config = rcdiag.CorrectionConfig(rollout_is="sequence", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25")
    skipped = rcdiag.analyze(dirty, config, on_bad_row="skip", chunk_tokens=37)
    reference = rcdiag.analyze(clean, config)
    assert_metrics_close(skipped.metrics, reference.metrics, rel=1e-12, abs_tol=1e-15)
    for ours, theirs in zip(skipped.steps, reference.steps, strict=True):
        assert_metrics_close(ours.metrics, theirs.metrics, rel=1e-12, abs_tol=1e-15)
    facts = skipped.input
    assert (facts.rows, facts.skipped_rows) == (30 - len(bad), len(bad)) == (25, 5)
    assert facts.skipped_by_reason == {"bad_mask": 2, "nan": 1, "pos_inf": 1, "positive_logprob": 1}
    assert facts.neg_inf_tokens == {"old_log_prob": 1, "rollout_log_prob": 0}
    code, out, err = run(capsys, "analyze", str(dirty), "--on-bad-row", "skip", "--format", "json")
    assert code == 0 and err == ""
    data = json.loads(out)["input"]
    assert data["skipped_rows"] == 5 and data["skipped_by_reason"]["bad_mask"] == 2 and data["rows"] == 25
    code, out, _ = run(capsys, "analyze", str(dirty), "--on-bad-row", "skip")
    assert code == 0
    assert "skipped 5 bad rows (bad_mask 2, nan 1, pos_inf 1, positive_logprob 1) with --on-bad-row skip" in out
    assert "-inf log-probs at valid positions (legal; verl's clamps apply): old_log_prob 1" in out


def test_skip_with_every_row_bad_is_an_error(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = write_dump(tmp_path / "b.parquet", {"old_log_prob": [[float("nan")]], "rollout_log_prob": [[-1.0]]})
    code, _, err = run(capsys, "analyze", str(path), "--on-bad-row", "skip")
    assert code == 2 and "every row was skipped (1 rows: nan 1)" in err


def test_column_flags_pick_columns(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    columns = {"lp_train": GOOD["old_log_prob"], "lp_infer": GOOD["rollout_log_prob"], "m": [[1, 0], [1]], "it": [5, 6]}
    path = write_dump(tmp_path / "c.parquet", columns,
                      types={"lp_train": pa.list_(pa.float32()), "lp_infer": pa.list_(pa.float32()),
                             "m": pa.list_(pa.int8()), "it": pa.int64()})  # fmt: skip
    args = ("--old-col", "lp_train", "--rollout-col", "lp_infer", "--mask-col", "m", "--step-col", "it")
    code, out, _ = run(capsys, "analyze", str(path), *args, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["input"]["columns"] == {
        "old_log_prob": "lp_train", "rollout_log_prob": "lp_infer", "response_mask": "m", "step": "it",
        "token_ids": None,  # the dump has no token ids (null: an absent optional column)
    }  # fmt: skip
    assert [s["step"] for s in data["steps"]] == [5, 6]
    assert data["metrics"]["rollout_corr/kl"] == pytest.approx((0.1 - 0.1) / 2, abs=1e-6)


# ------------------------------------------------------------------------------------------ screen edges


@pytest.mark.parametrize("chunk_tokens", [1 << 20, 5])
def test_neg_inf_at_position_0_is_reported_at_its_row_and_position(tmp_path: Path, chunk_tokens: int) -> None:
    """The first -inf sits at the first position of a row (a row boundary of the flat values): it belongs to that
    row, position 0, not to the end of the row before (rows before it, masked -inf, do not count)."""
    inf = float("-inf")
    path = write_dump(
        tmp_path / "d.parquet",
        {
            "old_log_prob": [[-1.0, -1.0, -1.0], [inf, -1.0], [-1.0, -2.0, inf], [inf, -1.0]],
            "rollout_log_prob": [[-1.0, -1.0, -1.0], [-1.0, -1.0], [-1.0, -2.0, -1.0], [-1.0, inf]],
            "response_mask": [[1, 1, 1], [0, 1], [1, 1, 1], [1, 1]],
        },
    )
    facts = rcdiag.analyze(path, chunk_tokens=chunk_tokens).input
    assert facts.neg_inf_first == {"old_log_prob": [2, 2], "rollout_log_prob": [3, 1]}
    path = write_dump(
        tmp_path / "e.parquet",
        {"old_log_prob": [[-1.0, -1.0], [-2.0, -1.0], [inf, -1.0]], "rollout_log_prob": [[-1.0, -1.0]] * 3},
    )
    report = rcdiag.analyze(path, chunk_tokens=chunk_tokens)
    assert report.input.neg_inf_first == {"old_log_prob": [2, 0]}
    (found,) = [f for f in report.findings if f.code == "logprob_neg_inf"]
    assert found.severity == "warning" and "the first is in old_log_prob at row 2, position 0" in found.message


@pytest.mark.parametrize("value", [-1, 2])
def test_a_mask_value_other_than_0_or_1_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path, value: int) -> None:
    columns = {**GOOD, "response_mask": [[1, 1], [1]]}
    columns["response_mask"][0][1] = value
    path = write_dump(tmp_path / "m.parquet", columns)
    code, out, err = run(capsys, "analyze", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"rcdiag: error: {path}, row 0, column 'response_mask': holds the mask value {value}")
    assert err.count("\n") == 1
