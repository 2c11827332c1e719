"""PyTorch ``.pt`` dumps: a dict of tensors with verl's batch names, or slime's debug train data.

Always loaded with ``torch.load(..., weights_only=True)``: a dump can only hold tensors, lists, dicts and
numbers, never code to run. Recognised structures:

* ``{"old_log_probs": B x T, "rollout_log_probs": B x T, "response_mask": B x T, ...}`` (verl's
  ``DataProto.batch`` names; saved e.g. with ``torch.save(dict(batch.batch), path)``);
* the same dict under a ``"batch"`` key;
* slime ``--save-debug-train-data``: ``{"rollout_id": N, "rollout_data": {"log_probs": [...],
  "rollout_log_probs": [...], "loss_masks": [...], ...}}`` with one 1-D tensor per sample; the step is
  ``rollout_id``.

A ``.pt`` is a zip archive: its members' sizes are checked against ``rcdiag.io.limits`` before torch reads them
(torch itself checks each storage against its record). A tensor's size is then its shape's, never its storage's:
an expanded (stride-0) tensor of one stored value may declare 10^12 x 8 values, which reading it as an array
allocates, so the shapes' sizes together are held to ``TENSOR_BYTES`` before any tensor is converted. Tensors are
read as numpy: float8 and half types become float32; a sparse, quantized or meta tensor (no plain values to read)
is refused by name.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.io.archives import check_members
from rcdiag.io.base import ColumnMap
from rcdiag.io.limits import TENSOR_BYTES
from rcdiag.io.paths import open_input
from rcdiag.io.tensors import TensorFile

SLIME_ALIASES: dict[str, tuple[str, ...]] = {"old": ("log_probs",)}
"""slime calls the trainer's log-probs ``log_probs``; recognised only inside slime's ``rollout_data``."""


def _numpy(value: Any, key: str, path: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_meta or value.layout != torch.strided or value.is_quantized:
            kind = "meta" if value.is_meta else "quantized" if value.is_quantized else f"{value.layout}".split(".")[-1]
            raise InputError(
                f"key '{key}' holds a {kind} tensor ({value.dtype}), which has no plain values to read; save it dense, "
                "with its values (tensor.to_dense(), .dequantize(), or the real tensor for a meta one)",
                path=path,
            )
        tensor = value.detach().cpu()
        if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float64):
            tensor = tensor.float()  # bfloat16, float16 and the float8 types: exact in float32
        try:
            return tensor.numpy() if tensor.ndim else tensor.item()
        except (TypeError, RuntimeError) as exc:
            raise InputError(
                f"key '{key}' holds a {tensor.dtype} tensor that cannot be read as numbers ({str(exc)[:120]})",
                path=path,
            ) from None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return [_numpy(v, key, path) for v in value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, list) for v in value):
        return [np.asarray(v, dtype=np.float64) for v in value]
    return value


def declared_bytes(obj: Any) -> int:
    """The bytes the tensors in ``obj`` (dicts, lists and tuples walked) take once read as arrays: each tensor's
    number of elements (its shape, whatever its storage holds) times the item size it is read as (float types
    other than float64 become float32); a tensor under two keys is read, and counted, twice."""
    import torch

    total, pending, seen = 0, [obj], set()
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            floating = value.is_floating_point() and value.dtype != torch.float64
            total += value.numel() * (4 if floating else value.element_size())
        elif isinstance(value, (dict, list, tuple)) and id(value) not in seen:  # a list may hold itself
            seen.add(id(value))
            pending.extend(value.values() if isinstance(value, dict) else value)
    return total


def load_pt(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arrays, file-level scalars)`` of a ``.pt`` dump, loaded without running code."""
    try:
        import torch
    except ImportError:
        raise InputError(
            "is a PyTorch file; reading it needs PyTorch (pip install torch, or pip install 'rcdiag[gpu]')", path=path
        ) from None
    try:
        with open_input(path) as handle, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecation notes must not precede rcdiag's one error line
            if zipfile.is_zipfile(handle):
                handle.seek(0)
                with zipfile.ZipFile(handle) as archive:
                    check_members(archive, path)
            handle.seek(0)
            obj = torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else "unsupported object"
        raise InputError(
            f"holds objects other than tensors, lists, dicts and numbers ({first}); rcdiag loads .pt files with "
            "weights_only=True and never runs code from a dump: save a plain dict of tensors",
            path=path,
        ) from None
    except MemoryError as exc:  # a legacy (non-zip) file declares sizes only torch's reader sees
        raise InputError(
            f"declares a tensor larger than the memory available ({str(exc)[:120]}); is the file corrupt?", path=path
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"cannot be read as a PyTorch file ({str(exc)[:160]}); is it complete?", path=path) from None
    TENSOR_BYTES.check(declared_bytes(obj), path, "the decoded size of its tensors (their shapes' sizes)")
    if not isinstance(obj, dict):
        raise InputError(
            f"holds a {type(obj).__name__}, expected a dict of tensors (e.g. old_log_probs, rollout_log_probs, "
            "response_mask)",
            path=path,
        )
    scalars = {k: _numpy(v, str(k), path) for k, v in obj.items() if not isinstance(v, (dict, list, tuple))}
    for key in ("rollout_data", "batch"):
        if isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    arrays = {str(k): _numpy(v, str(k), path) for k, v in obj.items()}
    scalars.update({k: v for k, v in arrays.items() if isinstance(v, (int, float, str))})
    return arrays, {k: v for k, v in scalars.items() if isinstance(v, (int, float, str, np.integer))}


class TorchFile(TensorFile):
    """One ``.pt`` file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        arrays, _ = load_pt(str(path))
        slime = "rollout_log_probs" in arrays and "log_probs" in arrays and "old_log_probs" not in arrays
        super().__init__(path, columns, format="torch", load=load_pt, extra_aliases=SLIME_ALIASES if slime else None)
