"""PyTorch ``.pt`` dumps: a dict of tensors with verl's batch names, or slime's and Miles' debug train data.

Always loaded with ``torch.load(..., weights_only=True)`` (``rcdiag.io.torch_load``): a dump can only hold tensors,
lists, dicts and numbers, never code to run. Recognised structures:

* ``{"old_log_probs": B x T, "rollout_log_probs": B x T, "response_mask": B x T, ...}`` (verl's
  ``DataProto.batch`` names; saved e.g. with ``torch.save(dict(batch.batch), path)``);
* the same dict under a ``"batch"`` key;
* slime ``--save-debug-train-data``: format 1, ``{"rollout_id": N, "rollout_data": {"log_probs": [...],
  "rollout_log_probs": [...], "loss_masks": [...], ...}}`` with one 1-D tensor per sample, and format 2
  (``format_version: 2``, a ``samples`` list; ``rcdiag.io.slime``); the step is ``rollout_id``;
* Miles ``--dump-details`` (and slime's before format 2): ``train_data/{rollout_id}_{rank}.pt``, one file per
  rank, read with every rank file of its rollout, context-parallel slices stitched (``rcdiag.io.rank_files``).

Every per-sample field read must hold ``response_lengths`` values per sample: a slice of a response is never read
as the whole of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import rcdiag.io.outputs as outputs
from rcdiag.io import rank_files, slime
from rcdiag.io.base import ColumnMap
from rcdiag.io.paths import open_input
from rcdiag.io.tensors import TensorFile
from rcdiag.io.torch_load import load_torch, to_numpy
from rcdiag.runtime.errors import InputError

SLIME_ALIASES: dict[str, tuple[str, ...]] = {"old": ("log_probs",)}
"""slime calls the trainer's log-probs ``log_probs``; recognised only inside slime's ``rollout_data``."""


def load_pt(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arrays, file-level scalars)`` of a ``.pt`` dump (with the other rank files of its rollout when it is
    one), loaded without running code."""
    files = rank_files.rollout_files(path)
    objs = [(name, _load_dict(name)) for name in files]
    obj = objs[0][1] if len(objs) == 1 else {}
    if len(objs) == 1 and not slime.is_train_dump(obj):
        return _plain(obj, path)
    dumps = [(name, slime.as_rollout_data(o, name)) for name, o in objs]
    _same_rollout(dumps)
    packs = [rank_files.Pack(name, dump, to_numpy) for name, dump in dumps]
    leader = dumps[0][1]
    scalars = {k: to_numpy(v, str(k), path) for k, v in leader.items() if not isinstance(v, (dict, list, tuple))}
    arrays = rank_files.join(packs, path)
    return arrays, {k: v for k, v in scalars.items() if isinstance(v, (int, float, str, np.integer))}


def _load_dict(name: str) -> dict[str, Any]:
    outputs.reads(name)  # a rank file read beside the one named is an input too
    with open_input(name) as handle:
        obj = load_torch(handle, name)
    if not isinstance(obj, dict):
        raise InputError(
            f"holds a {type(obj).__name__}, expected a dict of tensors (e.g. old_log_probs, rollout_log_probs, "
            "response_mask)",
            path=name,
        )
    return obj


def _same_rollout(objs: list[tuple[str, dict[str, Any]]]) -> None:
    """The rank files of one rollout say the same ``rollout_id``."""
    ids = [(name, obj.get("rollout_id")) for name, obj in objs]
    for name, rollout in ids[1:]:
        if rollout != ids[0][1]:
            raise InputError(
                f"holds rollout_id {rollout!r} but {ids[0][0]} holds {ids[0][1]!r}; the rank files of one rollout "
                "must agree",
                path=name,
            )


def _plain(obj: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dict of tensors (or such a dict under ``"batch"``)."""
    scalars = {k: to_numpy(v, str(k), path) for k, v in obj.items() if not isinstance(v, (dict, list, tuple))}
    if isinstance(obj.get("batch"), dict):
        obj = obj["batch"]
    arrays = {str(k): to_numpy(v, str(k), path) for k, v in obj.items()}
    scalars.update({k: v for k, v in arrays.items() if isinstance(v, (int, float, str))})
    return arrays, {k: v for k, v in scalars.items() if isinstance(v, (int, float, str, np.integer))}


class TorchFile(TensorFile):
    """One ``.pt`` file (a rollout's rank files: the lowest rank's, which reads the others)."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        loaded = [load_pt(str(path))]

        def load(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
            return loaded.pop() if loaded else load_pt(name)  # the first load serves the opening, once

        arrays = loaded[0][0]
        slime_names = "rollout_log_probs" in arrays and "log_probs" in arrays and "old_log_probs" not in arrays
        super().__init__(path, columns, format="torch", load=load, extra_aliases=SLIME_ALIASES if slime_names else None)
