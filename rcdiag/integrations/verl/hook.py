"""rcdiag's ``DumpWriter`` wrapped around verl's rollout-correction step, in verl's own process.

verl's trainer calls ``compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)`` once per step on
the driver (decoupled mode), with the batch's ``old_log_probs``, ``rollout_log_probs`` and the original
``response_mask`` (which the call replaces with the rejection-sampled one). ``install`` replaces that function in
verl's module (and in any verl module that already imported it) by a wrapper that first writes those tensors, the
step, the rollout temperature and the response token ids as one dump step, then calls verl's function with the same
arguments and returns its result unchanged. Nothing in training changes: the wrapper only reads the batch, and a
step that cannot be written is a notice, never an exception in the trainer. No verl file is edited.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rcdiag.notices import notify
from rcdiag.writer import DumpWriter

HELPER = "verl.trainer.ppo.rollout_corr_helper"
STEP_FUNCTION = "compute_rollout_correction_and_add_to_batch"
DUMP_DIR_ENV = "RCDIAG_VERL_DUMP_DIR"
"""Tells a Ray worker of the run where to dump (set by the entry point, read by ``setup_worker``)."""
CONFIG_FIELDS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                 "rollout_rs_threshold", "bypass_mode")  # fmt: skip
"""verl's ``algorithm.rollout_correction`` fields recorded in the dump's metadata."""


class StepDumper:
    """Writes one dump step per call of verl's rollout-correction step into ``directory``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.calls = 0
        self._writer: DumpWriter | None = None

    def dump(self, batch: Any, rollout_corr_config: Any, caller: FrameType | None) -> None:
        """Write the step; any failure is a notice naming the step (training goes on)."""
        self.calls += 1
        step = training_step(batch, caller, self.calls)
        try:
            tensors = batch.batch
            if self._writer is None:
                self._writer = DumpWriter(self.directory, metadata=run_metadata(rollout_corr_config))
            self._writer.write(
                step=step,
                old_log_prob=tensors["old_log_probs"],
                rollout_log_prob=tensors["rollout_log_probs"],
                response_mask=tensors["response_mask"],
                temperature=(getattr(batch, "meta_info", None) or {}).get("temperature"),
                token_ids=tensors["responses"] if "responses" in tensors.keys() else None,  # noqa: SIM118 (TensorDict)
            )
        except Exception as error:  # the trainer must not fail because a dump could not be written
            notify(f"rcdiag: step {step} was not dumped to {self.directory}: {type(error).__name__}: {error}")


def training_step(batch: Any, caller: FrameType | None, calls: int) -> int:
    """verl's ``global_steps``: from the batch's meta_info, else from the trainer that called (``self``), else the
    number of calls so far (verl counts steps from 1)."""
    step = (getattr(batch, "meta_info", None) or {}).get("global_steps")
    if caller is not None and not _is_step(step):
        step = getattr(caller.f_locals.get("self"), "global_steps", None)
    return int(step) if _is_step(step) else calls


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def run_metadata(rollout_corr_config: Any) -> dict[str, str]:
    """What the dump records of the run: verl's version and its rollout-correction settings."""
    metadata = {"rcdiag.integration": "rcdiag.integrations.verl"}
    version = getattr(sys.modules.get("verl"), "__version__", None)
    if version is not None:
        metadata["verl.version"] = str(version)
    getter = getattr(rollout_corr_config, "get", None)
    if callable(getter):
        fields = {name: getter(name, None) for name in CONFIG_FIELDS}
        metadata["verl.rollout_correction"] = json.dumps(fields, default=str, sort_keys=True)
    return metadata


def wrap(function: Callable[..., Any], dumper: StepDumper) -> Callable[..., Any]:
    """``function`` (verl's step) that first dumps its batch; same arguments, same result."""

    @functools.wraps(function)
    def compute_rollout_correction_and_add_to_batch(batch: Any, rollout_corr_config: Any, *args: Any, **kwargs: Any):
        dumper.dump(batch, rollout_corr_config, sys._getframe(1))
        return function(batch, rollout_corr_config, *args, **kwargs)

    compute_rollout_correction_and_add_to_batch.rcdiag_dumper = dumper  # type: ignore[attr-defined]
    return compute_rollout_correction_and_add_to_batch


def install(directory: str | Path) -> Callable[..., Any]:
    """Wrap verl's rollout-correction step in this process (idempotent); returns the wrapper. Raises
    ``ImportError`` when verl's helper module cannot be imported."""
    helper = importlib.import_module(HELPER)
    current = getattr(helper, STEP_FUNCTION)
    if getattr(current, "rcdiag_dumper", None) is not None:
        return current
    wrapped = wrap(current, StepDumper(directory))
    for name, module in list(sys.modules.items()):  # modules that imported the function by name before us
        if (name == "verl" or name.startswith("verl.")) and getattr(module, STEP_FUNCTION, None) is current:
            setattr(module, STEP_FUNCTION, wrapped)
    return wrapped


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook`` for the run: wrap verl's step in each worker process, where verl's
    trainer (its ``TaskRunner``) runs. Never raises: a worker that cannot import verl says so and goes on."""
    directory = os.environ.get(DUMP_DIR_ENV)
    if not directory:
        return
    try:
        install(directory)
    except Exception as error:
        notify(f"rcdiag: cannot wrap verl's rollout-correction step in this worker: {type(error).__name__}: {error}")
