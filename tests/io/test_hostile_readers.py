"""Readers under hostile input (issue 32): a file truncated while it is read, JSON Lines beyond Python's parser's
own bounds, ``.pt`` tensors whose shape declares more than their storage holds, and bad ``RCDIAG_*`` values.

Every case runs the real CLI in a capped subprocess (``hostile.run_capped``) and asserts the exit code and the one
error line exactly; each file is built here, in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from hostile import Result, run_capped

from rcdiag.io.limits import MAX_JSON_DEPTH, TENSOR_BYTES, check_environment
from rcdiag.runtime.errors import SettingError

GOOD = {"old_log_prob": [-0.5, -1.0], "rollout_log_prob": [-0.6, -1.1], "response_mask": [1, 1]}


def one_line(result: Result) -> str:
    """The error line of a run that must fail with exit 2 and say nothing else."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    err = result.stderr
    assert err.startswith("rcdiag: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- 1. a file truncated while it is read ---------------------------------------------------------------------------


def _big_batch() -> pa.RecordBatch:
    rows, length = 256, 2048
    offsets = pa.array(np.arange(0, rows * length + 1, length, dtype=np.int32))
    old = -np.random.default_rng(0).random(rows * length, dtype=np.float32)
    batch = pa.record_batch(
        {
            "old_log_prob": pa.ListArray.from_arrays(offsets, pa.array(old)),
            "rollout_log_prob": pa.ListArray.from_arrays(offsets, pa.array(old - np.float32(0.01))),
            "response_mask": pa.ListArray.from_arrays(offsets, pa.array(np.ones(rows * length, dtype=np.int8))),
        }
    )
    return batch


def _write_big(path: Path, kind: str, batches: int) -> Path:
    """About 4.7 MB a batch: ``batches`` record batches (Arrow IPC file or stream) or row groups (Parquet)."""
    batch = _big_batch()
    schema = batch.schema
    if kind == "parquet":
        with pq.ParquetWriter(path, schema, compression="none") as writer:
            for _ in range(batches):
                writer.write_batch(batch)
        return path
    with (ipc.new_stream if kind == "stream" else ipc.new_file)(str(path), schema) as writer:
        for _ in range(batches):
            writer.write_batch(batch)
    return path


@pytest.mark.parametrize(
    ("kind", "name", "batches", "tries"),
    [("file", "dump.arrow", 40, 6), ("stream", "dump.arrows", 20, 3), ("parquet", "dump.parquet", 20, 3)],
)
def test_a_file_truncated_while_it_is_read_is_exit_0_or_2_never_a_signal(
    tmp_path: Path, kind: str, name: str, batches: int, tries: int
) -> None:
    """A memory-mapped Arrow IPC file that shrank under the reader killed it with SIGBUS (exit 135 / -7, nothing on
    stderr). Each try truncates the file at another moment of a run (spread over a whole run's duration)."""
    source = _write_big(tmp_path / f"source-{name}", kind, batches)
    path = tmp_path / name
    shutil.copy(source, path)
    start = time.monotonic()
    assert run_capped("analyze", path).returncode == 0
    duration = time.monotonic() - start
    outcomes = []
    for i in range(tries):
        shutil.copy(source, path)
        done: list[Result] = []
        reader = threading.Thread(target=lambda done=done: done.append(run_capped("analyze", path)))
        reader.start()
        time.sleep(duration * (i + 1) / (tries + 1))
        os.truncate(path, source.stat().st_size // 3)
        reader.join()
        result = done[0]
        assert result.returncode in (0, 2), (i, result.returncode, result.stderr[-2000:])
        if result.returncode == 2:
            assert one_line(result).startswith(f"rcdiag: error: {path}: cannot be read"), result.stderr
        outcomes.append(result.returncode)
    assert 2 in outcomes, outcomes  # at least one truncation landed before the run ended


# -- 2. JSON Lines beyond the parser's bounds -----------------------------------------------------------------------


def _jsonl(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _record(**extra: object) -> str:
    return json.dumps({**GOOD, **extra})


@pytest.mark.parametrize("levels", [3000, 1_000_000])
def test_jsonl_nested_too_deep_in_an_ignored_key_is_one_line(tmp_path: Path, levels: int) -> None:
    """It was RecursionError, exit 3, for 3,000 levels in a key rcdiag does not read."""
    deep = "[" * levels + "]" * levels
    path = _jsonl(tmp_path / "deep.jsonl", _record(), _record()[:-1] + f', "extra": {deep}}}')
    assert one_line(run_capped("analyze", path)) == (
        f"rcdiag: error: {path}, row 1: nests arrays or objects {levels + 1:,} deep, beyond rcdiag's limit of "
        f"{MAX_JSON_DEPTH} (a dump's values nest a few levels: a list of numbers, a batch of one)\n"
    )


def test_jsonl_brackets_in_strings_and_many_shallow_lists_are_read(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "ok.jsonl", _record(note="[" * 500 + "{", ids=[[1]] * 500, nested=[[[[1.0]]]]))
    result = run_capped("analyze", path, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["input"]["rows"] == 1


def test_jsonl_integer_beyond_pythons_digit_limit_is_one_line(tmp_path: Path) -> None:
    """It was ValueError (Python's 4,300-digit bound on int()), exit 3."""
    path = _jsonl(tmp_path / "int.jsonl", _record()[:-1] + f', "id": {"7" * 5000}}}')
    assert one_line(run_capped("analyze", path)) == (
        f"rcdiag: error: {path}, row 0: holds an integer of more than 4,300 digits, beyond what Python reads (a "
        "dump's numbers are log-probs, masks, ids, steps)\n"
    )


@pytest.mark.parametrize(
    ("first", "later", "row", "holds"),
    [
        (["a", "b"], None, 0, 'strings ("a" at position 0)'),
        ([-0.5, -1.0], [-0.5, "x"], 1, 'strings ("x" at position 1)'),
        ({"a": 1}, None, 0, "an object"),
        (None, None, 0, "null"),
        ([[-0.5], [-1.0, -2.0]], None, 0, "lists ([-0.5] at position 0)"),
    ],
    ids=["strings", "strings-later", "object", "null", "lists"],
)
def test_jsonl_log_probs_of_another_kind_are_named_not_missing(
    tmp_path: Path, first: object, later: object, row: int, holds: str
) -> None:
    """``old_log_prob`` holding strings was reported missing ("has no column for the trainer's log-probs")."""
    lines = [_record(old_log_prob=first)] + ([_record(old_log_prob=later)] if later is not None else [])
    path = _jsonl(tmp_path / "odd.jsonl", *lines)
    assert one_line(run_capped("analyze", path)) == (
        f"rcdiag: error: {path}, row {row}, column 'old_log_prob': holds {holds}, expected a list of numbers (one "
        "per token)\n"
    )


@pytest.mark.parametrize(
    ("name", "line", "key"),
    [
        ("run.jsonl", '{"old_log_prob": [-0.5], "old_log_prob": [-9.0], "rollout_log_prob": [-0.6], '
         '"response_mask": [1]}', "old_log_prob"),
        ("run.jsonl", _record()[:-1] + ', "meta": {"a": 1, "b": 2, "a": 3}}', "a"),
        ("train_data_step3.jsonl", '{"prev_logprobs": [-0.5], "generation_logprobs": [-0.6], "token_loss_mask": '
         '[1], "generation_logprobs": [-0.7]}', "generation_logprobs"),
    ],
    ids=["top-level", "nested", "nemo-rl"],
)  # fmt: skip
def test_jsonl_duplicate_keys_are_refused(tmp_path: Path, name: str, line: str, key: str) -> None:
    """json.loads keeps the last of two equal keys silently; a Parquet file's duplicate columns are refused."""
    path = _jsonl(tmp_path / name, _jsonl_good_for(name), line)
    assert one_line(run_capped("analyze", path)) == (
        f"rcdiag: error: {path}, row 1, column '{key}': appears twice in one object of this record; rcdiag cannot "
        "tell which value to read: keep one\n"
    )


def _jsonl_good_for(name: str) -> str:
    if name.startswith("train_data_step"):
        return json.dumps({"prev_logprobs": [-0.5], "generation_logprobs": [-0.6], "token_loss_mask": [1]})
    return _record()


# -- 3. .pt tensors whose shape declares more than their storage ----------------------------------------------------


def _expanded_pt(path: Path, rows: int, dtype: str = "float32") -> Path:
    torch = pytest.importorskip("torch")
    kind = getattr(torch, dtype)
    values = torch.zeros(1, dtype=kind).expand(rows, 8)
    torch.save({"old_log_probs": values, "rollout_log_probs": values, "response_mask": values}, path)
    return path


@pytest.mark.parametrize(
    ("rows", "dtype", "declared"), [(10**12, "float32", 96 * 10**12), (10**9, "bfloat16", 96 * 10**9)]
)
def test_pt_expanded_tensors_are_held_to_the_limit_by_their_shape(
    tmp_path: Path, rows: int, dtype: str, declared: int
) -> None:
    """A 2 KB file of stride-0 tensors declaring 10^12 x 8 values passed the size check (made on its storage) and
    failed allocating 29 TiB: MemoryError, exit 3. bfloat16 is read as float32: 4 bytes a value."""
    path = _expanded_pt(tmp_path / "expanded.pt", rows, dtype)
    assert path.stat().st_size < 4096
    assert one_line(run_capped("analyze", path)) == (
        f"rcdiag: error: {path}: the decoded size of its tensors (their shapes' sizes) is {declared:,} bytes, beyond "
        f"rcdiag's limit of {TENSOR_BYTES.default:,} bytes; if the file is genuine and memory allows, raise it: "
        f"{TENSOR_BYTES.variable}={declared}\n"
    )


def test_memory_a_reader_cannot_have_is_exit_2_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the limit turned off the same file needs 29 TiB: a MemoryError in a reader names the file."""
    path = _expanded_pt(tmp_path / "expanded.pt", 10**12)
    monkeypatch.setenv(TENSOR_BYTES.variable, "0")
    assert one_line(run_capped("analyze", path)) == (
        f"rcdiag: error: {path}: needs more memory than this process could allocate to be read (Unable to allocate "
        "29.1 TiB for an array with shape (1000000000000, 8) and data type float32); is the file corrupt, or does it "
        "need a machine with more memory?\n"
    )


# -- 4. RCDIAG_* environment variables ------------------------------------------------------------------------------

FORMS = {
    "RCDIAG_MAX_TENSOR_BYTES": "a whole number of bytes",
    "RCDIAG_MAX_COMPRESSION_RATIO": "a whole number of times",
    "RCDIAG_MAX_JSON_LINE_CHARS": "a whole number of characters",
    "RCDIAG_MAX_ROW_TOKENS": "a whole number of tokens",
    "RCDIAG_STORAGE_CONNECT_TIMEOUT": "a positive number of seconds",
    "RCDIAG_STORAGE_REQUEST_TIMEOUT": "a positive number of seconds",
    "RCDIAG_STORAGE_RETRY_LIMIT": "a positive number of seconds",
    "RCDIAG_SMALL_DUMP_BYTES": "a whole number of bytes",
    "RCDIAG_COMPILE_NOTICE": "0 (leave the notice out) or 1",
}
NOT_SETTINGS = {"RCDIAG_VERL_DUMP_DIR": "a directory rcdiag's verl launcher sets for the trainer's process"}
WHEN_USED = {
    "RCDIAG_MLFLOW_REQUEST_TIMEOUT": "read through the same parser when --mlflow opens its client",
    "RCDIAG_MLFLOW_RETRY_LIMIT": "likewise (tests/watch/test_watch_dashboards_bounds.py)",
}
"""Settings of an export, not of reading: checked (one line, the same form) when the export starts."""


def test_every_rcdiag_variable_is_read_through_the_one_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``RCDIAG_*`` name in the package's source is checked when a dump is opened, in one message form."""
    names = set()
    for source in (ROOT / "rcdiag").rglob("*.py"):
        names.update(re.findall(r"[\"'](RCDIAG_[A-Z0-9_]+)[\"']", source.read_text()))
    assert names == set(FORMS) | set(NOT_SETTINGS) | set(WHEN_USED)
    for name, form in FORMS.items():
        monkeypatch.setenv(name, "zz")
        with pytest.raises(SettingError) as info:
            check_environment()
        assert str(info.value) == f"the environment variable {name} must be {form}, got 'zz'"
        monkeypatch.delenv(name)
    check_environment()


def _inputs(tmp_path: Path) -> dict[str, Path]:
    npz = tmp_path / "dump.npz"
    np.savez(npz, old_log_probs=np.full((2, 3), -1.0), rollout_log_probs=np.full((2, 3), -1.1))
    parquet = tmp_path / "dump.parquet"
    pq.write_table(pa.table({k: [v] for k, v in GOOD.items()}), parquet)
    return {"npz": npz, "parquet": parquet, "jsonl": _jsonl(tmp_path / "dump.jsonl", _record())}


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("RCDIAG_MAX_COMPRESSION_RATIO", "zz", "npz"),
        ("RCDIAG_MAX_COMPRESSION_RATIO", "-1", "parquet"),
        ("RCDIAG_MAX_TENSOR_BYTES", "zz", "npz"),
        ("RCDIAG_MAX_TENSOR_BYTES", "-1", "jsonl"),
        ("RCDIAG_MAX_JSON_LINE_CHARS", "1e9", "jsonl"),
        ("RCDIAG_MAX_ROW_TOKENS", "-1", "npz"),
        ("RCDIAG_STORAGE_RETRY_LIMIT", "zz", "parquet"),
        ("RCDIAG_STORAGE_CONNECT_TIMEOUT", "-1", "npz"),
        ("RCDIAG_STORAGE_REQUEST_TIMEOUT", "inf", "jsonl"),
        ("RCDIAG_SMALL_DUMP_BYTES", "zz", "npz"),
        ("RCDIAG_COMPILE_NOTICE", "yes", "parquet"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_whatever_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, kind: str
) -> None:
    """``RCDIAG_MAX_*=zz`` was blamed on the .npz ("holds object arrays"); ``RCDIAG_STORAGE_RETRY_LIMIT=zz`` was
    ignored for a local file."""
    monkeypatch.setenv(name, value)
    path = _inputs(tmp_path)[kind]
    said = f"rcdiag: error: the environment variable {name} must be {FORMS[name]}, got {value!r}\n"
    assert one_line(run_capped("analyze", path)) == said
