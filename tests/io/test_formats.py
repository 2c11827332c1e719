"""The same batch in every layout and container gives the metrics of the canonical dump, to float64 rounding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import trainer_dumps
from conftest import assert_metrics_close, ragged_lists, random_batch, write_dump

import rcdiag

CONFIG = rcdiag.CorrectionConfig(
    rollout_is="token", rollout_rs="seq_mean_k1,token_k2", rollout_rs_threshold="0.9_1.1,0.5"
)
STEPS = (3, 7)


@pytest.fixture(scope="module")
def batch() -> dict:
    """Padded arrays, a step per row, and the canonical ragged dump's report."""
    old, rollout, mask = random_batch(np.random.default_rng(11), rows=24, width=18, noise=0.2, empty_rows=2)
    old[0, 3] = -np.inf  # legal at a valid position, counted
    mask[0, 3] = 1
    steps = np.repeat(np.array(STEPS), 12)
    return {"old": old, "rollout": rollout, "mask": mask, "steps": steps}


@pytest.fixture(scope="module")
def canonical(batch: dict, tmp_path_factory: pytest.TempPathFactory) -> rcdiag.Report:
    lists = ragged_lists(batch["old"], batch["rollout"], batch["mask"])
    lists["step"] = batch["steps"].tolist()
    return rcdiag.analyze(write_dump(tmp_path_factory.mktemp("c") / "canonical.parquet", lists), CONFIG)


def same(report: rcdiag.Report, canonical: rcdiag.Report) -> None:
    assert_metrics_close(report.metrics, canonical.metrics, rel=1e-9, abs_tol=1e-12)
    assert [s.step for s in report.steps] == list(STEPS)
    for ours, theirs in zip(report.steps, canonical.steps, strict=True):
        assert_metrics_close(ours.metrics, theirs.metrics, rel=1e-9, abs_tol=1e-12)
        assert (ours.rows, ours.valid_tokens) == (theirs.rows, theirs.valid_tokens)
    assert report.input.rows == canonical.input.rows == 24
    assert report.input.neg_inf_tokens == {"old_log_prob": 1, "rollout_log_prob": 0}


def padded_table(batch: dict, fixed: bool) -> pa.Table:
    width = batch["old"].shape[1]

    def column(values: np.ndarray) -> pa.Array:
        flat = pa.array(values.reshape(-1))
        if fixed:
            return pa.FixedSizeListArray.from_arrays(flat, width)
        return pa.ListArray.from_arrays(pa.array(np.arange(values.shape[0] + 1, dtype=np.int32) * width), flat)

    return pa.table(
        {
            "old_log_probs": column(batch["old"]),
            "rollout_log_probs": column(batch["rollout"]),
            "response_mask": column(batch["mask"]),
            "global_step": pa.array(batch["steps"]),
        }
    )


def long_table(batch: dict, seed: int = 0) -> pa.Table:
    """One row per token, sequences interleaved in a shuffled order."""
    rows, width = batch["old"].shape
    seq = np.repeat(np.arange(rows), width)
    order = np.random.default_rng(seed).permutation(seq.shape[0])
    return pa.table(
        {
            "seq_id": pa.array((seq * 7 + 1000)[order]),
            "old_log_prob": pa.array(batch["old"].reshape(-1)[order]),
            "rollout_log_prob": pa.array(batch["rollout"].reshape(-1)[order]),
            "response_mask": pa.array(batch["mask"].reshape(-1)[order].astype(np.int8)),
            "step": pa.array(np.repeat(batch["steps"], width)[order]),
        }
    )


@pytest.mark.parametrize("fixed", [True, False])
def test_padded_lists_with_verl_names(batch: dict, canonical: rcdiag.Report, tmp_path: Path, fixed: bool) -> None:
    path = tmp_path / "padded.parquet"
    pq.write_table(padded_table(batch, fixed), path)
    report = rcdiag.analyze(path, CONFIG)
    same(report, canonical)
    assert report.input.columns == {
        "old_log_prob": "old_log_probs", "rollout_log_prob": "rollout_log_probs",
        "response_mask": "response_mask", "step": "global_step", "token_ids": None,
    }  # fmt: skip


@pytest.mark.parametrize("chunk_tokens", [1 << 20, 40])
def test_long_layout_interleaved_across_files(
    batch: dict, canonical: rcdiag.Report, tmp_path: Path, chunk_tokens: int
) -> None:
    table = long_table(batch)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), tmp_path / "part-0.parquet", row_group_size=50)
    pq.write_table(table.slice(half), tmp_path / "part-1.parquet", row_group_size=50)
    report = rcdiag.analyze(tmp_path, CONFIG, chunk_tokens=chunk_tokens)  # 40: spills to hash buckets
    same(report, canonical)
    assert report.input.format == "parquet (long), 2 files" and report.input.columns["seq_id"] == "seq_id"


def test_long_layout_string_ids_unknown_total(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    table = long_table(batch, seed=1)
    table = table.set_column(0, "seq_id", pa.array([f"s{v}" for v in table.column("seq_id").to_pylist()]))
    table = table.rename_columns(["uid_x", *table.column_names[1:]])
    path = tmp_path / "long.arrows"
    with pa.ipc.new_stream(path, table.schema) as writer:
        for piece in table.to_batches(max_chunksize=97):
            writer.write_batch(piece)
    same(rcdiag.analyze(path, CONFIG, chunk_tokens=30, columns=rcdiag.ColumnMap(seq="uid_x")), canonical)


@pytest.mark.parametrize("suffix", [".arrow", ".feather", ".arrows"])
def test_arrow_ipc(batch: dict, canonical: rcdiag.Report, tmp_path: Path, suffix: str) -> None:
    table = padded_table(batch, fixed=False)
    path = tmp_path / f"dump{suffix}"
    if suffix == ".feather":
        feather.write_feather(table, path)
    else:
        writer_type = pa.ipc.new_file if suffix == ".arrow" else pa.ipc.new_stream
        with writer_type(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=5)
    report = rcdiag.analyze(path, CONFIG)
    same(report, canonical)
    assert report.input.format == ("arrow-ipc-stream" if suffix == ".arrows" else "arrow-ipc-file")


def test_directory_and_glob_of_shards(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    lists = ragged_lists(batch["old"], batch["rollout"], batch["mask"])
    lists["step"] = batch["steps"].tolist()
    for i, (a, b) in enumerate([(0, 5), (5, 17), (17, 24)]):
        write_dump(tmp_path / f"shard_{i * 5}.parquet", {k: v[a:b] for k, v in lists.items()})
    (tmp_path / ".shard_99.parquet.123.tmp").write_bytes(b"half a file")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    same(rcdiag.analyze(tmp_path, CONFIG), canonical)
    report = rcdiag.analyze(str(tmp_path / "shard_*.parquet"), CONFIG)
    same(report, canonical)
    assert report.input.files == 3


def nemo_rl_files(batch: dict, directory: Path, prompt: int = 3) -> None:
    """NeMo-RL writes padded rows with the prompt in front (mask 0) and each tensor as a batch of one."""
    for step in STEPS:
        rows = np.flatnonzero(batch["steps"] == step)
        with open(directory / f"train_data_step{step}.jsonl", "w") as handle:
            for i, r in enumerate(rows):
                pad = [0.0] * prompt
                record = {
                    "content": ["..."],
                    "rewards": [1.0],
                    "token_ids": [[1] * (prompt + batch["old"].shape[1])],
                    "token_loss_mask": [[0] * prompt + batch["mask"][r].tolist()],
                    "sample_loss_mask": [1.0],
                    "advantages": [[0.5] * (prompt + batch["old"].shape[1])],
                    "generation_logprobs": [pad + batch["rollout"][r].astype(float).tolist()],
                    "prev_logprobs": [[-0.1] * prompt + batch["old"][r].astype(float).tolist()],
                    "input_lengths": [prompt + batch["old"].shape[1]],
                    "idx": i,
                }
                handle.write(json.dumps(record) + "\n")


def test_nemo_rl_dumps(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    nemo_rl_files(batch, tmp_path)
    (tmp_path / "val_data_step3.jsonl").write_text("{}\n")
    report = rcdiag.analyze(tmp_path, CONFIG)
    same(report, canonical)
    assert report.input.columns == {
        "old_log_prob": "prev_logprobs", "rollout_log_prob": "generation_logprobs",
        "response_mask": "token_loss_mask * sample_loss_mask", "step": "<file name>",
    }  # fmt: skip
    as_trl = rcdiag.analyze(tmp_path, CONFIG, framework="trl").input.columns  # read only for --as
    assert as_trl == {**report.input.columns, "advantages": "advantages"}
    single = rcdiag.analyze(tmp_path / "train_data_step7.jsonl", CONFIG)
    assert [s.step for s in single.steps] == [7]
    assert_metrics_close(single.metrics, canonical.steps[1].metrics, rel=1e-9, abs_tol=1e-12)


def test_nemo_rl_sample_loss_mask_drops_a_sample(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    nemo_rl_files(batch, tmp_path)
    path = tmp_path / "train_data_step3.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["sample_loss_mask"] = [0.0]
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    report = rcdiag.analyze(path, CONFIG)
    assert report.input.empty_rows >= 1 and report.input.rows == 12
    assert report.input.valid_tokens == int(batch["mask"][:12].sum() - batch["mask"][1].sum())


def test_prime_rl_token_exports(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    def record(row: int, step: int, rank: int) -> dict:
        return {
            "schema_version": 2,
            "step": step,
            "token_ids": [5, 6] + [1] * batch["old"].shape[1],
            "loss_mask": [False, False] + [bool(v) for v in batch["mask"][row]],
            "temperatures": [0.7] * (2 + batch["old"].shape[1]),
            "inference_logprobs": [0.0, 0.0, *batch["rollout"][row].astype(float).tolist()],
            "trainer_logprobs": [-1.0, -2.0, *batch["old"][row].astype(float).tolist()],
        }

    # json.dumps' -Infinity keeps the batch's -inf (prime-rl's exporter would write null: tests/io/test_trainer_dumps.py)
    trainer_dumps.prime_rl_exports(tmp_path / "run", batch["steps"], record, line=lambda r: json.dumps(r) + "\n")
    report = rcdiag.analyze(tmp_path / "run", CONFIG)
    same(report, canonical)
    assert report.input.format == "prime-rl, 4 files" and report.input.metadata["temperature"] == "0.7"
    assert report.input.columns["old_log_prob"] == "trainer_logprobs"


def test_torch_pt_with_verl_batch_names(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "batch.pt"
    torch.save(
        {
            "old_log_probs": torch.from_numpy(batch["old"]),
            "rollout_log_probs": torch.from_numpy(batch["rollout"]),
            "response_mask": torch.from_numpy(batch["mask"]),
            "step": torch.from_numpy(batch["steps"]),
            "temperature": 0.6,
        },
        path,
    )
    report = rcdiag.analyze(path, CONFIG)
    same(report, canonical)
    assert report.input.metadata == {"temperature": "0.6"}


def test_slime_debug_train_data(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    for step in STEPS:
        rows = np.flatnonzero(batch["steps"] == step)
        lengths = [int(np.flatnonzero(batch["mask"][r])[-1]) + 1 if batch["mask"][r].any() else 0 for r in rows]
        data = {
            "tokens": [torch.ones(n + 4, dtype=torch.long) for n in lengths],
            "response_lengths": lengths,
            "log_probs": [torch.from_numpy(batch["old"][r, :n].copy()) for r, n in zip(rows, lengths, strict=True)],
            "rollout_log_probs": [batch["rollout"][r, :n].tolist() for r, n in zip(rows, lengths, strict=True)],
            "loss_masks": [torch.from_numpy(batch["mask"][r, :n].copy()) for r, n in zip(rows, lengths, strict=True)],
        }
        torch.save({"rollout_id": int(step), "rank": 0, "rollout_data": data}, tmp_path / f"rollout_{step}_rank0.pt")
    report = rcdiag.analyze(tmp_path, CONFIG)
    same(report, canonical)
    assert report.input.columns["old_log_prob"] == "log_probs" and report.input.columns["step"] == "rollout_id"
    assert report.input.step_source == "key 'rollout_id'"


def test_npz(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    path = tmp_path / "batch.npz"
    np.savez(
        path,
        old_log_probs=batch["old"],
        rollout_log_probs=batch["rollout"],
        response_mask=batch["mask"],
        step=batch["steps"],
    )
    same(rcdiag.analyze(path, CONFIG), canonical)


def test_dump_writer_round_trip(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    directory = tmp_path / "run"
    with rcdiag.DumpWriter(directory, metadata={"temperature": 1.0, "model": "toy"}) as writer:
        for step in STEPS:
            rows = batch["steps"] == step
            writer.write(
                step=int(step),
                old_log_prob=batch["old"][rows],
                rollout_log_prob=batch["rollout"][rows].tolist(),
                response_mask=batch["mask"][rows],
            )
    report = rcdiag.analyze(directory, CONFIG)
    same(report, canonical)
    assert report.input.metadata["temperature"] == "1.0" and report.input.metadata["model"] == "toy"


def test_plain_jsonl(batch: dict, canonical: rcdiag.Report, tmp_path: Path) -> None:
    lists = ragged_lists(batch["old"], batch["rollout"], batch["mask"])
    path = tmp_path / "dump.jsonl"
    with open(path, "w") as handle:
        for i in range(batch["old"].shape[0]):
            record = {key: [float(v) for v in values[i]] for key, values in lists.items()}
            handle.write(json.dumps({**record, "step": int(batch["steps"][i])}) + "\n")
    report = rcdiag.analyze(path, CONFIG, chunk_tokens=50)
    same(report, canonical)
    assert report.input.format == "jsonl"
