"""SkyRL's own code on the tests' dumps -> tests/harness/expected/skyrl.json (tests/harness/common.py says why).

    PYTHONPATH=$PWD python tests/harness/skyrl_expected.py /path/to/SkyRL   # a checkout at COMMIT

Runs, from that checkout: ``apply_off_policy_correction`` (``off_policy_correction_utils.py``, with its
``safe_exp_delta`` and ``masked_mean`` from ``torch_utils.py``) on each view as one micro-batch, its config class
``OffPolicyCorrectionConfig`` (``skyrl/train/config/config.py``, its defaults) and the trainer's inline
``rollout_train_logprobs_abs_diff`` lines (``skyrl/train/trainer.py``), exec'd with ``self`` standing for the
trainer. On the dumps with the current policy's log-probs (``tests/framework_cases.with_loss_inputs``) also the
worker's ``minibatch_rollout_logprobs_abs_diff_*``: ``compute_minibatch_rollout_logprob_diff_metrics`` and
``reduce_metrics`` (``worker_utils.py``, exec'd from their lines with the key constants; the step one micro-batch,
its current policy padded as the batch), their call's place in the worker's status (``worker.py``) and the
trainer's ``finalize_minibatch_rollout_logprob_diff_std`` (``trainer_utils.py``). Stubbed, as unrelated: ``jaxtyping`` (annotations of other functions of torch_utils) and the two
``skyrl_gym`` environment configs config.py imports. The keys get the prefixes the workers add
(``worker.py:1121-1122``: ``loss_metrics/``; ``trainer.py:1577-1578``: ``policy/``).
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from framework_cases import padded_inputs

from harness.common import checkout, lines_of, load_module, package, pinned, run, weights_of

REPOSITORY = "https://github.com/NovaSky-AI/SkyRL"
COMMIT = "a9564572eb8e91076be43c1bd5e4615e3de17265"
UTILS = "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py"
TORCH_UTILS = "skyrl/backends/skyrl_train/utils/torch_utils.py"
CONFIG = "skyrl/train/config/config.py"
TRAINER = ("skyrl/train/trainer.py", 1383, 1406)
WORKER_UTILS = ("skyrl/backends/skyrl_train/workers/worker_utils.py", 21, 91)
WORKER_CALL = ("skyrl/backends/skyrl_train/workers/worker.py", 1125, 1127)
FINALIZE = ("skyrl/train/utils/trainer_utils.py", 38, 53)
BLOCK = "trainer.algorithm.off_policy_correction"
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "token_tis": {BLOCK: {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.05}},
    "sequence_tis_geo_mask": {
        BLOCK: {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 1.5, "sequence_mask_metric": "geometric"}
    },
    "product_mask_outliers": {
        BLOCK: {
            "sequence_mask_metric": "product",
            "product_mask_low": 0.8,
            "product_mask_high": 1.25,
            "outlier_token_is_threshold_low": 0.1,
            "outlier_token_is_threshold_high": 10.0,
        }
    },
    "token_mask_tis_outlier_high": {
        BLOCK: {
            "tis_ratio_type": "token",
            "token_mask_is_threshold_low": 0.9,
            "token_mask_is_threshold_high": 1.1,
            "outlier_token_is_threshold_high": 20.0,
        }
    },
}


def _load(root: Path) -> tuple[Any, Any]:
    """SkyRL's correction module and its config class, from the checkout."""

    class _Annotation:
        def __class_getitem__(cls, item: Any) -> Any:
            return Any

    jaxtyping = types.ModuleType("jaxtyping")
    jaxtyping.Float = jaxtyping.Integer = _Annotation  # type: ignore[attr-defined]
    sys.modules.setdefault("jaxtyping", jaxtyping)

    @dataclass
    class _EnvConfig:  # skyrl_gym's environment configs: fields of config.py's environment block, unrelated
        pass

    for name, attr in (
        ("skyrl_gym.envs.search.env", "SearchEnvConfig"),
        ("skyrl_gym.envs.sql.env", "Text2SQLEnvConfig"),
    ):
        parts = name.split(".")
        for i in range(1, len(parts)):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        module = types.ModuleType(name)
        setattr(module, attr, _EnvConfig)
        sys.modules[name] = module
    for name in ("skyrl", "skyrl.backends", "skyrl.backends.skyrl_train", "skyrl.backends.skyrl_train.utils",
                 "skyrl.train", "skyrl.train.config"):  # fmt: skip
        package(name, root.joinpath(*name.split(".")))
    load_module("skyrl.backends.skyrl_train.utils.torch_utils", root / TORCH_UTILS)
    utils = load_module("skyrl.backends.skyrl_train.utils.off_policy_correction_utils", root / UTILS)
    config = load_module("skyrl.train.config.config", root / CONFIG)
    return utils, config.OffPolicyCorrectionConfig


def main() -> None:
    root = checkout(__doc__, COMMIT)
    import torch

    utils, config_class = _load(root)
    trainer_code = compile(lines_of(root, *TRAINER), TRAINER[0], "exec")
    worker: dict[str, Any] = {
        "torch": torch,
        "Dict": dict,
        "List": list,
        "Optional": Optional,
        "masked_mean": sys.modules["skyrl.backends.skyrl_train.utils.torch_utils"].masked_mean,
    }
    exec(compile(lines_of(root, *WORKER_UTILS), WORKER_UTILS[0], "exec"), worker)
    worker_call = compile(lines_of(root, *WORKER_CALL), WORKER_CALL[0], "exec")
    finalize: dict[str, Any] = {"math": math, "Dict": dict, **worker}
    exec(compile(lines_of(root, *FINALIZE), FINALIZE[0], "exec"), finalize)

    def minibatch(current: Any, rollout: Any, loss_mask: Any) -> dict[str, float]:
        """The worker's status keys of one micro-batch, reduced over the step's one micro-batch and finalised."""
        scope = {**worker, "status": {}, "action_log_probs": current, "rollout_action_logprobs": rollout,
                 "loss_mask": loss_mask}  # fmt: skip
        exec(worker_call, scope)
        reduced = worker["reduce_metrics"]({k: [v] for k, v in scope["status"].items()})
        finalize["finalize_minibatch_rollout_logprob_diff_std"](reduced)
        return {f"policy/{k}": v for k, v in reduced.items()}

    def oracle(
        options: Mapping[str, Any], old: Any, rollout: Any, mask: Any, rows: Any, inputs: Any = None
    ) -> tuple[dict, dict]:
        config = config_class(**options.get(BLOCK, {}))
        loss_mask = mask.float()
        trainer = types.SimpleNamespace(all_metrics={})
        exec(trainer_code, {"self": trainer, "training_input": {"rollout_logprobs": rollout, "loss_mask": loss_mask},
                            "action_log_probs": old})  # fmt: skip
        loss, kept, metrics = utils.apply_off_policy_correction(torch.ones_like(old), old, rollout, loss_mask, config)
        logged = {**trainer.all_metrics, **{f"policy/loss_metrics/{k}": v for k, v in metrics.items()}}
        if inputs is not None:
            current, _ = padded_inputs(inputs)
            logged.update(minibatch(current, rollout, loss_mask))
        return logged, weights_of(loss.expand_as(old) * kept, mask)

    run(
        "skyrl",
        repository=REPOSITORY,
        commit=COMMIT,
        ran=[
            pinned(root, UTILS),
            pinned(root, TORCH_UTILS, 180, 192),
            pinned(root, CONFIG, 793, 818),
            pinned(root, *TRAINER),
            pinned(root, *WORKER_UTILS),
            pinned(root, *WORKER_CALL),
            pinned(root, *FINALIZE),
        ],
        settings=SETTINGS,
        oracle=oracle,
        with_inputs=True,
        notes=(
            "each view is one micro-batch: the step's rows padded to its longest (pads: log-prob 0, mask 0)",
            "weights: apply_off_policy_correction's corrected loss (of a loss of ones) times its loss mask",
            "minibatch_rollout_logprobs_abs_diff_* on the dumps with the current policy only: the step one "
            "micro-batch of one mini-batch and one epoch, its current log-probs padded as the batch (pads 0)",
        ),
    )


if __name__ == "__main__":
    main()
