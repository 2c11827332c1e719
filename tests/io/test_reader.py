"""The canonical Parquet reader: layouts it accepts, and one clear error for each kind of bad file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ragged_lists, random_batch, write_dump

import rcdiag
from rcdiag.runtime.errors import InputError

P = "rollout_corr/"
CONFIG = rcdiag.CorrectionConfig(rollout_is="token", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1")


@pytest.fixture
def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return random_batch(np.random.default_rng(7), rows=20, width=16, noise=0.2, empty_rows=2)


def test_types_and_optional_mask_give_identical_metrics(tmp_path: Path, batch: tuple) -> None:
    old, rollout, mask = batch
    lists = ragged_lists(old, rollout, mask)
    base = rcdiag.analyze(write_dump(tmp_path / "a.parquet", lists), CONFIG)
    as_bool = dict(lists, response_mask=[[bool(v) for v in row] for row in lists["response_mask"]])
    f64 = write_dump(
        tmp_path / "b.parquet",
        as_bool,
        types={
            "old_log_prob": pa.large_list(pa.float64()),
            "rollout_log_prob": pa.list_(pa.float64()),
            "response_mask": pa.list_(pa.bool_()),
        },
    )
    assert rcdiag.analyze(f64, CONFIG).metrics == base.metrics
    # a fully valid batch without a mask column equals the same batch with an all-ones mask
    ones = np.ones_like(mask)
    full = ragged_lists(old, rollout, ones)
    with_mask = rcdiag.analyze(write_dump(tmp_path / "c.parquet", full), CONFIG)
    del full["response_mask"]
    without = rcdiag.analyze(write_dump(tmp_path / "d.parquet", full), CONFIG)
    assert without.metrics == with_mask.metrics
    assert without.input.columns["response_mask"] is None


def test_fixed_size_lists_padded_layout(tmp_path: Path, batch: tuple) -> None:
    old, rollout, mask = batch
    width = old.shape[1]
    table = pa.table(
        {
            "old_log_prob": pa.FixedSizeListArray.from_arrays(pa.array(old.reshape(-1)), width),
            "rollout_log_prob": pa.FixedSizeListArray.from_arrays(pa.array(rollout.reshape(-1)), width),
            "response_mask": pa.FixedSizeListArray.from_arrays(pa.array(mask.reshape(-1).astype(np.int8)), width),
        }
    )
    pq.write_table(table, tmp_path / "padded.parquet")
    ragged = rcdiag.analyze(write_dump(tmp_path / "ragged.parquet", ragged_lists(old, rollout, mask)), CONFIG)
    padded = rcdiag.analyze(tmp_path / "padded.parquet", CONFIG)
    assert padded.metrics == ragged.metrics
    assert padded.input.tokens == old.size and padded.input.valid_tokens == ragged.input.valid_tokens


def test_input_facts_and_metadata(tmp_path: Path) -> None:
    lists = {"old_log_prob": [[-1.0, -2.0], [], [-0.5]], "rollout_log_prob": [[-1.1, -2.0], [], [-0.4]]}
    lists["response_mask"] = [[1, 0], [], [1]]
    lists["step"] = [4, 4, 5]
    path = write_dump(tmp_path / "m.parquet", lists, metadata={"temperature": "0.6"})
    report = rcdiag.analyze(path)
    facts = report.input
    assert (facts.rows, facts.tokens, facts.valid_tokens, facts.empty_rows, facts.steps) == (3, 3, 2, 1, 2)
    assert facts.metadata == {"temperature": "0.6"}
    assert facts.format == "parquet"
    assert facts.columns == {
        "old_log_prob": "old_log_prob", "rollout_log_prob": "rollout_log_prob",
        "response_mask": "response_mask", "step": "step", "token_ids": None,
    }  # fmt: skip
    assert [s.step for s in report.steps] == [4, 5]
    assert report.steps[0].metrics[P + "kl"] == pytest.approx(-0.1, rel=1e-5)


def _error(path: Path) -> str:
    with pytest.raises(InputError) as info:
        rcdiag.analyze(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_file_directory_and_not_parquet(tmp_path: Path) -> None:
    assert _error(tmp_path / "nope.parquet") == f"{tmp_path / 'nope.parquet'}: file not found"
    assert "is a directory" in _error(tmp_path)
    junk = tmp_path / "junk.parquet"
    junk.write_text("hello, not parquet")
    assert "cannot be read as Parquet" in _error(junk)


def test_truncated_file(tmp_path: Path, batch: tuple) -> None:
    path = write_dump(tmp_path / "t.parquet", ragged_lists(*batch))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "cannot be read as Parquet" in _error(path)


def test_missing_column_names_what_is_there(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "x.parquet", {"old_log_prob": [[-1.0]], "rollout_lp": [[-1.0]]})
    message = _error(path)
    assert "no column for the rollout engine's per-token log-probs" in message
    assert "'rollout_lp'" in message and "--rollout-col NAME" in message


@pytest.mark.parametrize(
    ("columns", "types", "expected"),
    [
        (
            {"old_log_prob": [1.0], "rollout_log_prob": [[-1.0]], "seq_id": [0]},
            {"old_log_prob": pa.float64(), "seq_id": pa.int64()},
            "column 'rollout_log_prob': has type list<element: float>, expected a float (one log-prob per row",
        ),
        (
            {"old_log_prob": [[1]], "rollout_log_prob": [[-1.0]]},
            {"old_log_prob": pa.list_(pa.int64())},
            "expected a list of float32/float64",
        ),
        (
            {"old_log_prob": [[-1.0]], "rollout_log_prob": [[-1.0]], "response_mask": [["1"]]},
            {"response_mask": pa.list_(pa.string())},
            "column 'response_mask': has type list<element: string>",
        ),
        (
            {"old_log_prob": [[-1.0]], "rollout_log_prob": [[-1.0]], "step": ["a"]},
            {"step": pa.string()},
            "expected an integer training step",
        ),
    ],
)
def test_wrong_types(tmp_path: Path, columns: dict, types: dict, expected: str) -> None:
    assert expected in _error(write_dump(tmp_path / "w.parquet", columns, types=types))


def test_length_mismatch_names_row_and_columns(tmp_path: Path) -> None:
    columns = {"old_log_prob": [[-1.0], [-1.0, -2.0], [-3.0]], "rollout_log_prob": [[-1.0], [-1.0], [-3.0]]}
    message = _error(write_dump(tmp_path / "l.parquet", columns))
    assert "row 1" in message and "'old_log_prob' has 2 values but 'rollout_log_prob' has 1" in message
    columns = {"old_log_prob": [[-1.0]], "rollout_log_prob": [[-1.0]], "response_mask": [[1, 1]]}
    assert "'response_mask' has 2" in _error(write_dump(tmp_path / "m.parquet", columns))


def test_nulls(tmp_path: Path) -> None:
    columns = {"old_log_prob": [[-1.0], None], "rollout_log_prob": [[-1.0], [-2.0]]}
    assert "row 1, column 'old_log_prob': is null" in _error(write_dump(tmp_path / "n.parquet", columns))
    columns = {"old_log_prob": [[-1.0], [-1.0, None]], "rollout_log_prob": [[-1.0], [-2.0, -1.0]]}
    assert "null value at position 1" in _error(write_dump(tmp_path / "v.parquet", columns))
    columns = {"old_log_prob": [[-1.0]], "rollout_log_prob": [[-1.0]], "step": [None]}
    assert "column 'step': is null" in _error(write_dump(tmp_path / "s.parquet", columns))


def test_bad_values(tmp_path: Path) -> None:
    columns = {
        "old_log_prob": [[-1.0], [-1.0, -1.0]],
        "rollout_log_prob": [[-1.0], [-2.0, -1.0]],
        "response_mask": [[1], [1, 2]],
    }
    message = _error(write_dump(tmp_path / "m.parquet", columns))
    assert "row 1, column 'response_mask': holds the mask value 2 (a mask must be 0 or 1)" in message
    columns = {"old_log_prob": [[-1.0], [-1.0, float("nan")]], "rollout_log_prob": [[-1.0], [-2.0, -1.0]]}
    assert "row 1, column 'old_log_prob': holds NaN at valid position 1" in _error(
        write_dump(tmp_path / "n.parquet", columns)
    )
    columns = {"old_log_prob": [[-1.0]], "rollout_log_prob": [[float("inf")]]}
    assert "holds +inf" in _error(write_dump(tmp_path / "i.parquet", columns))
    columns = {"old_log_prob": [[0.4, 0.9]], "rollout_log_prob": [[-1.0, -1.0]]}
    message = _error(write_dump(tmp_path / "p.parquet", columns))
    assert "positive log-prob (0.4)" in message and "probabilities or logits" in message
    # a bad value at a masked position is ignored
    columns = {
        "old_log_prob": [[-1.0, float("nan")]],
        "rollout_log_prob": [[-1.0, 5.0]],
        "response_mask": [[1, 0]],
    }
    report = rcdiag.analyze(write_dump(tmp_path / "ok.parquet", columns))
    assert (report.input.valid_tokens, report.metrics["rollout_corr/kl"]) == (1, 0.0)


def test_empty_dump_and_all_masked_dump(tmp_path: Path) -> None:
    empty = write_dump(tmp_path / "e.parquet", {"old_log_prob": [], "rollout_log_prob": []})
    assert "has no rows" in _error(empty)
    masked = write_dump(
        tmp_path / "z.parquet",
        {"old_log_prob": [[-1.0], []], "rollout_log_prob": [[-1.0], []], "response_mask": [[0], []]},
    )
    report = rcdiag.analyze(masked)
    assert [f.code for f in report.findings] == ["verl_crash_empty_batch"]


def test_single_giant_row_group_is_streamed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    old, rollout, mask = random_batch(rng, rows=200, width=50, noise=0.1)
    path = tmp_path / "one_group.parquet"
    table = pa.table(
        {
            k: pa.array(v, type=pa.list_(pa.float32() if "log" in k else pa.int8()))
            for k, v in ragged_lists(old, rollout, mask).items()
        }
    )
    pq.write_table(table, path, row_group_size=1 << 20)
    from rcdiag.io import open_dump

    chunks = list(open_dump(path).chunks(chunk_tokens=500))
    assert len(chunks) > 5 and max(c.n_tokens for c in chunks) <= 500
    assert sum(c.n_rows for c in chunks) == 200


def test_row_groups_of_mixed_sizes_come_in_file_order(tmp_path: Path) -> None:
    """Row groups smaller and larger than a chunk: every row arrives once, in file order, with its file row
    number (for error messages), in chunks of at most the chunk size."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, 300)
    old = [(-rng.random(n)).astype(np.float32).tolist() for n in lengths]
    table = pa.table(
        {
            "old_log_prob": pa.array(old, type=pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(old, type=pa.list_(pa.float32())),
            "response_mask": pa.array([[1] * n for n in lengths], type=pa.list_(pa.int8())),
        }
    )
    path = tmp_path / "groups.parquet"
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for size in (7, 60, 5, 5, 150, 3, 70):
            writer.write_table(table.slice(start, size))
            start += size
    assert pq.ParquetFile(path).metadata.num_row_groups == 7
    from rcdiag.io import open_dump

    chunks = list(open_dump(path).chunks(chunk_tokens=300))
    assert [c.first_row for c in chunks] == list(np.cumsum([0] + [c.n_rows for c in chunks[:-1]]))
    flat = np.concatenate([c.old for c in chunks])
    np.testing.assert_array_equal(flat, np.concatenate(old).astype(np.float32))
    assert max(c.n_tokens for c in chunks) <= 300


def test_sparse_and_dense_segment_counts_agree() -> None:
    from rcdiag.metrics.backend import NumpyBackend

    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 30, 200)  # empty rows included
    seg = NumpyBackend().segments(lengths)
    for density in (0.001, 0.05, 0.5, 1.0):
        cond = rng.random(int(lengths.sum())) < density
        expected = [int(part.sum()) for part in np.split(cond, np.cumsum(lengths)[:-1])]
        assert seg.count(cond).tolist() == expected


@pytest.mark.parametrize("part", [None, (1, 2, 3)])
def test_whole_row_groups_and_streamed_batches_read_the_same_rows(tmp_path: Path, part: tuple | None) -> None:
    """Small row groups are decoded whole, two at a time; large ones are streamed in batches. Both give the same
    rows, in order, numbered from the file's first row (what bad-row messages name)."""
    from rcdiag.io.parquet import WHOLE_GROUP_CHUNKS, ParquetFile

    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 60, 500)
    old = [(-np.abs(rng.normal(size=n))).astype(np.float32).tolist() for n in lengths]
    table = pa.table({"old_log_prob": old, "rollout_log_prob": old, "response_mask": [[1] * n for n in lengths]})
    path = tmp_path / "groups.parquet"
    pq.write_table(table, path, row_group_size=90)
    source = ParquetFile(path)
    columns = ["old_log_prob", "rollout_log_prob", "response_mask"]
    largest = max(source._group_tokens(g) for g in range(source.file.metadata.num_row_groups))
    whole = list(source.batches(largest, columns, part))  # every group within WHOLE_GROUP_CHUNKS chunks
    streamed = list(source.batches(max(largest // (WHOLE_GROUP_CHUNKS + 1), 1), columns, part))
    assert len(streamed) > len(whole)
    first = 0 if part is None else 90 * part[0]
    expected = table.slice(first, 90 * len(part)) if part else table
    for batches in (whole, streamed):
        assert pa.Table.from_batches([b.data for b in batches]).equals(expected)
        assert [b.first_row for b in batches] == list(np.cumsum([first] + [b.data.num_rows for b in batches[:-1]]))
