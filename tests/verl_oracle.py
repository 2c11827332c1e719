"""Load verl v0.9.0's own rollout-correction helper as a test oracle, without verl's heavy dependencies.

verl is installed with ``pip install --no-deps verl==0.9.0`` (see .ci/run). Its package ``__init__`` files import
ray, transformers and more, so we load only the modules the helper needs (``rollout_corr_helper``,
``torch_functional``, ``algorithm`` config) from the installed files and stand in tiny stubs for the imports
they never use on this path (``DataProto``, ``PolicyLossConfig``, ``tensordict``, ``transformers``).
Nothing of verl is copied into this repository.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from functools import cache
from typing import Any


@cache
def load_verl() -> tuple[Any, Any] | None:
    """``(rollout_corr_helper module, RolloutCorrectionConfig class)``, or ``None`` if verl is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = next(iter(spec.submodule_search_locations))
    saved = {name: sys.modules.get(name) for name in _STUBBED}

    def package(name: str, path: str) -> None:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module

    try:
        package("verl", root)
        for sub in ("utils", "trainer", "trainer/ppo", "trainer/config", "workers", "workers/config"):
            package("verl." + sub.replace("/", "."), os.path.join(root, sub))
        for name, attrs in _STUBS.items():
            if name in sys.modules and name not in ("verl.protocol", "verl.workers.config.actor"):
                continue
            module = types.ModuleType(name)
            for attr, value in attrs.items():
                setattr(module, attr, value)
            sys.modules[name] = module
        helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        algorithm = importlib.import_module("verl.trainer.config.algorithm")
        return helper, algorithm.RolloutCorrectionConfig
    finally:
        # Keep the loaded verl modules (helper holds references) but do not leak stubs of real packages.
        for name in ("tensordict", "transformers"):
            if saved.get(name) is not None:
                sys.modules[name] = saved[name]


class _DataProto:
    def __init__(self, batch: dict) -> None:
        self.batch = batch

    @classmethod
    def from_dict(cls, tensors: dict) -> _DataProto:
        return cls(dict(tensors))


_STUBS: dict[str, dict[str, Any]] = {
    "tensordict": {"TensorDict": object},
    "transformers": {"PreTrainedTokenizer": object},
    "verl.protocol": {"DataProto": _DataProto},
    "verl.workers.config.actor": {"PolicyLossConfig": object},
}
_STUBBED = tuple(_STUBS)


def require_verl() -> Any:
    """The torch module, with verl loaded; or skip saying what to install (a failure under ``CI=true``)."""
    from missing_components import missing

    try:
        import torch
    except ImportError:
        missing("torch")
    if load_verl() is None:
        missing("verl")
    return torch


def verl_metrics(old: Any, rollout: Any, mask: Any, **config: Any) -> dict[str, float]:
    """verl's ``rollout_corr/*`` metrics for padded (B, T) tensors and a config (verl's field names)."""
    loaded = load_verl()
    assert loaded is not None
    helper, _ = loaded
    _, _, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old,
        rollout_log_prob=rollout,
        response_mask=mask,
        rollout_is=config.get("rollout_is"),
        rollout_is_threshold=config.get("rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=config.get("rollout_is_batch_normalize", False),
        rollout_rs=config.get("rollout_rs"),
        rollout_rs_threshold=config.get("rollout_rs_threshold"),
    )
    return metrics
