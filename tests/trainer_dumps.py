"""Builders of today's trainer dumps, written as each trainer's own writer writes them (none of these trainers has a
release on the package index, and their writers need a GPU cluster): each builder follows its writer's source line
by line, cited with file, lines and commit, and writes the same objects with the same call (``torch.save``,
``pickle.dump``, ``json.dumps``). No trainer code is copied or imported.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

SLIME = "THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515"
MILES = "radixark/miles 31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
SKYRL = "NovaSky-AI/SkyRL a9564572eb8e91076be43c1bd5e4615e3de17265"
PRIME_RL = "PrimeIntellect-ai/prime-rl 559b44772e471d1538537b8805cc77f3824a5e64"


class Sample:
    """One response of a batch: its prompt length, trimmed response arrays and index in the rollout."""

    def __init__(self, index: int, prompt: int, old: np.ndarray, rollout: np.ndarray, mask: np.ndarray) -> None:
        self.index, self.prompt = index, prompt
        self.old, self.rollout, self.mask = old.astype(np.float32), rollout.astype(np.float32), mask.astype(np.int32)

    @property
    def response(self) -> int:
        return len(self.old)

    @property
    def total(self) -> int:
        return self.prompt + self.response


def samples(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, rows: Sequence[int], seed: int = 0) -> list[Sample]:
    """The ``rows`` of a padded batch as samples (trimmed after the last valid token, as the canonical dump is),
    indexed by row, each with a prompt of 3 to 8 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for row in rows:
        valid = np.flatnonzero(mask[row])
        end = int(valid[-1]) + 1 if valid.size else 0
        out.append(Sample(int(row), int(rng.integers(3, 9)), old[row, :end], rollout[row, :end], mask[row, :end]))
    return out


# ------------------------------------------------------------------------------------------- slime format 2


def slime_v2(path: Path, rollout_id: int, shards: Sequence[Sequence[Sample]], raw_reward: list[float]) -> Path:
    """slime's ``--save-debug-train-data`` file: ``_build_dump_payload`` (``slime/observability/
    train_data_utils.py:112-188``) over one ``local_shard`` per data-parallel rank as ``save_debug_train_data``
    gathers them (:217-234), saved with ``torch.save`` (:242), at slime 624b824a. Each shard's ``rollout_data`` holds
    what the actor holds when it saves (``backends/megatron_utils/actor.py:245-298`` tensorizes ``tokens`` as long,
    ``loss_masks`` as int, ``rollout_log_probs`` as float32; ``utils/data.py:304-325`` keeps ``partition`` and
    ``raw_reward`` whole), its context-parallel fields already restored to full length (:37-94)."""
    import torch

    offset = 0
    dp_shards = []
    for dp_rank, shard in enumerate(shards):
        rollout_data = {
            "tokens": [torch.arange(s.total, dtype=torch.long) for s in shard],
            "total_lengths": [s.total for s in shard],
            "response_lengths": [s.response for s in shard],
            "loss_masks": [torch.from_numpy(s.mask.copy()) for s in shard],
            "rollout_log_probs": [torch.from_numpy(s.rollout.copy()) for s in shard],
            "rewards": [0.5 for _ in shard],
            "raw_reward": raw_reward,
            "sample_indices": [s.index for s in shard],
            "partition": [s.index for s in shard],
            "micro_batch_indices": [[list(range(len(shard)))]],
            "log_probs": [torch.from_numpy(s.old.copy()) for s in shard],
        }
        offset += len(shard)
        dp_shards.append({"rank": dp_rank * 2, "data_parallel_rank": dp_rank, "rollout_data": rollout_data})
    torch.save(_build_dump_payload(dp_shards, rollout_id=rollout_id, writer_rank=0), path)
    return path


def _build_dump_payload(dp_shards: list[dict], *, rollout_id: int, writer_rank: int) -> dict:
    """The payload of ``train_data_utils.py:112-188`` (slime 624b824a), step by step."""
    import torch

    layout_fields = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")  # :99
    whole_batch_fields = ("raw_reward",)  # :101

    def per_sample(value: Any, n: int) -> bool:  # :104-109
        if torch.is_tensor(value):
            return value.dim() >= 1 and value.size(0) == n
        return isinstance(value, (list, tuple)) and len(value) == n

    samples_out, layout, whole_batch = [], [], {}
    id_columns = {"sample_indices": "sample_index", "partition": "rollout_position"}
    for shard in dp_shards:
        rollout_data, dp_rank = shard["rollout_data"], shard["data_parallel_rank"]
        n = len(rollout_data["response_lengths"])
        shard_layout = {"rank": shard["rank"], "data_parallel_rank": dp_rank}
        for column in id_columns:
            value = rollout_data.get(column)
            shard_layout[column] = list(value) if value is not None else None
        columns = {}
        for key, value in rollout_data.items():
            if key in id_columns:
                continue
            if key in whole_batch_fields:
                whole_batch.setdefault(key, value)
            elif key in layout_fields or not per_sample(value, n):
                shard_layout[key] = value
            else:
                columns[key] = value
        for i in range(n):
            sample = {"data_parallel_rank": dp_rank}
            for column, scalar_key in id_columns.items():
                values = rollout_data.get(column)
                if values is not None:
                    sample[scalar_key] = values[i]
            for key, column in columns.items():
                sample[key] = column[i]
            samples_out.append(sample)
        layout.append(shard_layout)
    order = next(
        (
            k
            for k in ("rollout_position", "sample_index")
            if samples_out and all(s.get(k) is not None for s in samples_out)
        ),
        None,
    )
    if order is not None:
        samples_out.sort(key=lambda sample: sample[order])
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": writer_rank,
        "samples": samples_out,
        "dp_shards": layout,
        **whole_batch,
    }


# ------------------------------------------------------------------------------------ Miles --dump-details


def cp_logit_ranges(
    total: int, response: int, cp_rank: int, cp_size: int, qkv_format: str, max_seq_len: int | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``get_logits_and_tokens_offset_with_cp``'s logit offsets (``miles/backends/training_utils/cp_utils.py:19-67``
    at Miles 31f1ca96), written out here as the test's own oracle of the split."""
    prompt_length = total - response
    if qkv_format == "thd":
        chunk_size = (total + 2 * cp_size - 1) // (2 * cp_size)
    else:
        assert max_seq_len is not None
        chunk_size = (max_seq_len + 2 * cp_size - 1) // (2 * cp_size)
    chunk_0 = (cp_rank * chunk_size, (cp_rank + 1) * chunk_size)
    chunk_1 = ((2 * cp_size - cp_rank - 1) * chunk_size, (2 * cp_size - cp_rank) * chunk_size)
    logits_0 = (max(chunk_0[0], prompt_length - 1), min(chunk_0[1], total - 1))
    logits_1 = (max(chunk_1[0], prompt_length - 1), min(chunk_1[1], total - 1))
    if not logits_0[0] < logits_0[1]:
        logits_0 = (0, 0)
    if not logits_1[0] < logits_1[1]:
        logits_1 = (0, 0)
    return logits_0, logits_1


def cp_slice(values: Any, total: int, response: int, cp_rank: int, cp_size: int, fmt: str, max_len: int | None) -> Any:
    """``slice_log_prob_with_cp`` (``cp_utils.py:411-437``): rank ``cp_rank``'s two zigzag pieces, concatenated."""
    import torch

    if cp_size == 1:
        return values
    prompt_length = total - response
    (a0, b0), (a1, b1) = cp_logit_ranges(total, response, cp_rank, cp_size, fmt, max_len)
    first = values[a0 - (prompt_length - 1) : b0 - (prompt_length - 1)]
    second = values[a1 - (prompt_length - 1) : b1 - (prompt_length - 1)]
    return torch.cat([first, second], dim=0)


def miles_ranks(
    directory: Path,
    rollout_id: int,
    shards: Sequence[Sequence[Sample]],
    *,
    cp_size: int,
    tp_size: int = 1,
    qkv_format: str = "thd",
    skip_ranks: Sequence[int] = (),
) -> list[Path]:
    """Every rank's ``train_data/{rollout_id}_{rank}.pt`` as Miles' ``save_debug_train_data_for_rank``
    (``miles/utils/train_dump_utils.py:24-44``, Miles 31f1ca96) writes it: ``torch.save(dict(rollout_id, rank,
    rollout_data, cp_rank, cp_size, qkv_format))``. Ranks in Megatron's order (tensor parallel fastest, then context
    parallel, then data parallel); ``rollout_data`` as ``backends/training_utils/data.py:34-117`` leaves it (tokens
    long, loss masks int and full-length, ``rollout_log_probs`` sliced for the rank and float32, ``max_seq_lens``
    under bshd) with the forward pass's ``log_probs`` sliced alike."""
    import torch

    written = []
    everyone = [s for shard in shards for s in shard]
    for dp_rank, shard in enumerate(shards):
        max_len = None
        if qkv_format == "bshd":  # data.py:78-90: the longest total, padded up to a multiple
            max_len = (max(s.total for s in shard) + 7) // 8 * 8
        for cp_rank in range(cp_size):
            for tp_rank in range(tp_size):
                rank = (dp_rank * cp_size + cp_rank) * tp_size + tp_rank
                if rank in skip_ranks:
                    continue

                def sliced(values: np.ndarray, s: Sample, cp_rank: int = cp_rank, max_len: int | None = max_len) -> Any:
                    return cp_slice(
                        torch.from_numpy(values.copy()), s.total, s.response, cp_rank, cp_size, qkv_format, max_len
                    )

                rollout_data: dict[str, Any] = {
                    "tokens": [torch.arange(s.total, dtype=torch.long) for s in shard],
                    "response_lengths": [s.response for s in shard],
                    "total_lengths": [s.total for s in shard],
                    "loss_masks": [torch.tensor(s.mask.tolist(), dtype=torch.int) for s in shard],
                    "rewards": [0.25 for _ in shard],
                    "raw_reward": [1.0 for _ in everyone],
                    "sample_indices": [s.index for s in shard],
                    "rollout_log_probs": [sliced(s.rollout, s) for s in shard],
                }
                if max_len is not None:
                    rollout_data["max_seq_lens"] = [max_len] * len(shard)
                rollout_data["log_probs"] = [sliced(s.old, s) for s in shard]
                path = directory / f"{rollout_id}_{rank}.pt"
                torch.save(
                    dict(  # noqa: C408 - the writer's own call
                        rollout_id=rollout_id,
                        rank=rank,
                        rollout_data=rollout_data,
                        cp_rank=cp_rank,
                        cp_size=cp_size,
                        qkv_format=qkv_format,
                    ),
                    path,
                )
                written.append(path)
    return written


# ----------------------------------------------------------------------------------- SkyRL dump_data_batch

SKYRL_MODULE = "skyrl.backends.skyrl_train.training_batch"
SKYRL_OLD_MODULE = "skyrl_train.training_batch"


def skyrl_arrays(batch: Sequence[Sample], prompt_seed: int = 0) -> dict[str, np.ndarray]:
    """A batch in SkyRL's right-aligned layout (``convert_prompts_responses_to_batch_tensors``,
    ``skyrl/train/dataset/preprocess.py:90-240`` at SkyRL a9564572): response-level tensors ``batch x max
    response``, each response in its last positions; ``loss_mask`` and ``rollout_logprobs`` float32 zeros left of
    it; ``action_log_probs`` from the forward pass's ``log_probs[:, -num_actions-1:-1]``, so left of a shorter
    response it holds the log-probs of the prompt's last tokens (random here)."""
    rng = np.random.default_rng(prompt_seed)
    width = max(s.response for s in batch)
    total = max(s.total for s in batch)
    rows = len(batch)
    out = {
        "sequences": np.zeros((rows, total), dtype=np.int64),
        "attention_mask": np.zeros((rows, total), dtype=np.int64),
        "response_mask": np.zeros((rows, width), dtype=np.int64),
        "loss_mask": np.zeros((rows, width), dtype=np.float32),
        "rollout_logprobs": np.zeros((rows, width), dtype=np.float32),
        "base_action_log_probs": None,
        "action_log_probs": -np.abs(rng.normal(0, 2, (rows, width))).astype(np.float32),
        "values": None,
        "advantages": np.zeros((rows, width), dtype=np.float32),
        "returns": np.zeros((rows, width), dtype=np.float32),
    }
    for i, s in enumerate(batch):
        start = width - s.response
        out["sequences"][i, total - s.total :] = np.arange(s.total) + 1
        out["attention_mask"][i, total - s.total :] = 1
        out["response_mask"][i, start:] = 1
        out["loss_mask"][i, start:] = s.mask
        out["rollout_logprobs"][i, start:] = s.rollout
        out["action_log_probs"][i, start:] = s.old
    return out  # type: ignore[return-value]


def pad_rows(arrays: dict[str, Any], pad: int) -> dict[str, Any]:
    """``pad_training_input_batch`` (``training_batch.py:504-570``): ``pad`` copies of row 0, ``loss_mask`` zeros."""
    out = {}
    for key, value in arrays.items():
        if value is None:
            out[key] = None
        elif key == "loss_mask":
            out[key] = np.concatenate([value, np.zeros((pad, *value.shape[1:]), dtype=value.dtype)])
        else:
            out[key] = np.concatenate([value, value[[0] * pad]])
    return out


def _serialize_tensor(value: Any) -> dict:
    """``_serialize_tensor`` (``training_batch.py:17-35``): numpy bytes, or ``torch.save`` bytes for bfloat16."""
    import torch

    try:
        arr = value.numpy()
        return {"format": "numpy", "data": arr.tobytes(), "shape": arr.shape, "dtype": str(arr.dtype)}
    except TypeError:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return {"format": "torch", "data": buffer.getvalue()}


def skyrl_state(arrays: dict[str, Any], metadata: dict, bfloat16: Sequence[str] = ()) -> dict:
    """``TensorBatch.__getstate__`` (``training_batch.py:255-281``) of a CPU batch."""
    import torch

    batch_dict: dict[str, Any] = {}
    size = None
    for key, value in arrays.items():
        if value is None:
            batch_dict[key] = None
            continue
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if key in bfloat16:
            tensor = tensor.to(torch.bfloat16)
        size = len(tensor)
        batch_dict[key] = _serialize_tensor(tensor)
    return {"batch_dict": batch_dict, "batch_size": size, "device": torch.device("cpu"), "metadata": metadata}


@contextmanager
def _module(name: str, **members: Any) -> Iterator[types.ModuleType]:
    """A module importable as ``name`` (its parents too) while pickling, holding ``members`` under their names."""
    parts = name.split(".")
    added = []
    for i in range(1, len(parts) + 1):
        dotted = ".".join(parts[:i])
        if dotted not in sys.modules:
            sys.modules[dotted] = types.ModuleType(dotted)
            added.append(dotted)
    module = sys.modules[name]
    for key, value in members.items():
        value.__module__ = name
        value.__qualname__ = key
        setattr(module, key, value)
    try:
        yield module
    finally:
        for dotted in added:
            del sys.modules[dotted]


def skyrl_pickle(path: Path, arrays: dict[str, Any], metadata: dict, *, bfloat16: Sequence[str] = ()) -> Path:
    """``TensorBatch.save`` (``training_batch.py:395-398``) of a batch of ``arrays``: ``pickle_state``."""
    return pickle_state(path, skyrl_state(arrays, metadata, bfloat16))


def pickle_state(path: Path, state: dict) -> Path:
    """``pickle.dump`` of a ``TrainingInputBatch`` whose ``__reduce__`` (``training_batch.py:244-253``) is
    ``(_rebuild_tensor_batch, (type(self), self.__getstate__()))`` for ``state``; the class and the function are
    pickled by reference, under SkyRL's module and names."""

    def _rebuild_tensor_batch(cls: Any, state: Any) -> Any:  # pragma: no cover - never called: only named
        raise AssertionError

    class TrainingInputBatch(dict):
        def __reduce__(self) -> Any:
            return (_rebuild_tensor_batch, (type(self), state))

    members = {"_rebuild_tensor_batch": _rebuild_tensor_batch, "TrainingInputBatch": TrainingInputBatch}
    with _module(SKYRL_MODULE, **members), open(path, "wb") as handle:
        pickle.dump(TrainingInputBatch(), handle)
    return path


def skyrl_pickle_before_2026_03(
    path: Path, arrays: dict[str, Any], metadata: dict, *, torch_bytes: bool = False
) -> Path:
    """The batch as SkyRL pickled it before c7348d07 (2026-03-24; ``skyrl-train``'s ``skyrl_train.training_batch``
    until the 2026-03 package move): a plain ``dict`` subclass with ``__getstate__``, so ``pickle.dump`` writes
    the class, its items as torch tensors (``torch._utils._rebuild_tensor_v2`` over ``torch.storage.
    _load_from_bytes`` storages) and then the state (``training_batch.py:137-174`` at c7348d07^; with
    ``torch_bytes``, the state of 2025, ``:135-151`` at 81f2973f: each value ``torch.save`` bytes)."""
    import torch

    state = skyrl_state(arrays, metadata)
    if torch_bytes:
        for key, value in arrays.items():
            buffer = io.BytesIO()
            torch.save(None if value is None else torch.from_numpy(np.ascontiguousarray(value)), buffer)
            state["batch_dict"][key] = buffer.getvalue()
    items = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items() if v is not None}

    class TrainingInputBatch(dict):
        def __getstate__(self) -> Any:
            return state

    with _module(SKYRL_OLD_MODULE, TrainingInputBatch=TrainingInputBatch), open(path, "wb") as handle:
        pickle.dump(TrainingInputBatch(items), handle)
    return path


def skyrl_metadata(batch: Sequence[Sample], pad: int) -> dict:
    """The metadata a dumped batch keeps (``trainer.py:940-975``, ``:1197-1226``; ``uids`` and ``is_last_step``
    popped before the dump, :436-439)."""
    n = len(batch)
    return {
        "policy_mini_batch_boundaries": [(0, n)],
        "policy_prompt_boundaries": [(i, i + 1) for i in range(n)],
        "response_length": max(s.response for s in batch),
        "avg_response_length": sum(s.response for s in batch) / n,
        "pad_size": pad,
        "metrics": {"avg_final_rewards": 0.5, "avg_response_length": 3.0},
    }


# --------------------------------------------------------------------------------------- prime-rl exports


def json_float(value: float) -> float | None:
    """``_json_float`` (``src/prime_rl/trainer/rl/token_export.py:247-253`` at prime-rl 559b4477)."""
    value = float(value)
    return value if math.isfinite(value) else None


def prime_rl_line(record: dict) -> str:
    """One export line as ``TokenExporter._write`` writes it (``token_export.py:102-112``)."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"


def prime_rl_exports(
    directory: Path,
    steps: np.ndarray,
    record: Callable[[int, int, int], dict],
    line: Callable[[dict], str] = prime_rl_line,
) -> Path:
    """``directory/token_exports/step_N/rank_R.jsonl`` (``token_export.py:87-100``) for a batch whose row ``i`` is
    at step ``steps[i]``: each step's rows split over two ranks, ``record(row, step, rank)`` one ``line`` each, and
    the step's ``STABLE`` marker (:81-85)."""
    exports = directory / "token_exports"
    for step in dict.fromkeys(steps.tolist()):
        (exports / f"step_{step}").mkdir(parents=True, exist_ok=True)
        for rank, part in enumerate(np.array_split(np.flatnonzero(steps == step), 2)):
            lines = [line(record(int(row), int(step), rank)) for row in part]
            (exports / f"step_{step}" / f"rank_{rank}.jsonl").write_text("".join(lines))
        (exports / f"step_{step}" / "STABLE").touch()
    return directory
