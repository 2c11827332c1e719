"""Today's trainer dumps (issue 37 item 2) read to exactly the metrics of the same arrays written as Parquet: slime's
``--save-debug-train-data`` format 2, Miles' ``--dump-details`` rank files (context-parallel slices stitched),
SkyRL's ``dump_data_batch`` pickles, prime-rl's token exports with nulls. Each file is built as its trainer's writer
builds it (tests/trainer_dumps.py cites the lines); the comparison is of the CLI's JSON, ``metrics`` and every step,
bit for bit: the same float32 tokens in the same order give the same sums."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trainer_dumps as td
from conftest import ROOT, ragged_lists, random_batch, require, run, write_dump

STEPS = (3, 7)
NULLS = (
    "prime-rl writes every non-finite value (NaN, +inf, -inf) as null, so at a valid position each makes its row bad "
    "under 'nan' (--on-bad-row), and at a masked one it is padding"
)


@pytest.fixture(scope="module")
def batch() -> dict:
    """Padded arrays with ragged lengths, holes, empty rows and a -inf at a valid position; a step per row."""
    old, rollout, mask = random_batch(np.random.default_rng(37), rows=24, width=18, noise=0.2, empty_rows=2)
    old[0, 3], mask[0, 3] = -np.inf, 1
    return {"old": old, "rollout": rollout, "mask": mask, "steps": np.repeat(np.array(STEPS), 12)}


def analyzed(capsys: pytest.CaptureFixture, path: Path, *flags: str) -> dict:
    code, out, err = run(capsys, "analyze", str(path), "--format", "json", *flags)
    assert code == 0, err
    return json.loads(out)


def parquet(batch: dict, path: Path, rows: np.ndarray | None = None) -> Path:
    """The canonical dump of ``rows`` (all by default), in row order."""
    rows = np.arange(len(batch["steps"])) if rows is None else rows
    lists = ragged_lists(batch["old"][rows], batch["rollout"][rows], batch["mask"][rows])
    lists["step"] = batch["steps"][rows].tolist()
    return write_dump(path, lists)


def parquet_shards(batch: dict, directory: Path, keep: np.ndarray) -> Path:
    """The canonical dump cut as the prime-rl exports below are (a file per step and rank: a file is summed on its
    own, then merged), holding the rows in ``keep``."""
    directory.mkdir()
    for step in STEPS:
        for rank, part in enumerate(np.array_split(np.flatnonzero(batch["steps"] == step), 2)):
            parquet(batch, directory / f"step_{step}_rank_{rank}.parquet", part[np.isin(part, keep)])
    return directory


def same(ours: dict, canonical: dict) -> None:
    """Bit-identical ``metrics`` and ``extras``, overall and per step, and the same rows and valid tokens."""
    assert ours["metrics"] == canonical["metrics"]
    assert ours["extras"] == canonical["extras"]
    assert [s["step"] for s in ours["steps"]] == [s["step"] for s in canonical["steps"]]
    for mine, theirs in zip(ours["steps"], canonical["steps"], strict=True):
        assert (mine["metrics"], mine["rows"], mine["valid_tokens"]) == (
            theirs["metrics"],
            theirs["rows"],
            theirs["valid_tokens"],
        )
    assert ours["input"]["rows"] == canonical["input"]["rows"]
    assert ours["input"]["valid_tokens"] == canonical["input"]["valid_tokens"]
    assert ours["input"]["neg_inf_tokens"] == canonical["input"]["neg_inf_tokens"]


@pytest.fixture(scope="module")
def canonical(batch: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from rcdiag.cli import main

    path = parquet(batch, tmp_path_factory.mktemp("c") / "canonical.parquet")
    with pytest.raises(SystemExit):
        main(["analyze", str(path), "--format", "json", "-o", str(path.with_suffix(".json")), "-q"])
    return json.loads(path.with_suffix(".json").read_text())


def step_samples(batch: dict, step: int) -> list[td.Sample]:
    return td.samples(batch["old"], batch["rollout"], batch["mask"], np.flatnonzero(batch["steps"] == step), step)


def test_slime_format_2(batch: dict, canonical: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two data-parallel shards per rollout, interleaved: the writer sorts the samples back into rollout order."""
    require("torch", "gpu")
    for step in STEPS:
        ss = step_samples(batch, step)
        td.slime_v2(tmp_path / f"{step}.pt", step, [ss[0::2], ss[1::2]], raw_reward=[1.0] * len(ss))
    doc = analyzed(capsys, tmp_path)
    same(doc, canonical)
    assert doc["input"]["columns"]["old_log_prob"] == "log_probs" and doc["input"]["step_source"] == "key 'rollout_id'"


@pytest.mark.parametrize(
    ("cp_size", "tp_size", "qkv_format"), [(2, 2, "thd"), (3, 1, "thd"), (4, 1, "bshd"), (1, 2, "thd")]
)
def test_miles_rank_files_stitch_context_parallel_slices(
    batch: dict,
    canonical: dict,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    cp_size: int,
    tp_size: int,
    qkv_format: str,
) -> None:
    """Two data-parallel shards, ``tp_size`` copies of each rank's file, each context-parallel rank its zigzag slice
    of ``log_probs`` and ``rollout_log_probs``: every response read once, whole."""
    require("torch", "gpu")
    for step in STEPS:
        ss = step_samples(batch, step)
        td.miles_ranks(tmp_path, step, [ss[0::2], ss[1::2]], cp_size=cp_size, tp_size=tp_size, qkv_format=qkv_format)
    ranks = 2 * cp_size * tp_size
    assert len(list(tmp_path.glob("*.pt"))) == 2 * ranks
    doc = analyzed(capsys, tmp_path)
    same(doc, canonical)
    assert doc["input"]["format"] == "torch, 2 files"  # a rollout's rank files are read as one
    one = analyzed(capsys, tmp_path / f"3_{ranks - 1}.pt")  # any rank file reads its whole rollout
    assert one["metrics"] == canonical["steps"][0]["metrics"]


def test_a_miles_slice_is_never_read_as_a_response(batch: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Miles' own split gives rank 1 of 2 a slice shorter than the response: read alone (renamed, so its rollout's
    other ranks cannot be found) it is refused, naming the rank that is missing."""
    require("torch", "gpu")
    ss = step_samples(batch, 3)
    td.miles_ranks(tmp_path, 3, [ss], cp_size=2)
    lonely = (tmp_path / "3_1.pt").rename(tmp_path / "rank1.pt")
    code, _, err = run(capsys, "analyze", str(lonely))
    assert code == 2
    assert err.startswith(f"rcdiag: error: {lonely}: holds context-parallel rank 1 of 2 of sample ")
    assert "no rank file of its rollout holds cp_rank 0; a rank file is missing" in err


def test_skyrl_training_input(batch: dict, canonical: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Right-aligned tensors, prompt log-probs left of each response in ``action_log_probs``, float32 ``loss_mask``,
    and the rows ``pad_training_input_batch`` appended (``pad_size``), which are left out as SkyRL leaves them."""
    require("torch", "gpu")
    export = tmp_path / "export" / "dumped_data"
    export.mkdir(parents=True)
    for step, pad in zip(STEPS, (0, 3), strict=True):
        ss = step_samples(batch, step)
        arrays = td.pad_rows(td.skyrl_arrays(ss, prompt_seed=step), pad)
        td.skyrl_pickle(export / f"global_step_{step}_training_input.pkl", arrays, td.skyrl_metadata(ss, pad))
    doc = analyzed(capsys, tmp_path / "export")  # the export path: its dumped_data directory is read
    same(doc, canonical)
    assert doc["input"]["format"] == "skyrl, 2 files" and doc["input"]["step_source"] == "file name"
    assert doc["input"]["columns"]["old_log_prob"] == "action_log_probs"
    assert doc["input"]["columns"]["response_mask"] == "loss_mask"


def test_a_skyrl_pickle_of_numpy_entries_reads_without_torch(batch: dict, canonical: dict, tmp_path: Path) -> None:
    """Today's batch holds numpy bytes only (``torch.device`` is a stand-in): read where importing torch fails."""
    require("torch", "gpu")  # to write it
    for step in STEPS:
        ss = step_samples(batch, step)
        td.skyrl_pickle(
            tmp_path / f"global_step_{step}_training_input.pkl", td.skyrl_arrays(ss), td.skyrl_metadata(ss, 0)
        )
    shadow = tmp_path / "no_torch"
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError('torch is not installed here')\n")
    env = dict(os.environ, PYTHONPATH=f"{shadow}{os.pathsep}{ROOT}")
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(tmp_path), "--format", "json", "-q"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    same(json.loads(done.stdout), canonical)


@pytest.mark.parametrize("torch_bytes", [False, True])
def test_skyrl_pickles_from_before_2026_03(
    batch: dict, canonical: dict, tmp_path: Path, capsys: pytest.CaptureFixture, torch_bytes: bool
) -> None:
    """The dict-subclass pickle (torch tensors as items, then the state) and, before it, ``torch.save`` bytes."""
    require("torch", "gpu")
    for step in STEPS:
        ss = step_samples(batch, step)
        arrays = td.skyrl_arrays(ss, prompt_seed=step)
        path = tmp_path / f"global_step_{step}_training_input.pkl"
        td.skyrl_pickle_before_2026_03(path, arrays, td.skyrl_metadata(ss, 0), torch_bytes=torch_bytes)
    same(analyzed(capsys, tmp_path), canonical)


def test_skyrl_bfloat16_log_probs_read_through_torch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A bfloat16 tensor goes through ``torch.save`` bytes in the state; read as float32, exactly."""
    torch = require("torch", "gpu")
    old, rollout, mask = random_batch(np.random.default_rng(5), rows=6, width=9)
    old = torch.from_numpy(old).to(torch.bfloat16).float().numpy()  # values bfloat16 holds exactly
    ss = td.samples(old, rollout, mask, range(6))
    path = td.skyrl_pickle(tmp_path / "global_step_1_training_input.pkl", td.skyrl_arrays(ss), td.skyrl_metadata(ss, 0),
                           bfloat16=("action_log_probs",))  # fmt: skip
    lists = ragged_lists(old, rollout, mask)
    lists["step"] = [1] * 6
    canonical = analyzed(capsys, write_dump(tmp_path / "c.parquet", lists))
    same(analyzed(capsys, path), canonical)


def prime_rl_exports(batch: dict, directory: Path, nulls: dict[int, tuple[int, str, float]]) -> Path:
    """The batch as prime-rl's token exports: two prompt tokens (loss mask false) then the response; ``nulls`` puts
    a non-finite value (row -> position, column, value) where ``_json_float`` turns it into null."""

    def record(row: int, step: int, rank: int) -> dict:
        columns = {
            "trainer_logprobs": batch["old"][row].astype(float),
            "inference_logprobs": batch["rollout"][row].astype(float),
        }
        if row in nulls:
            position, column, value = nulls[row]
            columns[column] = columns[column].copy()
            columns[column][position] = value
        width = batch["old"].shape[1]
        return {
            "schema_version": 1,
            "step": step,
            "rank": rank,
            "token_ids": [5, 6] + [1] * width,
            "loss_mask": [False, False] + [bool(v) for v in batch["mask"][row]],
            "inference_logprobs": [0.0, 0.0] + [td.json_float(v) for v in columns["inference_logprobs"]],
            "trainer_logprobs": [-1.0, -2.0] + [td.json_float(v) for v in columns["trainer_logprobs"]],
            "mismatch_kl": [None] * (2 + width),
        }

    return td.prime_rl_exports(directory, batch["steps"], record)


def test_prime_rl_nulls_are_non_finite_values_handled_like_nan(
    batch: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """NaN, +inf and -inf at valid positions are written as null: each row is bad under ``nan`` and skipped with
    ``--on-bad-row skip`` exactly as the Parquet dump with NaN there; a null at a masked position (the prompt's, and
    one in the response) is padding. Counted and named in one notice."""
    clean = batch["mask"].copy()
    masked_row = 5
    masked_at = int(np.flatnonzero(clean[masked_row] == 0)[0])
    nulls = {2: (1, "trainer_logprobs", np.nan), 13: (0, "inference_logprobs", np.inf),
             0: (3, "trainer_logprobs", -np.inf), masked_row: (masked_at, "trainer_logprobs", np.nan)}  # fmt: skip
    for row, (position, _, _) in nulls.items():
        assert clean[row, position] == (row != masked_row)
    run_dir = prime_rl_exports(batch, tmp_path / "run", nulls)
    nan_batch = dict(batch, old=batch["old"].copy(), rollout=batch["rollout"].copy())
    for row, (position, column, _) in nulls.items():
        nan_batch["old" if column == "trainer_logprobs" else "rollout"][row, position] = np.nan
    with_nan = parquet_shards(nan_batch, tmp_path / "nan", np.arange(24))
    theirs = analyzed(capsys, with_nan, "--on-bad-row", "skip")
    code, out, err = run(capsys, "analyze", str(run_dir), "--format", "json", "--on-bad-row", "skip")
    assert code == 0, err
    ours = json.loads(out)
    same(ours, theirs)
    assert ours["input"]["skipped_by_reason"] == theirs["input"]["skipped_by_reason"] == {
        "bad_mask": 0, "nan": 3, "pos_inf": 0, "positive_logprob": 0}  # fmt: skip
    without = analyzed(capsys, parquet_shards(batch, tmp_path / "kept", np.setdiff1d(np.arange(24), [0, 2, 13])))
    assert ours["metrics"] == without["metrics"]
    notes = [line for line in err.splitlines() if "JSON null" in line]
    assert notes == [
        f"rcdiag: note: {run_dir}/token_exports/step_3/rank_0.jsonl: read 3 JSON null log-probs as NaN: "
        "'trainer_logprobs' 3 (first at row 0, position 5); " + NULLS,  # row 0's -inf, after its 2 prompt tokens
        f"rcdiag: note: {run_dir}/token_exports/step_7/rank_0.jsonl: read 1 JSON null log-prob as NaN: "
        "'inference_logprobs' 1 (first at row 1, position 2); " + NULLS,
    ], err


def test_prime_rl_null_stops_the_default_run_as_nan_does(
    batch: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The first bad row is row 0, whose legal -inf the exporter wrote as null (its sign is gone): one line, exit 2,
    counting row 2's NaN too; nothing printed but the error."""
    run_dir = prime_rl_exports(batch, tmp_path / "run", {2: (1, "trainer_logprobs", np.nan)})
    code, out, err = run(capsys, "analyze", str(run_dir))
    assert code == 2 and out == ""
    assert err == (
        f"rcdiag: error: {run_dir}/token_exports/step_3/rank_0.jsonl, row 0, column 'trainer_logprobs': holds NaN at "
        "valid position 5 of the response; 2 row(s) of the dump are bad (nan 2); fix the dump, or pass --on-bad-row "
        "skip to leave those rows out\n"
    )
