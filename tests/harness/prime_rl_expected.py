"""prime-rl's own code on the tests' dumps -> tests/harness/expected/prime-rl.json (tests/harness/common.py says why).

    PYTHONPATH=$PWD python tests/harness/prime_rl_expected.py /path/to/prime-rl   # a checkout at COMMIT

Runs, from that checkout, on each view as one packed micro-batch of one step (the trainer's log-probs = the dump's
``old_log_prob``, the inference engine's = ``rollout_log_prob``): ``compute_loss`` with the loss ``setup_rl_loss_fn``
builds from the config classes (``DefaultLossConfig`` / ``IPOLossConfig``, their defaults) of
``prime_rl/trainer/rl/loss.py``; the trainer's inline ``mismatch_kl/all`` lines (``train.py``, exec'd by line
range); ``Tensors.compute_stats``'s statistic lines (``trainer/utils.py``, exec'd per key on the key's gathered
values: the gather across ranks and the move to the GPU are the one-process identity here); and
``filter_rl_trainer_tensor_stats_for_wandb`` (exec'd from its lines), which picks the keys prime-rl logs.
On a dump with advantages (``tests/framework_cases.with_loss_inputs``: per row, or per token) they are the loss's
advantages and every key it logs from them is kept; elsewhere they are zero and the default loss's masks (which
depend on their sign) are not compared, only the IPO loss's per-sample keys and ``mismatch_kl/all``.
Stubbed, as unrelated: ``beartype`` and ``jaxtyping`` (annotations), ``pydantic_config`` (the config loader:
its ``BaseConfig`` is pydantic's ``BaseModel``, extra fields forbidden) and ``prime_rl.utils.utils``
(``import_object``, for custom losses).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.common import checkout, lines_of, load_module, package, pinned, run, stub, weights_of

REPOSITORY = "https://github.com/PrimeIntellect-ai/prime-rl"
COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
LOSS = "src/prime_rl/trainer/rl/loss.py"
CONFIGS = "packages/prime-rl-configs/src/prime_rl/configs/trainer.py"
MISMATCH = ("src/prime_rl/trainer/rl/train.py", 499, 512)
STATS = ("src/prime_rl/trainer/utils.py", 263, 276)
FILTER = ("src/prime_rl/trainer/utils.py", 284, 321)
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ipo": {"loss": {"type": "ipo"}},
    "ipo_0.02": {"loss": {"type": "ipo", "ipo_threshold": 0.02}},
    "ipo_0.5": {"loss": {"type": "ipo", "ipo_threshold": 0.5}},
    "default_0.02_0.05": {"loss": {"dppo_mask_low": 0.02, "dppo_mask_high": 0.05}},
    "default_0.005": {"loss": {"dppo_mask_low": 0.005, "dppo_mask_high": 0.005, "adv_tau": 0.5}},
}
ADVANTAGE_FREE = ("is_masked/", "masked_mismatch_kl/", "unmasked_mismatch_kl/", "mismatch_kl/all/")
"""The keys a dump without advantages can give (the IPO loss's; mismatch_kl's always)."""
KEPT = (*ADVANTAGE_FREE, "is_masked_high/", "is_masked_low/", "masked_advantage_")
"""The keys a dump with advantages gives (the default loss's too); the rest (loss, entropy) need the model."""


def _load(root: Path) -> tuple[Any, Any]:
    """prime-rl's loss module and config module, from the checkout."""
    import pydantic

    class BaseConfig(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

    class _Annotation:
        def __class_getitem__(cls, item: Any) -> Any:
            return Any

    stub("beartype", beartype=lambda f: f)
    stub("jaxtyping", Bool=_Annotation, Float=_Annotation, Int=_Annotation, jaxtyped=lambda **k: lambda f: f)
    stub("pydantic_config", BaseConfig=BaseConfig, cli=None)
    configs = root / "packages/prime-rl-configs/src/prime_rl"
    for name, path in (("prime_rl", root / "src/prime_rl"), ("prime_rl.configs", configs / "configs"),
                       ("prime_rl.trainer", root / "src/prime_rl/trainer"),
                       ("prime_rl.trainer.rl", root / "src/prime_rl/trainer/rl")):  # fmt: skip
        package(name, path)
    sys.modules["prime_rl"].__path__.append(str(configs))  # prime_rl.utils.config lives in the configs package
    package("prime_rl.utils", configs / "utils")
    sys.modules["prime_rl.utils"].__path__.append(str(root / "src/prime_rl/utils"))
    stub("prime_rl.utils.utils", import_object=None)
    config = load_module("prime_rl.configs.trainer", root / CONFIGS)
    return load_module("prime_rl.trainer.rl.loss", root / LOSS), config


def main() -> None:
    root = checkout(__doc__, COMMIT)
    import torch

    loss, config = _load(root)
    mismatch = compile(lines_of(root, *MISMATCH), MISMATCH[0], "exec")
    stats = compile("for key, tensors in gathered.items():\n" + _indent(lines_of(root, *STATS)), STATS[0], "exec")
    filters: dict[str, Any] = {}
    exec(compile(lines_of(root, *FILTER), FILTER[0], "exec"), filters)

    def oracle(
        options: Mapping[str, Any], old: Any, rollout: Any, mask: Any, rows: Any, inputs: Any = None
    ) -> tuple[dict, dict]:
        block = dict(options.get("loss", {}))
        kind = block.pop("type", "default")
        loss_config = (config.IPOLossConfig if kind == "ipo" else config.DefaultLossConfig)(**block)
        lengths = [len(a) for a, _, _ in rows]
        trainer = torch.cat([torch.from_numpy(a) for a, _, _ in rows]).reshape(1, -1)
        inference = torch.cat([torch.from_numpy(b) for _, b, _ in rows]).reshape(1, -1)
        loss_mask = torch.cat([torch.from_numpy(m) for _, _, m in rows]).reshape(1, -1)
        split = [t.squeeze(0).split(lengths) for t in (trainer, inference, loss_mask)]
        if inputs is None:
            advantages = torch.zeros(trainer.shape[1], requires_grad=True)
        else:
            advantages = torch.cat([torch.from_numpy(a) for _, a in inputs]).requires_grad_(True)
        scaled, loss_tensors = loss.compute_loss(
            trainer_logprobs=split[0],
            inference_logprobs=split[1],
            ref_logprobs=None,
            advantages=advantages.split(lengths),
            loss_mask=split[2],
            rl_weights=None,
            ce_weights=None,
            ref_kl_weights=None,
            rl_loss_fn=loss.setup_rl_loss_fn(loss_config),
            rl_scale=1,
            ce_scale=1,
            ref_kl_scale=1,
        )
        tensors: dict[str, list] = defaultdict(list)
        exec(mismatch, {"torch": torch, "tensors": tensors, "rl_weights": None, "ref_kl_weights": None,
                        "loss_mask": loss_mask, "out": {"logprobs": trainer}, "inference_logprobs": inference,
                        "compute_importance_ratio_and_mismatch_kl": loss.compute_importance_ratio_and_mismatch_kl})  # fmt: skip
        for key, value in loss_tensors.items():
            tensors[key].append(value)
        gathered = {key: torch.cat(tensors[key]) for key in sorted(tensors)}
        metrics: dict[str, float] = {}
        exec(stats, {"torch": torch, "gathered": gathered, "metrics": metrics})
        logged = filters["filter_rl_trainer_tensor_stats_for_wandb"](metrics)
        logged = {k: v for k, v in logged.items() if k.startswith(ADVANTAGE_FREE if inputs is None else KEPT)}
        if kind != "ipo" and inputs is None:
            return {k: v for k, v in logged.items() if k.startswith("mismatch_kl/")}, {}
        scaled.backward()  # the loss is -sum(adv_tau * A * keep * ratio) + KL: dL/dA = -adv_tau * keep * ratio
        coefficient = -advantages.grad / loss_config.adv_tau
        return logged, weights_of(coefficient[loss_mask.squeeze(0)], loss_mask[loss_mask])

    run(
        "prime-rl",
        repository=REPOSITORY,
        commit=COMMIT,
        ran=[
            pinned(root, LOSS),
            pinned(root, CONFIGS, 494, 520),
            pinned(root, *MISMATCH),
            pinned(root, *STATS),
            pinned(root, *FILTER),
        ],
        settings=SETTINGS,
        oracle=oracle,
        with_inputs=True,
        notes=(
            "each view is one packed micro-batch of one step, on one rank; on the dumps with loss inputs the "
            "advantages are theirs (per token; a per-row one repeated), elsewhere 0 (the default loss's masks need "
            "their sign: not compared there)",
            "weights (IPO, and the default loss with advantages): the pg term's coefficient keep_mask * importance_ratio, read as -dL/dA / adv_tau from "
            "compute_loss's loss (advantages a leaf of the graph)",
        ),
    )


def _indent(text: str) -> str:
    return "".join("    " + line + "\n" for line in text.splitlines())


if __name__ == "__main__":
    main()
