"""Load the rollout-correction code of verl v0.7.1, v0.8.0 and v0.9.0 as test oracles, without verl's heavy
dependencies.

Each release is installed with ``pip install --no-deps --target .gl/verl-<version> verl==<version>`` (see .ci/run);
v0.9.0 may also come from the environment (``pip install --no-deps verl==0.9.0``). Its package ``__init__`` files
import ray, transformers and more, so we load only the modules the oracles need (``rollout_corr_helper``,
``torch_functional``, ``algorithm`` config, ``seqlen_balancing``, ``metric.utils``, ``debug.metrics``) from the
installed files and stand in tiny stubs for the imports they never use on this path (``DataProto``,
``PolicyLossConfig``, ``tensordict``, ``transformers``, the tensordict helpers). Several releases share the module
name ``verl``: loading one takes the previous one's modules out of ``sys.modules`` (the loaded modules keep their
references, and none of the functions used here imports lazily). Nothing of verl is copied into this repository.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from functools import cache
from pathlib import Path
from typing import Any

ORACLE_VERSIONS = ("0.7.1", "0.8.0", "0.9.0")
"""The releases whose code the tests run (0.9.1's rollout-correction code is byte-identical to 0.9.0's)."""
TARGETS = Path(__file__).resolve().parent.parent / ".gl"


def load_verl(version: str = "0.9.0") -> tuple[Any, Any] | None:
    """``(rollout_corr_helper module, RolloutCorrectionConfig class)`` of one release, or ``None`` if that release
    is not installed."""
    loaded = load_modules(version)
    return None if loaded is None else (loaded["helper"], loaded["algorithm"].RolloutCorrectionConfig)


def verl_root(version: str) -> str | None:
    """The directory of release ``version``'s ``verl`` package: .gl/verl-<version>/verl, else (0.9.0) the
    environment's verl."""
    target = TARGETS / f"verl-{version}" / "verl"
    if target.is_dir():
        return str(target)
    if version != "0.9.0":
        return None
    spec = importlib.util.find_spec("verl") if "verl" not in sys.modules else None
    if spec is not None and spec.submodule_search_locations:
        return next(iter(spec.submodule_search_locations))
    site = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "verl"))]
    return os.path.join(site[0], "verl") if site else None


@cache
def load_modules(version: str = "0.9.0") -> dict[str, Any] | None:
    """The oracle modules of one release by short name (helper, algorithm, balancing, metric, debug), or ``None``."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    root = verl_root(version)
    if root is None:
        return None
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
        del sys.modules[name]
    saved = {name: sys.modules.get(name) for name in _STUBBED}

    def package(name: str, path: str) -> None:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module

    try:
        package("verl", root)
        for sub in ("utils", "utils/debug", "trainer", "trainer/ppo", "trainer/config", "workers", "workers/config"):
            package("verl." + sub.replace("/", "."), os.path.join(root, sub))
        for name, attrs in _STUBS.items():
            if name in sys.modules and not name.startswith("verl."):
                continue
            module = types.ModuleType(name)
            for attr, value in attrs.items():
                setattr(module, attr, value)
            sys.modules[name] = module
        return {
            "helper": importlib.import_module("verl.trainer.ppo.rollout_corr_helper"),
            "algorithm": importlib.import_module("verl.trainer.config.algorithm"),
            "balancing": importlib.import_module("verl.utils.seqlen_balancing"),
            "metric": importlib.import_module("verl.utils.metric.utils"),
            "debug": importlib.import_module("verl.utils.debug.metrics"),
        }
    finally:
        # Keep the loaded verl modules (helper holds references) but do not leak stubs of real packages: a stub
        # left in sys.modules (no __spec__) would stand for the package in every later import and find_spec.
        for name in ("tensordict", "transformers"):
            if saved.get(name) is not None:
                sys.modules[name] = saved[name]
            else:
                sys.modules.pop(name, None)


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
    "verl.utils.tensordict_utils": {"index_select_tensor_dict": lambda batch, index: index},
}
_STUBBED = tuple(_STUBS)


def require_verl(version: str = "0.9.0") -> Any:
    """The torch module, with verl ``version`` loaded; or skip saying what to install (a failure under
    ``CI=true``)."""
    from missing_components import missing

    try:
        import torch
    except ImportError:
        missing("torch")
    if load_verl(version) is None:
        missing(f"verl-{version}")
    return torch


def verl_metrics(old: Any, rollout: Any, mask: Any, version: str = "0.9.0", **config: Any) -> dict[str, float]:
    """verl ``version``'s metrics for padded (B, T) tensors and a config (verl's field names): in decoupled mode
    (``bypass_mode`` false, the default) the ``training/*`` debug metrics first, as verl's trainer logs them, then
    the ``rollout_corr/*`` ones. The rollout correction runs first, so a batch without a valid token raises its
    ``ValueError`` under every release (verl 0.7.1's trainer raises a ``RuntimeError`` in the debug metrics before
    it: ``verl_debug_metrics``)."""
    loaded = load_verl(version)
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
    if config.get("bypass_mode"):
        return metrics
    return {**verl_debug_metrics(old, rollout, mask, version), **metrics}


def verl_debug_metrics(old: Any, rollout: Any, mask: Any, version: str = "0.9.0") -> dict[str, float]:
    """verl ``version``'s ``training/*`` debug metrics (``calculate_debug_metrics``) for padded (B, T) tensors, as
    verl's trainer calls it in decoupled mode: ``old_log_probs`` recomputed, the response mask before rollout
    correction changes it. Raises what that release raises (0.7.1: on a batch without a valid token)."""
    loaded = load_modules(version)
    assert loaded is not None
    batch = {"rollout_log_probs": rollout, "old_log_probs": old, "response_mask": mask, "responses": mask}
    return loaded["debug"].calculate_debug_metrics(_DataProto(batch))
