"""SkyRL's ``trainer.dump_data_batch`` files, ``dumped_data/global_step_{N}_training_input.pkl``: a pickle of its
``TrainingInputBatch``, read through a restricted unpickler (``rcdiag.io.safe_pickle``) and never with SkyRL.

``TensorBatch.save`` is ``pickle.dump(self, f)`` (``skyrl/backends/skyrl_train/training_batch.py:395-398`` at
NovaSky-AI/SkyRL a9564572); its ``__reduce__`` (:244-253) makes that ``_rebuild_tensor_batch(TrainingInputBatch,
state)`` with the ``__getstate__`` of :255-281: ``{"batch_dict": {key: {"format": "numpy", "data": bytes,
"shape": tuple, "dtype": str} | {"format": "torch", "data": torch.save bytes} | {"format": "tensor_list", ...} |
None}, "batch_size", "device": torch.device, "metadata": dict}``. Before SkyRL 2026-03-24 (c7348d07) the batch was
pickled as a dict subclass: its items as torch tensors (``torch._utils._rebuild_tensor_v2`` over
``torch.storage._load_from_bytes`` storages, ``collections.OrderedDict`` hooks) and then the same state; before
2025-08 a state value was ``torch.save`` bytes. Those globals, and the batch classes under both of SkyRL's module
paths, are the only ones admitted, each mapped to a stand-in here; nested ``torch.save`` bytes are read with
``weights_only=True``.

Every tensor is right-aligned (left-padded): response-level tensors are ``batch x max response length``, a
shorter response in its last positions; ``action_log_probs`` (the trainer's) holds the log-probs of the prompt's
last tokens left of the response (not padding: the forward pass covers them), ``rollout_logprobs`` zeros there,
and ``loss_mask`` (float32) 0 there, so ``loss_mask`` is the mask (as SkyRL's own
``rollout_train_logprobs_abs_diff`` reads it). Rows that ``pad_training_input_batch`` appended to fill the
data-parallel ranks (``metadata["pad_size"]``, copies of row 0 with ``loss_mask`` 0) are left out, as SkyRL leaves
them out of its metrics.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.io import safe_pickle
from rcdiag.io.base import ColumnMap
from rcdiag.io.tensors import TensorFile
from rcdiag.io.torch_load import load_torch, to_numpy, torch_module
from rcdiag.runtime.errors import InputError

HOLDS = "a SkyRL training batch"
MODULES = ("skyrl.backends.skyrl_train.training_batch", "skyrl_train.training_batch")
"""Where SkyRL's batch classes live (the second before SkyRL's 2026-03 package move)."""
DTYPES = frozenset(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
)
"""The numpy dtypes a batch's ``"numpy"`` entries hold (``str(array.dtype)``); bfloat16 goes through ``"torch"``."""
ALIASES: dict[str, tuple[str, ...]] = {"old": ("action_log_probs",)}
"""SkyRL names the trainer's log-probs ``action_log_probs`` (``rollout_logprobs`` is a known rollout name)."""
MASK = "loss_mask"
TORCH_PICKLED = "holds torch tensors (SkyRL pickled them so before 2026-03)"


class StandIn(dict):
    """What the pickle's ``TrainingInputBatch`` (or ``TensorList``) becomes: a dict that keeps the state it is
    given and runs nothing."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class TensorListStandIn(StandIn):
    """SkyRL's ``TensorList`` (images per sample): kept, never read."""


def admitted(path: str) -> dict[tuple[str, str], Any]:
    """The globals a SkyRL training-batch pickle names, each mapped to its stand-in (errors naming ``path``)."""

    def rebuild_batch(cls: Any, state: Any) -> StandIn:  # _rebuild_tensor_batch(cls, state)
        if cls is not StandIn:
            raise InputError(f"rebuilds {getattr(cls, '__name__', cls)!r}, expected a TrainingInputBatch", path=path)
        batch = StandIn()
        batch.state = state
        return batch

    def device(kind: Any, index: Any = None) -> str:  # torch.device: its name, nothing else
        return f"{kind}" if index is None else f"{kind}:{index}"

    def storage_from_bytes(data: Any) -> Any:  # torch.storage._load_from_bytes, with weights_only=True
        if not isinstance(data, bytes):
            raise InputError(f"holds a tensor storage of {type(data).__name__}, expected torch.save bytes", path=path)
        torch_module(path, TORCH_PICKLED)
        return load_torch(io.BytesIO(data), path)

    def rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> Any:
        """torch._utils._rebuild_tensor_v2 over a storage read above, shape and strides checked to be whole
        numbers; hooks and metadata dropped."""
        torch = torch_module(path, TORCH_PICKLED)
        from torch._utils import _rebuild_tensor_v2

        shape = (*size, *stride) if isinstance(size, tuple) and isinstance(stride, tuple) else (None,)
        whole = all(isinstance(n, int) and not isinstance(n, bool) for n in (offset, *shape))
        storages = (torch.storage.TypedStorage, torch.storage.UntypedStorage)
        if not isinstance(storage, storages) or not whole or len(size) != len(stride):
            raise InputError("holds a tensor whose storage, shape or strides are not torch's", path=path)
        try:
            return _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())
        except RuntimeError as exc:
            raise InputError(f"holds a tensor its storage cannot hold ({str(exc)[:120]})", path=path) from None

    table: dict[tuple[str, str], Any] = {
        ("skyrl.backends.skyrl_train.training_batch", "_rebuild_tensor_batch"): rebuild_batch,
        ("torch", "device"): device,
        ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
        ("torch.storage", "_load_from_bytes"): storage_from_bytes,
        ("collections", "OrderedDict"): OrderedDict,
    }
    for module in MODULES:
        table[(module, "TrainingInputBatch")] = StandIn
        table[(module, "TensorList")] = TensorListStandIn
    return table


def load_skyrl(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arrays, {})`` of a SkyRL training-batch pickle: each tensor of the batch as numpy, pad rows dropped."""
    batch = safe_pickle.load(path, admitted(path), HOLDS)
    state = batch.state if isinstance(batch, StandIn) else None
    if not isinstance(state, dict) or not isinstance(state.get("batch_dict"), dict):
        raise InputError(
            f"holds a {type(batch).__name__} without a batch state; expected SkyRL's TrainingInputBatch "
            "(trainer.dump_data_batch=true)",
            path=path,
        )
    arrays = {}
    for key, value in state["batch_dict"].items():
        array = _tensor(value, str(key), path)
        if array is not None:
            arrays[str(key)] = array
    metadata = state.get("metadata")
    pad = metadata.get("pad_size", 0) if isinstance(metadata, dict) else 0
    rows = {len(a) for a in arrays.values()}
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad <= min(rows, default=0):
        raise InputError(f"holds metadata pad_size {pad!r}, expected a whole number of rows in the batch", path=path)
    # each row its own list: the padded width changes from step to step, which a shard's schema may not
    return {key: list(array[: len(array) - pad]) if array.ndim == 2 else array[: len(array) - pad]
            for key, array in arrays.items()}, {}  # fmt: skip


def _tensor(value: Any, key: str, path: str) -> np.ndarray | None:
    """One ``batch_dict`` entry as an array (``None``: absent, or a list of per-sample tensors, which no column
    reads)."""
    if value is None or (isinstance(value, dict) and value.get("format") == "tensor_list"):
        return None
    if isinstance(value, bytes) or (isinstance(value, dict) and value.get("format") == "torch"):
        data = value if isinstance(value, bytes) else value.get("data")
        if not isinstance(data, bytes):
            raise InputError(f"holds '{key}' of format 'torch' without its bytes", path=path)
        torch_module(path, f"holds '{key}' as torch.save bytes (SkyRL saves bfloat16 tensors so)")
        tensor = load_torch(io.BytesIO(data), path)
        return None if tensor is None else _array(to_numpy(tensor, key, path), key, path)
    if not isinstance(value, dict) or value.get("format", "numpy") != "numpy":
        shown = value.get("format") if isinstance(value, dict) else type(value).__name__
        raise InputError(f"holds '{key}' as {shown!r}, which SkyRL's TensorBatch never writes", path=path)
    data, shape, dtype = value.get("data"), value.get("shape"), value.get("dtype")
    if not isinstance(data, bytes) or dtype not in DTYPES or not isinstance(shape, tuple):
        raise InputError(
            f"holds '{key}' without numpy bytes, a known dtype and a shape (dtype {dtype!r}, shape {shape!r})",
            path=path,
        )
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise InputError(f"holds '{key}' of shape {shape!r}, expected whole numbers", path=path)
    needed = math.prod(shape) * np.dtype(dtype).itemsize
    if needed != len(data):
        raise InputError(
            f"holds '{key}' of shape {shape} {dtype} ({needed:,} bytes) in {len(data):,} bytes; the file is damaged",
            path=path,
        )
    return _array(np.frombuffer(data, dtype=dtype).reshape(shape), key, path)


def _array(value: Any, key: str, path: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        raise InputError(
            f"holds '{key}' of {type(value).__name__}, expected a tensor with one row per sample", path=path
        )
    return value.astype(np.float32) if value.dtype == np.float16 else value


class SkyrlFile(TensorFile):
    """One ``global_step_{N}_training_input.pkl``; its mask is ``loss_mask`` unless ``--mask-col`` names another."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        loaded = [load_skyrl(str(path))]

        def load(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
            return loaded.pop() if loaded else load_skyrl(name)  # the first load serves the opening, once

        columns = columns or ColumnMap()
        if columns.mask is None and MASK in loaded[0][0]:
            columns = dataclasses.replace(columns, mask=MASK)
        super().__init__(path, columns, format="skyrl", load=load, extra_aliases=ALIASES)
