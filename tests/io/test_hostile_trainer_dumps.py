"""Hostile and damaged trainer dumps (issue 37 item 2), in the style of tests/io/test_hostile_files.py: each is read by
the real CLI in a subprocess under an address-space cap (``hostile.run_capped``) and ends in exit 2 with one line
naming the file (and what is wrong) — never a traceback, a crash, code run from the file, or a slice of a response
read as the whole of it. Files are built in tmp_path by tests/trainer_dumps.py, then damaged here."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trainer_dumps as td
from conftest import random_batch, require
from hostile import run_capped

SAMPLES = 6


@pytest.fixture(autouse=True)
def _needs_torch() -> None:
    require("torch", "gpu")


def _zeros(n: int) -> Any:
    import torch

    return torch.zeros(n)


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rcdiag: error: "), stderr
    return lines[0]


def _refused(path: Path, *flags: str) -> str:
    done = run_capped("analyze", path, *flags)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stdout == ""
    return _one_error_line(done.stderr)


def _samples() -> list[td.Sample]:
    old, rollout, mask = random_batch(np.random.default_rng(3), rows=SAMPLES, width=12, empty_rows=0)
    return td.samples(old, rollout, mask, range(SAMPLES))


# ------------------------------------------------------------------------------------------------ SkyRL


class _Runs:
    """A pickled object whose unpickling runs ``function(*args)``."""

    def __init__(self, function: Callable, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple:
        return (self.function, self.args)


def _malicious(mark: Path) -> dict[str, tuple[Any, str]]:
    """Pickled payloads that would create ``mark``, with the global each names."""
    return {
        "os.system": (_Runs(os.system, f"touch {mark}"), f"{os.system.__module__}.system"),
        "builtins.eval": (_Runs(eval, f"__import__('pathlib').Path({str(mark)!r}).touch()"), "builtins.eval"),
        "subprocess.Popen": (_Runs(subprocess.Popen, ["touch", str(mark)]), "subprocess.Popen"),
    }


@pytest.mark.parametrize("payload", ["os.system", "builtins.eval", "subprocess.Popen"])
@pytest.mark.parametrize("where", ["whole file", "inside a real batch"])
def test_a_pickle_naming_any_other_global_is_refused_and_runs_nothing(tmp_path: Path, payload: str, where: str) -> None:
    """The payload alone, and hidden in the metadata of a batch SkyRL's writer wrote (where it would run while the
    batch is rebuilt): refused naming the global, and the file it would create never exists."""
    mark = tmp_path / "pwned"
    obj, name = _malicious(mark)[payload]
    path = tmp_path / "global_step_1_training_input.pkl"
    if where == "whole file":
        path.write_bytes(pickle.dumps(obj))
    else:
        ss = _samples()
        td.skyrl_pickle(path, td.skyrl_arrays(ss), {**td.skyrl_metadata(ss, 0), "uids": obj})
    line = _refused(path)
    assert line == (
        f"rcdiag: error: {path}: is a pickle naming the global '{name}', which a SkyRL training batch never holds; "
        "refused before anything it names was imported or run (a pickle is code: docs/threat-model.md)"
    )
    assert not mark.exists()


def _skyrl(tmp_path: Path, change: Callable[[dict], None] | None = None, pad: int = 0) -> Path:
    """A SkyRL batch whose state ``change`` edits before it is pickled."""
    ss = _samples()
    state = td.skyrl_state(td.skyrl_arrays(ss), td.skyrl_metadata(ss, pad))
    if change is not None:
        change(state)
    return td.pickle_state(tmp_path / "global_step_1_training_input.pkl", state)


def _entry(state: dict, key: str) -> dict:
    return state["batch_dict"][key]


SKYRL_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "object dtype": (lambda s: _entry(s, "action_log_probs").update(dtype="object"),
                     "holds 'action_log_probs' without numpy bytes, a known dtype and a shape (dtype 'object'"),
    "shape beyond its bytes": (lambda s: _entry(s, "loss_mask").update(shape=(10**6, 10**6)),
                               "holds 'loss_mask' of shape (1000000, 1000000) float32 (4,000,000,000,000 bytes) in "),
    "negative shape": (lambda s: _entry(s, "loss_mask").update(shape=(-6, -12)),
                       "holds 'loss_mask' of shape (-6, -12), expected whole numbers"),
    "pad_size a string": (lambda s: s["metadata"].update(pad_size="2"),
                          "holds metadata pad_size '2', expected a whole number of rows in the batch"),
    "pad_size beyond the rows": (lambda s: s["metadata"].update(pad_size=7),
                                 "holds metadata pad_size 7, expected a whole number of rows in the batch"),
    "unknown entry format": (lambda s: _entry(s, "loss_mask").update(format="arrow"),
                             "holds 'loss_mask' as 'arrow', which SkyRL's TensorBatch never writes"),
    "no batch_dict": (lambda s: s.pop("batch_dict"), "holds a StandIn without a batch state"),
    "torch bytes that are a pickle": (lambda s: _entry(s, "loss_mask").update(format="torch", data=pickle.dumps(_Runs(eval, "1"))),
                                      "holds objects other than tensors, lists, dicts and numbers"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SKYRL_CASES))
def test_a_damaged_skyrl_batch_is_one_line(tmp_path: Path, case: str) -> None:
    change, expected = SKYRL_CASES[case]
    path = _skyrl(tmp_path, change)
    assert _refused(path).startswith(f"rcdiag: error: {path}: {expected}")


def test_a_truncated_skyrl_pickle_is_one_line(tmp_path: Path) -> None:
    path = _skyrl(tmp_path)
    path.write_bytes(path.read_bytes()[:-300])
    assert _refused(path).startswith(f"rcdiag: error: {path}: cannot be read as a pickle (")


def test_an_oversized_skyrl_pickle_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _skyrl(tmp_path)
    size = path.stat().st_size
    monkeypatch.setenv("RCDIAG_MAX_TENSOR_BYTES", "1000")  # the capped run inherits it
    line = _refused(path)
    assert line == (
        f"rcdiag: error: {path}: the file (read whole: a pickle holds its tensors' bytes) is {size:,} bytes, beyond "
        f"rcdiag's limit of 1,000 bytes; if the file is genuine and memory allows, raise it: RCDIAG_MAX_TENSOR_BYTES={size}"
    )


# ------------------------------------------------------------------------------------------- Miles ranks


def _miles(tmp_path: Path, **kw: Any) -> list[Path]:
    ss = _samples()
    return td.miles_ranks(tmp_path, 4, [ss[0::2], ss[1::2]], cp_size=2, tp_size=2, **kw)


def _edit(path: Path, change: Callable[[dict], None]) -> None:
    import torch

    obj = torch.load(path, weights_only=True)
    change(obj)
    torch.save(obj, path)


def test_a_missing_context_parallel_rank_is_one_line_naming_file_and_rank(tmp_path: Path) -> None:
    """Ranks 2 and 3 (data-parallel shard 0, context-parallel rank 1, both tensor-parallel copies) were not copied:
    shard 0's samples have no second half."""
    files = _miles(tmp_path, skip_ranks=(2, 3))
    line = _refused(files[0])
    assert line.startswith(f"rcdiag: error: {files[0]}: holds context-parallel rank 0 of 2 of sample 0's ")
    assert line.endswith(
        "but no rank file of its rollout holds cp_rank 1; a rank file is missing: copy every "
        "train_data/{rollout_id}_{rank}.pt of the rollout"
    )


def test_a_truncated_rank_file_names_itself(tmp_path: Path) -> None:
    files = _miles(tmp_path)
    files[5].write_bytes(files[5].read_bytes()[:200])
    line = _refused(tmp_path)
    assert line.startswith(f"rcdiag: error: {files[5]}: cannot be read as a PyTorch file (")


MILES_CASES: dict[str, tuple[int, Callable[[dict], None], str]] = {
    "cp_rank a string": (3, lambda o: o.update(cp_rank="1"), "holds cp_rank '1', expected a whole number"),
    "cp_rank beyond cp_size": (3, lambda o: o.update(cp_rank=2), "holds cp_rank 2 of cp_size 2"),
    "qkv_format unknown": (1, lambda o: o.update(qkv_format="sbhd"), "holds qkv_format 'sbhd'; Miles writes 'thd' or 'bshd'"),
    "ranks disagree on a length": (4, lambda o: o["rollout_data"]["total_lengths"].__setitem__(0, 99),
                                   "says sample 1 has "),
    "a slice of the wrong length": (2, lambda o: o["rollout_data"]["log_probs"].__setitem__(0, _zeros(1)),
                                    "4_2.pt: holds 1 values of sample 0's 'log_probs' at cp_rank 1 of 2, where Miles' zigzag split of "),
    "sample_indices twice": (0, lambda o: o["rollout_data"]["sample_indices"].__setitem__(1, 0),
                             "holds sample_indices 0 twice; each sample is one row of a rank file"),
    "a response beyond the row limit": (0, lambda o: o["rollout_data"]["response_lengths"].__setitem__(0, 10**9),
                                        "holds sample 0 of 1000000000 response tokens in "),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MILES_CASES))
def test_a_damaged_rank_file_is_one_line(tmp_path: Path, case: str) -> None:
    rank, change, expected = MILES_CASES[case]
    files = _miles(tmp_path)
    _edit(files[rank], change)
    line = _refused(tmp_path)
    assert line.startswith("rcdiag: error: ") and expected in line, line
    assert str(tmp_path) in line


def test_an_oversized_response_is_refused_by_the_row_limit(tmp_path: Path) -> None:
    """A response of 10^9 tokens in a total of 2 x 10^9: refused by ``RCDIAG_MAX_ROW_TOKENS`` before anything the
    size declares is allocated."""
    files = _miles(tmp_path)
    for path in files:
        _edit(path, lambda o: o["rollout_data"]["response_lengths"].__setitem__(0, 10**9))
        _edit(path, lambda o: o["rollout_data"]["total_lengths"].__setitem__(0, 2 * 10**9))
    line = _refused(tmp_path)
    assert line == (
        f"rcdiag: error: {files[0]}: sample 0's response is 1,000,000,000 tokens, beyond rcdiag's limit of 16,777,216 "
        "tokens; if the file is genuine and memory allows, raise it: RCDIAG_MAX_ROW_TOKENS=1000000000"
    )


# ------------------------------------------------------------------------------------------ slime format 2


def _slime(tmp_path: Path, change: Callable[[dict], None] | None = None) -> Path:
    ss = _samples()
    path = td.slime_v2(tmp_path / "4.pt", 4, [ss[0::2], ss[1::2]], raw_reward=[1.0] * SAMPLES)
    if change is not None:
        _edit(path, change)
    return path


SLIME_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "format_version 3": (lambda o: o.update(format_version=3),
                         "holds format_version 3 of slime's debug train data; rcdiag reads format 1 ('rollout_data') and format 2 ('samples')"),
    "samples a dict": (lambda o: o.update(samples={"0": 1}),
                       "is slime's format_version 2 but its 'samples' is dict, expected a list of dicts (one per sample)"),
    "a sample without log_probs": (lambda o: o["samples"][3].pop("log_probs"),
                                   "holds no 'log_probs' in sample 3, which other samples hold; every sample needs it"),
    "a context-parallel slice": (lambda o: o["samples"][2].update(log_probs=o["samples"][2]["log_probs"][:2]),
                                 "holds 'log_probs' of 2 values for sample 2, whose response has "),
    "no samples": (lambda o: o.update(samples=[]), "has no samples: there is nothing to analyze"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SLIME_CASES))
def test_a_damaged_slime_format_2_file_is_one_line(tmp_path: Path, case: str) -> None:
    change, expected = SLIME_CASES[case]
    path = _slime(tmp_path, change)
    assert _refused(path).startswith(f"rcdiag: error: {path}: {expected}")


def test_a_truncated_slime_file_is_one_line(tmp_path: Path) -> None:
    path = _slime(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert _refused(path).startswith(f"rcdiag: error: {path}: cannot be read as a PyTorch file (")


# ------------------------------------------------------------------------------------------------ prime-rl


def _prime(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "token_exports" / "step_1" / "rank_0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(td.prime_rl_line(r) for r in records))
    return path


def test_prime_rl_all_null_rows_leave_nothing_and_say_so(tmp_path: Path) -> None:
    record = {
        "step": 1,
        "loss_mask": [True, True],
        "trainer_logprobs": [None, None],
        "inference_logprobs": [-1.0, -1.0],
    }
    path = _prime(tmp_path, [record, record])
    assert _refused(tmp_path, "--on-bad-row", "skip") == (
        "rcdiag: error: every row was skipped (2 rows: nan 2); there is nothing to analyze"
    )
    assert path.exists()


def test_prime_rl_null_in_the_mask_is_not_a_log_prob(tmp_path: Path) -> None:
    """Only log-probs may be null (the exporter's floats): a null loss mask is a damaged file."""
    record = {
        "step": 1,
        "loss_mask": [True, None],
        "trainer_logprobs": [-1.0, -1.0],
        "inference_logprobs": [-1.0, -1.0],
    }
    path = _prime(tmp_path, [record])
    line = _refused(tmp_path)
    assert line.startswith(f"rcdiag: error: {path}, row 0, column 'loss_mask': ")


def test_a_torch_storage_in_a_skyrl_pickle_is_read_only_through_weights_only(tmp_path: Path) -> None:
    """Before 2026-03 the batch's items were torch tensors whose storages unpickle from ``torch.save`` bytes
    (``torch.storage._load_from_bytes``, admitted): bytes that are a pickle naming ``os.system`` are refused by
    torch's weights-only reader, and nothing runs."""
    mark = tmp_path / "pwned"
    evil = pickle.dumps(_Runs(os.system, f"touch {mark}"))
    # GLOBAL torch.storage _load_from_bytes; BINBYTES evil; TUPLE1; REDUCE; STOP
    data = b"\x80\x04ctorch.storage\n_load_from_bytes\nB" + struct.pack("<I", len(evil)) + evil + b"\x85R."
    path = tmp_path / "global_step_1_training_input.pkl"
    path.write_bytes(data)
    line = _refused(path)
    assert line.startswith(f"rcdiag: error: {path}: holds objects other than tensors, lists, dicts and numbers (")
    assert not mark.exists()
