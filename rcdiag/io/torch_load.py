"""PyTorch data read without running code: ``torch.load(..., weights_only=True)`` and tensors as numpy.

Shared by the readers of ``.pt`` files (``rcdiag.io.torch_pt``) and of SkyRL's pickles, which nest ``torch.save``
bytes (``rcdiag.io.skyrl``). A ``.pt`` is a zip archive: its members' sizes are checked against
``rcdiag.io.limits`` before torch reads them (torch itself checks each storage against its record). A tensor's size
is then its shape's, never its storage's: an expanded (stride-0) tensor of one stored value may declare 10^12 x 8
values, which reading it as an array allocates, so the shapes' sizes together are held to ``TENSOR_BYTES`` before
any tensor is converted. Tensors are read as numpy: float8 and half types become float32; a sparse, quantized or
meta tensor (no plain values to read) is refused by name.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from typing import IO, Any

import numpy as np

from rcdiag.io.archives import check_members
from rcdiag.io.limits import TENSOR_BYTES
from rcdiag.runtime.errors import InputError

NEEDS_TORCH = "reading it needs PyTorch (pip install torch, or pip install 'rcdiag[gpu]')"


def torch_module(path: str, what: str = "is a PyTorch file") -> Any:
    """``torch``, or an ``InputError`` naming the file and what installs it."""
    try:
        import torch
    except ImportError:
        raise InputError(f"{what}; {NEEDS_TORCH}", path=path) from None
    return torch


def load_torch(handle: IO[bytes], path: str) -> Any:
    """The object ``torch.save`` wrote to ``handle`` (seekable), loaded with ``weights_only=True``: tensors,
    containers and numbers only, never code; its tensors' declared sizes held to ``TENSOR_BYTES``."""
    torch = torch_module(path)
    try:
        with warnings.catch_warnings():
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
    return obj


def to_numpy(value: Any, key: str, path: str) -> Any:
    """A tensor as a numpy array (a 0-d one as a number), a list of tensors as a list of arrays, a list of lists as
    float64 arrays; anything else as it is."""
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
        return [to_numpy(v, key, path) for v in value]
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
