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
import time
from collections.abc import Callable
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


def miles_run(batch: dict, directory: Path) -> dict[int, list[Path]]:
    """Both steps as Miles writes them (two data-parallel shards, context parallel 2, tensor parallel 2: 8 rank
    files per rollout), each rollout's files by rank."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for step in STEPS:
        ss = step_samples(batch, step)
        files[step] = td.miles_ranks(directory, step, [ss[0::2], ss[1::2]], cp_size=2, tp_size=2)
    return files


def watch_lines(capsys: pytest.CaptureFixture, directory: Path, state: Path) -> list[dict]:
    code, out, err = run(capsys, "watch", str(directory), "--state", str(state), "--once", "--settle", "0",
                         "--format", "json")  # fmt: skip
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def merged(capsys: pytest.CaptureFixture, state: Path) -> dict:
    code, out, err = run(capsys, "merge", str(state), "--format", "json")
    assert code == 0, err
    return json.loads(out)


def same_steps(events: list[dict], canonical: dict) -> None:
    """Each step reported once, never revised, with the canonical step's numbers bit for bit."""
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(STEPS) and not any(e["revised"] for e in steps)
    for event, theirs in zip(steps, canonical["steps"], strict=True):
        assert (event["metrics"], event["extras"], event["rows"], event["valid_tokens"]) == (
            theirs["metrics"], theirs["extras"], theirs["rows"], theirs["valid_tokens"])  # fmt: skip


def test_a_miles_rollout_counts_once_in_a_directory_a_glob_workers_and_watch(
    batch: dict, canonical: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every rank file reads its whole rollout, so each rollout is one unit wherever rcdiag splits a dump: the
    directory, a glob matching some rank files of each rollout, two workers (a part per rollout, opened through its
    lowest rank), and ``watch --once`` (one step line per rollout, its state merging to the directory's numbers)."""
    require("torch", "gpu")
    files = miles_run(batch, tmp_path / "train_data")
    directory = tmp_path / "train_data"
    from rcdiag.io import open_dump

    parts = open_dump(directory).partitions(2)
    assert [[Path(path).name for _, path in part.files] for part in parts] == [["3_0.pt"], ["7_0.pt"]]
    for target, flags in ((directory, ()), (directory, ("--workers", "2")), (directory / "*_[36].pt", ())):
        same(analyzed(capsys, target, *flags), canonical)
    events = watch_lines(capsys, directory, tmp_path / "w.json")
    same_steps(events, canonical)
    assert [e["file"] for e in events if e["kind"] == "step"] == ["3_0.pt", "7_0.pt"]
    assert [e["files"] for e in events if e["kind"] == "step"] == [8, 16]  # files read: every rank file
    same(merged(capsys, tmp_path / "w.json"), canonical)
    assert len(files[3]) == len(files[7]) == 8


def test_a_miles_rollout_is_one_part_under_ray(
    batch: dict, canonical: dict, tmp_path: Path, capsys: pytest.CaptureFixture, ray_local: object
) -> None:
    """Ray's tasks take the parts ``--workers`` takes: each rollout read once, whole."""
    require("torch", "gpu")
    miles_run(batch, tmp_path)
    same(analyzed(capsys, tmp_path, "--ray"), canonical)


def arrival_order(files: dict[int, list[Path]]) -> list[Path]:
    """Rollout after rollout (each rank saves its file after the rollout's training step, before the next one's),
    the ranks of one rollout in no fixed order (they write at once): here shuffled."""
    rng = np.random.default_rng(8)
    return [files[step][i] for step in STEPS for i in rng.permutation(len(files[step]))]


def test_a_live_watch_reads_each_miles_rollout_once_all_its_ranks_are_there(
    batch: dict, canonical: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Rank files landing one per poll: the first rollout waits (how many ranks a run has is not in its files) until
    the next rollout's first file proves it whole; the second is read as its last rank lands, once the ranks of the
    first are there. A rank file arriving after its rollout was read, and one rewritten, are said as changed files,
    never read again: the numbers stay the directory's as read."""
    from rcdiag.watch import Watch

    require("torch", "gpu")
    staged = miles_run(batch, tmp_path / "staged")
    directory, state = tmp_path / "train_data", tmp_path / "w.json"
    directory.mkdir()
    session = Watch(str(directory), state_path=state, settle=0.0)
    read_at: list[tuple[int, list[int]]] = []
    for landed, file in enumerate(arrival_order(staged), 1):
        (directory / file.name).write_bytes(file.read_bytes())
        events: list = []
        units, waiting, _ = session.poll_once(events.append)
        steps = [e.step.step for e in events if hasattr(e, "revised")]
        assert units == len(steps)
        if steps:
            read_at.append((landed, steps))
        assert waiting == landed - 8 * sum(len(s) for _, s in read_at)
    assert read_at == [(9, [3]), (16, [7])]
    session.close()

    (directory / "3_8.pt").write_bytes(staged[3][1].read_bytes())  # a rank file after its rollout was read
    (directory / "7_2.pt").write_bytes(staged[7][2].read_bytes() + b"")  # rewritten: the same bytes, a new stamp
    os.utime(directory / "7_2.pt", ns=(1, 1))
    events = watch_lines(capsys, directory, state)
    assert [e["kind"] for e in events] == ["report"]
    alerts = {a["key"]: a for a in events[0]["alerts"]}
    assert sorted(alerts) == ["file:3_8.pt", "file:7_2.pt"]
    assert alerts["file:3_8.pt"]["message"] == (
        f"3_8.pt in {directory} appeared after the watch read its rollout's rank files: the watch keeps the rollout "
        "as it read it, without this file, and does not read it (alone it would count the rollout again); `rcdiag "
        "analyze` of the directory reads the rollout with it"
    )
    assert alerts["file:3_8.pt"]["detail"]["read"] is None
    assert alerts["file:7_2.pt"]["message"].startswith(f"7_2.pt in {directory} changed (modified) after the watch")
    same(merged(capsys, state), canonical)
    assert watch_lines(capsys, directory, state) == []  # said once


def test_the_watch_command_follows_miles_rank_files_as_they_land(batch: dict, canonical: dict, tmp_path: Path) -> None:
    """``rcdiag watch`` in its own process while the rank files are written in place (as ``torch.save`` writes
    them), one every few polls: one line per rollout, with the directory's numbers."""
    require("torch", "gpu")
    staged = miles_run(batch, tmp_path / "staged")
    directory = tmp_path / "train_data"
    directory.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "rcdiag", "watch", str(directory), "--state", str(tmp_path / "w.json"),
               "--format", "json", "--poll", "0.05", "--settle", "0.2", "--max-idle", "3"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as watch:
        time.sleep(1.0)  # started
        for file in arrival_order(staged):
            with open(directory / file.name, "wb") as handle:
                data = file.read_bytes()
                handle.write(data[: len(data) // 2])
                handle.flush()
                time.sleep(0.05)  # half written for a poll
                handle.write(data[len(data) // 2 :])
            time.sleep(0.3)
        out, err = watch.communicate(timeout=120)
    assert watch.returncode == 0, err
    same_steps([json.loads(line) for line in out.splitlines()], canonical)


def test_a_whole_dump_details_folder_is_refused_naming_its_train_data(
    batch: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Miles' ``--dump-details`` folder holds the rollout side (``rollout_data/{id}.pt``, ``dashboard_columns/
    rollout_{id}.parquet``, ``trajectory/{id}.jsonl``: ``miles/ray/rollout/debug_data.py``) beside ``train_data/``:
    one line saying which subfolder to give, exit 2; nothing is guessed."""
    torch = require("torch", "gpu")
    details = tmp_path / "dump_details"
    miles_run(batch, details / "train_data")
    for sub in ("rollout_data", "dashboard_columns", "trajectory"):
        (details / sub).mkdir()
    torch.save({"rollout_id": 3, "metadata": {}, "samples": [{"index": 0, "tokens": [1, 2]}]},
               details / "rollout_data" / "3.pt")  # fmt: skip
    write_dump(details / "dashboard_columns" / "rollout_3.parquet", {"index": [0], "rollout_log_probs": [[-0.1]]})
    (details / "trajectory" / "3.jsonl").write_text('{"index":0,"messages":[]}\n')
    code, out, err = run(capsys, "analyze", str(details))
    assert code == 2 and out == ""
    assert err == (
        f"rcdiag: error: {details}: mixes jsonl, parquet and torch files (1 jsonl, 1 parquet, 17 torch): a "
        "--dump-details folder (Miles', slime's) holds the rollout side beside the training dump in train_data/; give "
        f"that subfolder: {details / 'train_data'}\n"
    )


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
    return td.prime_rl_exports(directory, batch["steps"], exporter_record(batch, nulls))


def exporter_record(batch: dict, nulls: dict[int, tuple[int, str, float]]) -> Callable[[int, int, int], dict]:
    """``record(row, step, rank)``: one export record of the batch's row (``prime_rl_exports``)."""

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

    return record


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
    """The first bad row is row 0, whose legal -inf the exporter wrote as null (its sign is gone): one line naming
    the value as the file holds it, exit 2, counting row 2's null too; nothing printed but the error."""
    run_dir = prime_rl_exports(batch, tmp_path / "run", {2: (1, "trainer_logprobs", np.nan)})
    code, out, err = run(capsys, "analyze", str(run_dir))
    assert code == 2 and out == ""
    code, _, from_workers = run(capsys, "analyze", str(run_dir), "--workers", "2")
    assert code == 2 and from_workers.splitlines()[-1] == err.strip()  # a worker names it alike
    assert err == (
        f"rcdiag: error: {run_dir}/token_exports/step_3/rank_0.jsonl, row 0, column 'trainer_logprobs': holds null "
        "(a non-finite value written as null) at valid position 5 of the response; 2 row(s) of the dump are bad "
        "(nan 2); fix the dump, or pass --on-bad-row skip to leave those rows out\n"
    )


def test_a_nan_the_file_holds_as_nan_is_still_named_nan(
    batch: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A record whose log-prob is the JSON literal NaN (Python's json writes it; prime-rl's exporter never does)
    beside a null in another row of the same batch: each is named as the file holds it, at its own row."""
    nulls = {2: (1, "trainer_logprobs", np.nan)}

    def line(record: dict) -> str:  # row 0's -inf (the first record of step 3, rank 0) written as the literal NaN
        if record["step"] == 3 and record["rank"] == 0 and record["trainer_logprobs"][5] is None:
            record = dict(record, trainer_logprobs=[*record["trainer_logprobs"][:5], float("nan"),
                                                    *record["trainer_logprobs"][6:]])  # fmt: skip
        return json.dumps(record) + "\n"

    run_dir = td.prime_rl_exports(tmp_path / "run", batch["steps"], exporter_record(batch, nulls), line)
    text = (run_dir / "token_exports" / "step_3" / "rank_0.jsonl").read_text().splitlines()
    assert "NaN" in text[0] and "null" in text[2].split('"trainer_logprobs"')[1].split("]")[0]
    code, _, err = run(capsys, "analyze", str(run_dir))
    assert code == 2
    assert ", row 0, column 'trainer_logprobs': holds NaN at valid position 5 of the response; 2 row(s)" in err
    code, _, err = run(capsys, "analyze", str(run_dir / "token_exports" / "step_3" / "rank_0.jsonl"), "--on-bad-row",
                       "skip", "--format", "json")  # fmt: skip
    assert code == 0, err
    notes = [line for line in err.splitlines() if "JSON null" in line]
    assert notes == [
        f"rcdiag: note: {run_dir}/token_exports/step_3/rank_0.jsonl: read 1 JSON null log-prob as NaN: "
        "'trainer_logprobs' 1 (first at row 2, position 3); " + NULLS
    ]
