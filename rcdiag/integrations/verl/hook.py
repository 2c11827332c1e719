"""rcdiag's ``DumpWriter`` wrapped around verl's rollout-correction step, in verl's own process.

verl's trainer calls ``compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)`` once per step on
the driver (decoupled mode), with the batch's ``old_log_probs``, ``rollout_log_probs`` and the original
``response_mask`` (which the call replaces with the rejection-sampled one). ``install`` replaces that function in
verl's module (and in any verl module that already imported it) by a wrapper that first writes those tensors, the
step, the rollout temperature and the response token ids as one dump step, then calls verl's function with the same
arguments and returns its result unchanged. In Ray's worker processes, ``setup_worker`` wraps it as soon as verl's
module is imported there, and imports nothing itself. Nothing in training changes: the wrapper only reads the batch,
and a step that cannot be written is a notice, never an exception in the trainer. No verl file is edited.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeGuard

from rcdiag.io.dump_writer import DumpWriter
from rcdiag.runtime.notices import notify
from rcdiag.settings.constants import ROUTER_REPLAY_KEY

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
                metadata = run_metadata(rollout_corr_config, router_replay(caller))
                self._writer = DumpWriter(self.directory, metadata=metadata)
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


def _is_step(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


ENGINES = ("megatron", "veomni", "fsdp")
"""``actor_rollout_ref.actor.<engine>`` blocks that may hold ``router_replay``."""


def router_replay(caller: FrameType | None) -> str | None:
    """The actor's ``router_replay.mode`` in the config of the trainer that called (``self.config``), if any."""
    trainer = caller.f_locals.get("self") if caller is not None else None
    actor = getattr(getattr(getattr(trainer, "config", None), "actor_rollout_ref", None), "actor", None)
    for engine in ENGINES:
        mode = getattr(getattr(getattr(actor, engine, None), "router_replay", None), "mode", None)
        if isinstance(mode, str):
            return mode
    return None


def run_metadata(rollout_corr_config: Any, router_replay_mode: str | None = None) -> dict[str, str]:
    """What the dump records of the run: verl's version, its rollout-correction settings and the actor's router
    replay mode (a sweep never ranks a preset verl refuses with it)."""
    metadata = {"rcdiag.integration": "rcdiag.integrations.verl"}
    if router_replay_mode is not None:
        metadata[ROUTER_REPLAY_KEY] = router_replay_mode
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
    def compute_rollout_correction_and_add_to_batch(
        batch: Any, rollout_corr_config: Any, *args: Any, **kwargs: Any
    ) -> Any:
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


class _WrapAfterImport(importlib.abc.MetaPathFinder):
    """Wraps verl's step right after verl's helper module is first imported, and does nothing else: a Ray worker
    that never imports it (a rollout or GPU worker) imports nothing more than it would have."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != HELPER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenWrap(spec.loader, self)
                return spec
        return None

    def wrap_now(self) -> None:
        """Wrap the step (its module is imported) and stop watching imports; a failure is a notice."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            install(self.directory)
        except Exception as error:
            notify(f"rcdiag: cannot wrap verl's rollout-correction step: {type(error).__name__}: {error}")


class _ThenWrap(importlib.abc.Loader):
    """verl's own loader, then the wrap."""

    def __init__(self, loader: Any, finder: _WrapAfterImport) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.finder.wrap_now()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename...: the real loader's
        return getattr(self.loader, name)


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook`` for the run: in each worker process (verl's trainer runs in one, its
    ``TaskRunner``), wrap verl's step when verl's helper module is imported. Never raises."""
    directory = os.environ.get(DUMP_DIR_ENV)
    if not directory:
        return
    if HELPER in sys.modules:
        _WrapAfterImport(directory).wrap_now()
    elif not any(isinstance(finder, _WrapAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WrapAfterImport(directory))
