"""Input defects a user meets (issues 8 and 15): each through the CLI, exit code and the one line it prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import reference
from conftest import one_line_error, ragged_lists, random_batch, run, write_dump

import rcdiag.io

GOOD = {"old_log_prob": [[-1.0, -2.0], [-0.5]], "rollout_log_prob": [[-1.1, -2.0], [-0.4]]}


def verl_batch(rng: np.random.Generator, rows: int = 6, width: int = 9) -> dict:
    """What ``dict(batch.batch)`` holds in verl: the log-probs and mask, and prompt-side tensors of other widths."""
    old, rollout, mask = random_batch(rng, rows=rows, width=width, empty_rows=0)
    return {"old": old, "rollout": rollout, "mask": mask}


def save_verl(torch: object, path: Path, batch: dict, **scalars: object) -> None:
    rows, width = batch["old"].shape
    tensors = {
        "old_log_probs": torch.from_numpy(batch["old"]),
        "rollout_log_probs": torch.from_numpy(batch["rollout"]),
        "response_mask": torch.from_numpy(batch["mask"]),
        "attention_mask": torch.ones(rows, width + 5, dtype=torch.long),
        "input_ids": torch.ones(rows, width + 5, dtype=torch.long),
        "responses": torch.ones(rows, width, dtype=torch.long),
    }
    torch.save({**tensors, **scalars}, path)


# issue 15, item 1 -------------------------------------------------------------------------------------------------


def test_directory_mixing_kinds_stops_naming_them(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    nemo = {"prev_logprobs": [[-1.0]], "generation_logprobs": [[-1.0]], "token_loss_mask": [[1]]}
    (tmp_path / "train_data_step1.jsonl").write_text(json.dumps(nemo) + "\n")
    write_dump(tmp_path / "padded.parquet", GOOD)
    np.savez(tmp_path / "batch.npz", old_log_probs=-np.ones((2, 3)), rollout_log_probs=-np.ones((2, 3)))
    (tmp_path / "step_7.pt").write_bytes(b"PK\x03\x04")  # recognised by its suffix, never opened
    exports = tmp_path / "run" / "token_exports" / "step_1"
    exports.mkdir(parents=True)
    prime = {"trainer_logprobs": [-1.0], "inference_logprobs": [-1.0], "loss_mask": [True], "step": 1}
    (exports / "rank_0.jsonl").write_text(json.dumps(prime) + "\n")
    err = one_line_error(capsys, "analyze", str(tmp_path))
    expected = (
        "mixes nemo-rl, npz, parquet, prime-rl and torch files (1 nemo-rl, 1 npz, 1 parquet, 1 prime-rl, 1 torch)"
    )
    assert expected in err, err


def test_nemo_rl_log_directory_still_ignores_its_validation_files(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    nemo = {"prev_logprobs": [[-1.0, -2.0]], "generation_logprobs": [[-1.5, -2.0]], "token_loss_mask": [[1, 1]]}
    (tmp_path / "train_data_step4.jsonl").write_text(json.dumps(nemo) + "\n")
    (tmp_path / "val_data_step4.jsonl").write_text(json.dumps({"reward": 1.0}) + "\n")
    code, out, err = run(capsys, "analyze", str(tmp_path), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["input"]["files"] == 1 and [s["step"] for s in report["steps"]] == [4]
    assert report["metrics"]["rollout_corr/kl"] == pytest.approx(-0.25)  # (-0.5 + 0) / 2 valid tokens


# issue 15, item 2 -------------------------------------------------------------------------------------------------


def test_verl_recipe_pt_files_keep_their_steps_from_the_file_names(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch", reason="pip install torch")
    rng = np.random.default_rng(3)
    batches = {n: verl_batch(rng) for n in (1, 2, 10)}
    for n, batch in batches.items():
        save_verl(torch, tmp_path / f"step_{n}.pt", batch)  # docs/dump-writer.md: torch.save(dict(batch.batch), ...)
    code, out, err = run(capsys, "analyze", str(tmp_path / "*.pt"), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [s["step"] for s in report["steps"]] == [1, 2, 10]
    assert report["input"]["step_source"] == "file name" and report["input"]["columns"]["step"] == "<file name>"
    for step, batch in zip(report["steps"], batches.values(), strict=True):
        expected = reference.offpolicy(
            batch["old"].astype(np.float64), batch["rollout"].astype(np.float64), batch["mask"].astype(bool)
        )
        assert step["metrics"]["rollout_corr/kl"] == pytest.approx(expected["kl"], rel=1e-5, abs=1e-7)
        assert step["metrics"]["rollout_corr/k3_kl"] == pytest.approx(expected["k3_kl"], rel=1e-5, abs=1e-7)
    code, table, _ = run(capsys, "analyze", str(tmp_path / "*.pt"))
    assert code == 0 and "steps from the file name" in " ".join(table.split())


def test_pt_step_key_wins_over_no_name_and_is_reported_as_such(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="pip install torch")
    save_verl(torch, tmp_path / "batch.pt", verl_batch(np.random.default_rng(4)), global_step=7)
    code, out, err = run(capsys, "analyze", str(tmp_path / "batch.pt"), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [s["step"] for s in report["steps"]] == [7]
    assert report["input"]["columns"]["step"] == "global_step" and report["input"]["step_source"] == "key 'global_step'"


def test_pt_file_name_disagreeing_with_global_step_is_an_error(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="pip install torch")
    save_verl(torch, tmp_path / "step_3.pt", verl_batch(np.random.default_rng(5)), global_step=7)
    err = one_line_error(capsys, "analyze", str(tmp_path / "step_3.pt"))
    assert "step_3.pt: is named for step 3 but holds global_step=7" in err, err


def test_pt_file_name_disagreeing_with_a_step_column_is_an_error(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="pip install torch")
    batch = verl_batch(np.random.default_rng(6), rows=4)
    torch.save(
        {
            "old_log_probs": torch.from_numpy(batch["old"]),
            "rollout_log_probs": torch.from_numpy(batch["rollout"]),
            "step": torch.tensor([3, 3, 8, 3]),
        },
        tmp_path / "step_3.pt",
    )
    err = one_line_error(capsys, "analyze", str(tmp_path / "step_3.pt"))
    assert "step_3.pt, row 2, column 'step': holds step 8 but the file is named for step 3" in err, err


def test_npz_files_take_their_steps_from_the_file_names_too(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    for step, shift in ((5, 0.0), (6, 0.5)):
        old = np.array([[-1.0, -2.0]], dtype=np.float32)
        np.savez(tmp_path / f"global_step-{step}.npz", old_log_probs=old, rollout_log_probs=old - shift)
    code, out, err = run(capsys, "analyze", str(tmp_path), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [s["step"] for s in report["steps"]] == [5, 6] and report["input"]["step_source"] == "file name"
    assert [s["metrics"]["rollout_corr/kl"] for s in report["steps"]] == pytest.approx([0.0, -0.5])


# issue 15, item 5 -------------------------------------------------------------------------------------------------


def test_merging_the_same_shard_twice_is_an_error(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(7), rows=10, width=6)
    for name in ("a", "b"):
        write_dump(tmp_path / f"{name}.parquet", ragged_lists(old, rollout, mask))
    states = {}
    for name, dump in (("s", "a"), ("again", "a"), ("other", "b")):
        states[name] = str(tmp_path / f"{name}.json")
        assert run(capsys, "analyze", str(tmp_path / f"{dump}.parquet"), "--save-state", states[name])[0] == 0
    err = one_line_error(capsys, "merge", states["s"], states["s"])
    assert f"{states['s']}: read {tmp_path / 'a.parquet'}, which {states['s']} also read" in err, err
    assert "would count its rows twice" in err
    err = one_line_error(capsys, "merge", states["s"], states["again"])
    assert f"{states['again']}: read {tmp_path / 'a.parquet'}, which {states['s']} also read" in err, err
    code, out, err = run(capsys, "merge", states["s"], states["other"], "--format", "json")
    assert code == 0, err
    assert json.loads(out)["input"]["rows"] == 20


def test_a_rewritten_file_is_a_different_part(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "a.parquet", GOOD)
    assert run(capsys, "analyze", str(dump), "--save-state", str(tmp_path / "s0.json"))[0] == 0
    write_dump(dump, {k: v + v for k, v in GOOD.items()})  # the next step overwrote the file
    os.utime(dump, ns=(1, 1))
    assert run(capsys, "analyze", str(dump), "--save-state", str(tmp_path / "s1.json"))[0] == 0
    code, out, err = run(capsys, "merge", str(tmp_path / "s0.json"), str(tmp_path / "s1.json"), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["input"]["rows"] == 6


# issue 15, errors that don't say what to do -------------------------------------------------------------------------


def test_csv_says_it_is_not_a_dump_and_how_to_convert_it(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(8), rows=5, width=4, empty_rows=0, hole_rate=0)
    seq = np.repeat(np.arange(5), 4)
    csv = tmp_path / "tokens.csv"
    lines = ["seq_id,old_log_prob,rollout_log_prob"]
    flat = zip(seq.tolist(), old.reshape(-1).tolist(), rollout.reshape(-1).tolist(), strict=True)
    lines += [f"{s},{o!r},{r!r}" for s, o, r in flat]
    csv.write_text("\n".join(lines) + "\n")
    err = one_line_error(capsys, "analyze", str(csv))
    assert f"{csv}: is CSV, which is not a dump format" in err, err
    command = re.search(r'python -c "([^"]+)"', err)
    assert command, err
    subprocess.run([sys.executable, "-c", command.group(1)], check=True, cwd=tmp_path)
    code, out, err = run(capsys, "analyze", str(tmp_path / "tokens.parquet"), "--format", "json")
    assert code == 0, err
    expected = reference.offpolicy(old.astype(np.float64), rollout.astype(np.float64), np.ones_like(mask, dtype=bool))
    assert json.loads(out)["metrics"]["rollout_corr/kl"] == pytest.approx(expected["kl"], rel=1e-6)


def test_unrecognised_mask_column_says_so_and_suggests_mask_col(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(9), rows=6, width=7, empty_rows=0)
    old[mask == 0] = np.nan  # padding holds NaN, as a padded export does
    rollout[mask == 0] = np.nan
    width = old.shape[1]
    table = pa.table(
        {
            name: pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)
            for name, values in (("old_log_prob", old), ("rollout_log_prob", rollout), ("attention_mask", mask))
        }
    )
    path = tmp_path / "padded.parquet"
    pq.write_table(table, path)
    err = one_line_error(capsys, "analyze", str(path))
    row = int(np.flatnonzero((mask == 0).any(axis=1))[0])
    assert f"padded.parquet, row {row}, column 'old_log_prob': holds nan at position" in err, err
    assert "the dump has no mask column" in err and "could be the mask: 'attention_mask'" in err
    assert "name it with --mask-col NAME" in err and "--on-bad-row" not in err
    code, out, err = run(capsys, "analyze", str(path), "--mask-col", "attention_mask", "--format", "json")
    assert code == 0, err
    expected = reference.offpolicy(old.astype(np.float64), rollout.astype(np.float64), mask.astype(bool))
    assert json.loads(out)["metrics"]["rollout_corr/kl"] == pytest.approx(expected["kl"], rel=1e-5)


def test_a_clean_dump_without_mask_is_still_read(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = write_dump(tmp_path / "d.parquet", dict(GOOD, attention_mask=[[1, 1], [1]]))
    code, out, err = run(capsys, "analyze", str(path), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["rollout_corr/kl"] == pytest.approx((-0.1 + 0.0 + 0.1) / 3, abs=1e-7)


# issue 8: JSONL rows are 0-based record indices ----------------------------------------------------------------------

RECORD = {"old_log_prob": [-1.0, -2.0], "rollout_log_prob": [-1.0, -2.5]}


@pytest.mark.parametrize(
    ("lines", "flags", "expected"),
    [
        # a blank line is not a record: the bad one is record 2 (line 3)
        ([json.dumps(RECORD), "", json.dumps(RECORD), '{"old_log_prob": [-1'], (), "row 2: is not valid JSON"),
        # the bad value is in record 3 of a batch starting at record 2, not at the batch's first row
        (
            [json.dumps(RECORD)] * 3 + [json.dumps(dict(RECORD, old_log_prob=[-1.0, "x"]))],
            ("--chunk-tokens", "3"),
            "row 3, column 'old_log_prob': holds strings (\"x\" at position 1), expected a list of numbers",
        ),
        (
            [json.dumps(RECORD), "", json.dumps({"old_log_prob": [-1.0]})],
            (),
            "row 1, column 'rollout_log_prob': is missing from this record",
        ),
    ],
    ids=["invalid JSON after a blank line", "bad value inside a batch", "missing key after a blank line"],
)
def test_jsonl_errors_name_the_record_index(
    capsys: pytest.CaptureFixture, tmp_path: Path, lines: list[str], flags: tuple[str, ...], expected: str
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    err = one_line_error(capsys, "analyze", str(path), *flags)
    assert f"d.jsonl, {expected}" in err, err


# issue 8: the Arrow IPC reader closes what it opens ------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc (Linux)")
@pytest.mark.parametrize("suffix", [".arrow", ".arrows"])
def test_arrow_ipc_reader_leaves_no_file_open(tmp_path: Path, suffix: str) -> None:
    """A training loop keeps chunks (zero-copy views of the memory map) after reading: no descriptor may stay open,
    or the file cannot be replaced or deleted on every platform."""
    float32 = pa.list_(pa.float32())
    table = pa.table({name: pa.array(values, type=float32) for name, values in GOOD.items()})
    path = tmp_path / f"d{suffix}"
    new = pa.ipc.new_file if suffix == ".arrow" else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
        writer.write_table(table)

    def open_on_path() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target == str(path):
                found.append(fd)
        return found

    chunks = list(rcdiag.io.open_dump(path).chunks())
    assert [chunk.n_rows for chunk in chunks] == [2]
    assert open_on_path() == []
