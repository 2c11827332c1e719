"""NumPy ``.npz`` dumps with verl's batch names (``old_log_probs``, ``rollout_log_probs``, ``response_mask``).

Loaded with ``allow_pickle=False``: object arrays (ragged lists) would need pickle and are refused; save
padded 2-D arrays with a mask, or 1-D per-token arrays with a sequence id (the long layout). Every member's declared
size is checked against the archive and ``rcdiag.io.limits`` before numpy allocates it (``rcdiag.io.archives``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.io.archives import check_members, npy_declared_bytes
from rcdiag.io.base import ColumnMap
from rcdiag.io.paths import open_input
from rcdiag.io.tensors import TensorFile
from rcdiag.runtime.errors import InputError


def load_npz(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arrays, 0-d scalars)`` of an ``.npz`` file."""
    try:
        with open_input(path) as handle:
            _check(handle, path)
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as data:
                items = {name: data[name] for name in data.files}
    except ValueError as exc:
        raise InputError(
            f"holds object arrays ({exc}); save numeric arrays: padded 2-D log-probs with a mask", path=path
        ) from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"cannot be read as .npz ({str(exc)[:160]}); is it complete?", path=path) from None
    scalars = {k: v.item() for k, v in items.items() if v.ndim == 0}
    return {k: v for k, v in items.items() if v.ndim > 0}, scalars


def _check(handle: Any, path: str) -> None:
    """An archive of ``.npy`` members only, each holding the bytes its header declares, within the limits."""
    if not zipfile.is_zipfile(handle):
        raise InputError(
            "is not an .npz archive (a zip of .npy arrays, as numpy.savez writes); rcdiag reads no pickled or bare "
            ".npy data under that name",
            path=path,
        )
    handle.seek(0)
    with zipfile.ZipFile(handle) as archive:
        check_members(archive, path)
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                raise InputError(
                    f"holds member '{info.filename}', which is not a NumPy array (.npy); an .npz holds arrays only "
                    "(numpy.savez)",
                    path=path,
                )
            npy_declared_bytes(archive, info, path)


class NpzFile(TensorFile):
    """One ``.npz`` file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        super().__init__(path, columns, format="npz", load=load_npz)
