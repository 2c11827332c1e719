"""Each framework's own code as the oracle of ``rcdiag analyze --as NAME`` (beside tests/verl_oracle.py).

Every release is installed without its dependencies into ``.gl/NAME-VERSION`` (``pip install --no-deps --target``,
as .ci/run does). Nothing of theirs is copied into this repository:

* TRL's correction sits inline in ``GRPOTrainer._generate_and_score_completions``: the oracle reads those lines from
  the installed file (file, line range and release pinned below, and their SHA-256 asserted, so a changed file fails
  instead of testing something else), dedents them and runs them on our tensors, with ``self`` standing for the
  trainer: its four settings, a one-process ``accelerator.gather`` and the metrics dict it appends to.
* OpenRLHF's ``PolicyLoss`` (``openrlhf/models/loss.py``) and AReaL's ``apply_rejection_sampling`` and
  ``ppo_actor_loss_fn`` (``areal/utils/functional/functional.py``, config ``areal/api/cli_args.py``) are functions
  of importable modules: loaded from the installed files, with their package ``__init__`` files (which import the
  whole trainer) skipped, and stubs only for modules unrelated to these functions (deepspeed, uvloop, the attention
  kernels, the data loader, logging).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import textwrap
import types
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

TARGETS = Path(__file__).resolve().parent.parent / ".gl"
RELEASES = {"trl": "1.16.0", "openrlhf": "0.11.0", "areal": "1.0.4"}
"""The release of each framework the oracles run (installed under .gl/NAME-VERSION)."""
AREAL_LINES = ("areal/trainer/ppo/actor.py", 539, 547, "b0957fb8")
AREAL_LOSS_LINES = ("areal/trainer/ppo/actor.py", 515, 547, "a3f0e0a9")
"""AReaL 1.0.4's logging of the whole PPO loss's stats in ``grpo_loss_fn``, rejection sampling's included."""
"""AReaL 1.0.4's logging of rejection sampling, inline in ``grpo_loss_fn`` (file, lines, SHA-256 prefix)."""

TRL_LINES = {
    "ratio": ("trl/trainer/grpo_trainer.py", 2660, 2707, "a43369a9"),
    "metrics": ("trl/trainer/grpo_trainer.py", 2860, 2896, "9ca40ea6"),
    "nan_reductions": ("trl/trainer/utils.py", 1124, 1156, "a3aa6dbf"),
    "coef": ("trl/trainer/grpo_trainer.py", 3083, 3096, "3ae70766"),
    "loss": ("trl/trainer/grpo_trainer.py", 3109, 3138, "d8177830"),
    "loss_metrics": ("trl/trainer/grpo_trainer.py", 3253, 3288, "6f1ac673"),
}
"""TRL 1.16.0's inline code the oracle runs: (file, first line, last line, first 8 hex digits of the SHA-256 of those
lines joined by newlines)."""


def installed(name: str) -> Path | None:
    """``.gl/NAME-VERSION``, or ``None`` when it is not installed."""
    root = TARGETS / f"{name}-{RELEASES[name]}"
    return root if root.is_dir() else None


def require(name: str) -> Any:
    """torch, with ``name``'s release installed; or skip saying what to install (a failure under ``CI=true``)."""
    from missing_components import missing

    try:
        import torch
    except ImportError:
        missing("torch")
    if installed(name) is None:
        missing(f"{name}-{RELEASES[name]}")
    return torch


def pinned_lines(name: str, path: str, first: int, last: int, digest: str) -> str:
    """Lines ``first..last`` of an installed file, dedented; an ``AssertionError`` when they no longer hash the same."""
    root = installed(name)
    assert root is not None
    lines = (root / path).read_text().splitlines()[first - 1 : last]
    text = "\n".join(lines)
    found = hashlib.sha256(text.encode()).hexdigest()[:8]
    assert found == digest, f"TRL's {path}:{first}-{last} changed (sha256 {found}, pinned {digest})"
    return textwrap.dedent(text)


def trl_lines(part: str) -> str:
    """The pinned lines of TRL 1.16.0 (``TRL_LINES``)."""
    return pinned_lines("trl", *TRL_LINES[part])


def trl_metrics(old: Any, rollout: Any, mask: Any, **options: Any) -> tuple[dict[str, float], Any]:
    """TRL 1.16.0's logged ``sampling/*`` values and its ratio tensor for padded (B, T) float32 tensors, by running
    its own lines; ``options``: ``GRPOConfig``'s names (its defaults otherwise)."""
    import math

    import torch

    settings = {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "sequence_mask",
        "vllm_importance_sampling_clip_max": 3.0,
        "vllm_importance_sampling_clip_min": None,
        **options,
    }
    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list)}
    trainer = types.SimpleNamespace(
        use_vllm=True,
        accelerator=types.SimpleNamespace(gather=lambda tensor: tensor.reshape(1)),  # one process
        _metrics=metrics,
        **settings,
    )
    scope: dict[str, Any] = {"torch": torch, "math": math}
    exec(compile(trl_lines("nan_reductions"), "trl/trainer/utils.py", "exec"), scope)
    scope.update(
        self=trainer,
        mode="train",
        device=old.device,
        completion_mask=mask.to(torch.int64),
        tool_mask=None,
        old_per_token_logps=old,
        sampling_per_token_logps=rollout,
    )
    exec(compile(trl_lines("ratio"), "trl/trainer/grpo_trainer.py", "exec"), scope)
    exec(compile(trl_lines("metrics"), "trl/trainer/grpo_trainer.py", "exec"), scope)
    logged = {key: values[-1] for key, values in metrics["train"].items()}
    return logged, scope.get("vllm_importance_sampling_ratio")


def trl_loss_metrics(old: Any, current: Any, mask: Any, advantages: Any, **options: Any) -> dict[str, float]:
    """TRL 1.16.0's logged clip keys of ``_compute_loss`` for padded (B, T) float32 tensors, by running its own
    lines (the ratio ``coef_1``, the loss types, the metrics): ``advantages`` (B,) as GRPOTrainer gives them, or
    (B, T); ``options``: ``GRPOConfig``'s names (its defaults otherwise). The entropy it logs beside them is left
    out (the dump has none: zeros stand in)."""
    import math

    import torch

    settings = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": None, "importance_sampling_level": "token",
                "delta": None, **options}  # fmt: skip
    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list)}
    epsilon_high = settings["epsilon_high"] if settings["epsilon_high"] is not None else settings["epsilon"]
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(gather=lambda tensor: tensor, reduce=lambda tensor, reduction: tensor),
        _metrics=metrics,
        importance_sampling_level=settings["importance_sampling_level"],
        loss_type=settings["loss_type"],
        epsilon_low=settings["epsilon"],
        epsilon_high=epsilon_high,
        beta=0.0,
        args=types.SimpleNamespace(delta=settings["delta"], sapo_temperature_pos=1.0, sapo_temperature_neg=1.05),
    )
    scope: dict[str, Any] = {"torch": torch, "math": math}
    exec(compile(trl_lines("nan_reductions"), "trl/trainer/utils.py", "exec"), scope)
    mask = mask.to(torch.int64)
    scope.update(
        self=trainer,
        mode="train",
        mask=mask,
        per_token_logps=current,
        old_per_token_logps=old,
        advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
        entropies=torch.zeros_like(old),
        inputs={},
    )
    for part in ("coef", "loss", "loss_metrics"):
        exec(compile(trl_lines(part), "trl/trainer/grpo_trainer.py", "exec"), scope)
    return {key: values[-1] for key, values in metrics["train"].items() if key != "entropy"}


# ------------------------------------------------------------------------------------------------ module loading


def _package(name: str, path: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    sys.modules[name] = module


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    for attr, value in attrs.items():
        setattr(module, attr, value)
    sys.modules[name] = module


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def openrlhf_loss() -> Any:
    """OpenRLHF 0.11.0's ``openrlhf.models.loss`` module (``PolicyLoss``), its package ``__init__`` skipped and
    ``deepspeed`` (imported by ``models/utils.py`` for ZeRO-3, unrelated) stubbed."""
    root = installed("openrlhf")
    assert root is not None
    package = root / "openrlhf"
    saved = {name: sys.modules.get(name) for name in ("deepspeed",)}
    _package("openrlhf", package)
    _package("openrlhf.models", package / "models")
    if "deepspeed" not in sys.modules:
        _stub("deepspeed")
    try:
        _load("openrlhf.models.utils", package / "models" / "utils.py")
        return _load("openrlhf.models.loss", package / "models" / "loss.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)


@cache
def areal_functional() -> Any:
    """AReaL 1.0.4's ``areal.utils.functional.functional`` (``apply_rejection_sampling``, ``ppo_actor_loss_fn``)
    with its real ``RejectionSamplingConfig`` (``areal.api.cli_args``) and ``KLEstimator`` (``areal.utils.data``);
    unrelated imports stubbed: ``uvloop``, the FSDP attention helpers, ``einops``, ``torchdata``'s loader, AReaL's
    platform, logging, name-resolve and sequence-packing utilities."""
    root = installed("areal")
    assert root is not None
    package = root / "areal"
    saved = {name: sys.modules.get(name) for name in ("uvloop", "einops", "torchdata", "torchdata.stateful_dataloader")}
    for name in ("areal", "areal.api", "areal.utils", "areal.utils.functional"):
        _package(name, package.joinpath(*name.split(".")[1:]))

    class _Logger:
        def __getattr__(self, _: str) -> Any:
            return lambda *args, **kwargs: None

    stubs: dict[str, dict[str, Any]] = {
        "uvloop": {"install": lambda: None},
        "einops": {"rearrange": None},
        "torchdata": {},
        "torchdata.stateful_dataloader": {"StatefulDataLoader": object},
        "areal.engine": {},
        "areal.engine.fsdp_utils": {},
        "areal.engine.fsdp_utils.attn_impl": {
            "BUILTIN_ATTN_IMPLS": (),
            "get_attn_impl_validation_error": str,
            "is_valid_attn_impl": lambda name: True,
        },
        "areal.infra": {},
        "areal.infra.platforms": {
            "current_platform": types.SimpleNamespace(is_initialized=lambda: False, device_type="cpu")
        },
        "areal.utils.logging": {"getLogger": lambda *args, **kwargs: _Logger()},
        "areal.utils.name_resolve": {},
        "areal.utils.pkg_version": {"is_version_greater_or_equal": lambda *args: False},
        "areal.utils.seqpack": {"PACKING_ALGORITHMS": (), "get_allocate_fn": None},
        "areal.utils.math": {"align": None},
    }
    for name, attrs in stubs.items():
        if name in sys.modules and not name.startswith("areal"):
            continue
        _stub(name, **attrs)
    for name in ("logging", "name_resolve", "pkg_version", "seqpack"):
        setattr(sys.modules["areal.utils"], name, sys.modules[f"areal.utils.{name}"])
    try:
        _load("areal.utils.constants", package / "utils" / "constants.py")
        _load("areal.api.cli_args", package / "api" / "cli_args.py")
        _load("areal.utils.data", package / "utils" / "data.py")
        return _load("areal.utils.functional.functional", package / "utils" / "functional" / "functional.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def openrlhf_metrics(
    old: Any,
    rollout: Any,
    mask: Any,
    *,
    enable: bool = True,
    threshold: tuple[float, float] = (0.5, 5.0),
    kind: str = "tis",
    loss: str = "ppo",
) -> tuple[float | None, Any]:
    """OpenRLHF 0.11.0's ``vllm_kl`` for one micro-batch holding the whole step, and the coefficient its
    ``PolicyLoss`` puts on each token's loss: with the current policy equal to the old one (PPO ratio 1) and every
    advantage a leaf of the graph, the loss is ``-sum(A_t c_t) / N``, so ``c_t = -N dL/dA_t`` (``None`` for gspo,
    whose loss takes no coefficient)."""
    import torch

    module = openrlhf_loss()
    policy = module.PolicyLoss(
        enable_vllm_is_correction=enable,
        vllm_is_truncated_threshold=list(threshold),
        vllm_is_correction_type=kind,
        policy_loss_type=loss,
    )
    advantages = torch.ones_like(old, requires_grad=True)
    value, _, _, vllm_kl = policy(old, old, advantages, action_mask=mask, rollout_log_probs=rollout)
    value.backward()
    coefficients = None if loss != "ppo" else -advantages.grad * mask.sum()
    return (None if vllm_kl is None else float(vllm_kl)), coefficients


def openrlhf_loss_metrics(
    old: Any,
    current: Any,
    rollout: Any,
    mask: Any,
    advantages: Any,
    *,
    enable: bool = False,
    threshold: tuple[float, float] = (0.5, 5.0),
    kind: str = "tis",
    loss: str = "ppo",
    eps: tuple[float, float] = (0.2, 0.2),
    dual_clip: float | None = None,
) -> dict[str, float]:
    """OpenRLHF 0.11.0's ``PolicyLoss`` returns the actor logs (``policy_loss``, the loss it returns, aggregated with
    no ``loss_batch_info``: the step as one micro-batch and one optimizer step; ``ppo_clip_ratio``, ``ppo_kl``,
    ``vllm_kl`` where it returns one) for padded (B, T) float32 tensors holding the whole step as one micro-batch (the actor weights each
    micro-batch's value by its action tokens: the step's token mean), built as ``PPOActor`` builds it (``eps``:
    ``eps_clip_low_high``, the threshold passed only where the correction is on)."""
    module = openrlhf_loss()
    policy = module.PolicyLoss(
        clip_eps_low=eps[0],
        clip_eps_high=eps[1],
        dual_clip=dual_clip,
        policy_loss_type=loss,
        enable_vllm_is_correction=enable,
        vllm_is_truncated_threshold=list(threshold) if enable else None,
        vllm_is_correction_type=kind,
    )
    policy_loss, clip_ratio, ppo_kl, vllm_kl = policy(
        current, old, advantages, action_mask=mask, rollout_log_probs=rollout
    )
    out = {"policy_loss": float(policy_loss), "ppo_clip_ratio": float(clip_ratio), "ppo_kl": float(ppo_kl)}
    return out if vllm_kl is None else {**out, "vllm_kl": float(vllm_kl)}


@cache
def areal_tracker_module() -> Any:
    """AReaL 1.0.4's ``areal.utils.stats_tracker`` (loaded after ``areal_functional``, which stubs its imports)."""
    areal_functional()
    root = installed("areal")
    assert root is not None
    seqpack = sys.modules.get("areal.utils.seqpack")
    if seqpack is not None and not hasattr(seqpack, "flat2d"):
        seqpack.flat2d = lambda lists: [x for sub in lists for x in sub]  # type: ignore[attr-defined]
    return _load("areal.utils.stats_tracker", root / "areal" / "utils" / "stats_tracker.py")


def areal_metrics(
    old: Any, rollout: Any, mask: Any, *, decoupled: bool = True, rejection: dict[str, Any] | None = None
) -> tuple[dict[str, float], Any]:
    """AReaL 1.0.4's exported ``ppo_actor/update/*`` rejection-sampling keys for one micro-batch holding the whole
    step, and the weight on each token's loss: its ``ppo_actor_loss_fn`` on our tensors (proximal = the trainer's
    log-probs in decoupled mode, else the inference engine's, as its actor sets them), then ``grpo_loss_fn``'s own
    logging lines (``AREAL_LINES``) into a fresh ``DistributedStatsTracker`` under its scopes, exported."""
    import torch

    functional = areal_functional()
    config = functional.RejectionSamplingConfig(**(rejection or {}))
    proximal = old if decoupled else rollout
    mask = mask.bool()
    _, stat = functional.ppo_actor_loss_fn(
        logprobs=proximal.clone(),
        proximal_logprobs=proximal,
        old_logprobs=rollout,
        advantages=torch.zeros_like(old),
        eps_clip=0.2,
        loss_mask=mask,
        rejection_sampling=config,
    )
    tracker = areal_tracker_module().DistributedStatsTracker()
    with tracker.scope("ppo_actor"), tracker.scope("update"):
        exec(
            compile(pinned_lines("areal", *AREAL_LINES), AREAL_LINES[0], "exec"),
            {"stat": stat, "stats_tracker": tracker},
        )
        exported = tracker.export()
    exported.pop("ppo_actor/update/rs_filtered_fraction__count", None)
    return exported, stat["behave_imp_weight"]


def areal_loss_metrics(
    old: Any,
    current: Any,
    rollout: Any,
    mask: Any,
    advantages: Any,
    *,
    decoupled: bool = False,
    rejection: dict[str, Any] | None = None,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    level: str = "token",
) -> dict[str, float]:
    """AReaL 1.0.4's exported ``ppo_actor/update/*`` for one micro-batch holding the whole step: its
    ``ppo_actor_loss_fn`` on our padded (B, T) tensors (the current policy ``current``; proximal = the trainer's
    log-probs in decoupled mode, else the inference engine's, as its actor sets them with ``recompute_logprob``
    false), then ``grpo_loss_fn``'s own logging lines (``AREAL_LOSS_LINES``) into a fresh
    ``DistributedStatsTracker``, exported. The entropy it logs is left out (the dump has none: zeros stand in), and
    so are ``n_tokens``, ``n_valid_tokens`` and ``old_logp``, which rcdiag does not give."""
    import torch

    functional = areal_functional()
    config = None if rejection is None else functional.RejectionSamplingConfig(**rejection)
    proximal = old if decoupled else rollout
    mask = mask.bool()
    _, stat = functional.ppo_actor_loss_fn(
        logprobs=current,
        proximal_logprobs=proximal,
        old_logprobs=rollout,
        advantages=advantages,
        eps_clip=eps_clip,
        eps_clip_higher=eps_clip_higher,
        c_clip=c_clip,
        loss_mask=mask,
        rejection_sampling=config,
        importance_sampling_level=level,
    )
    tracker = areal_tracker_module().DistributedStatsTracker()
    scope = {
        "stat": stat,
        "stats_tracker": tracker,
        "infer_token_denominator": lambda data, loss_mask: loss_mask.bool(),
        "input_data": {},
        "loss_mask": mask,
        "rkl_stat": None,
        "logprobs": current,
        "old_logp": rollout,
        "entropy": torch.zeros_like(current),
    }
    with tracker.scope("ppo_actor"), tracker.scope("update"):
        exec(compile(pinned_lines("areal", *AREAL_LOSS_LINES), AREAL_LOSS_LINES[0], "exec"), scope)
        exported = tracker.export()
    left_out = ("n_tokens", "n_valid_tokens", "old_logp/", "entropy/", "rs_filtered_fraction__count")
    return {k: v for k, v in exported.items() if not k.removeprefix("ppo_actor/update/").startswith(left_out)}


if os.environ.get("RCDIAG_PRINT_ORACLE_HASHES"):  # pragma: no cover - how the pins above were taken
    for name, (path, first, last, _) in [
        *(("trl", lines) for lines in TRL_LINES.values()),
        ("areal", AREAL_LINES),
        ("areal", AREAL_LOSS_LINES),
    ]:
        text = "\n".join((TARGETS / f"{name}-{RELEASES[name]}" / path).read_text().splitlines()[first - 1 : last])
        print(name, path, first, hashlib.sha256(text.encode()).hexdigest()[:8])


def token_weights(name: str, options: Any, old: Any, rollout: Any, mask: Any) -> Any:
    """The weight framework ``name``'s own code puts on each token's loss (0 where it drops the token; 1 without a
    correction) for padded (B, T) float32 tensors, ``options`` as ``--as-option`` takes them (resolved by rcdiag's
    option parser into the arguments of the framework's code): verl's ``compute_rollout_correction_and_rejection_mask``
    (its IS weights times the mask its RS leaves), TRL's inline ratio, OpenRLHF's ``PolicyLoss`` coefficients, AReaL's
    ``behave_imp_weight``. float64, (B, T); only the valid tokens (``mask``) mean anything."""
    import torch

    from rcdiag.frameworks.registry import choose

    settings = choose(name, options).settings
    ones = torch.ones(old.shape, dtype=torch.float64)
    if name == "verl":
        from verl_oracle import load_verl

        loaded = load_verl("0.9.0")
        assert loaded is not None
        config = settings.config()  # type: ignore[attr-defined]  # VerlSettings
        weights, kept, _ = loaded[0].compute_rollout_correction_and_rejection_mask(
            old_log_prob=old,
            rollout_log_prob=rollout,
            response_mask=mask.to(torch.float32),
            rollout_is=config.rollout_is,
            rollout_is_threshold=config.rollout_is_threshold,
            rollout_is_batch_normalize=config.rollout_is_batch_normalize,
            rollout_rs=config.rollout_rs,
            rollout_rs_threshold=config.rollout_rs_threshold,
        )
        applied = ones if weights is None else weights.batch["rollout_is_weights"].double()
        return applied * kept.double()
    if name == "trl":
        given = settings.to_dict()
        if not given["vllm_importance_sampling_correction"]:
            return ones
        _, ratio = trl_metrics(old, rollout, mask, **given)
        return (ratio.double() * ones).reshape(old.shape)  # a sequence mode's (B, 1) broadcast over its tokens
    if name == "openrlhf":
        s: Any = settings
        _, coefficients = openrlhf_metrics(
            old, rollout, mask, enable=s.enable, threshold=(s.low, s.high), kind=s.kind, loss=s.loss
        )
        return ones if coefficients is None else coefficients.double()
    assert name == "areal"
    from rcdiag.frameworks.options import option_values

    values, _ = option_values(choose(name).framework, options)  # as given: AReaL's own config resolves them
    rejection = values["actor.rejection_sampling"]
    if rejection is None:
        return ones
    _, weight = areal_metrics(old, rollout, mask, decoupled=values["actor.use_decoupled_loss"], rejection=rejection)
    return weight.double()
