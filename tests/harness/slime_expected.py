"""slime's own code on the tests' dumps -> tests/harness/expected/slime.json (tests/harness/common.py says why).

    PYTHONPATH=$PWD python tests/harness/slime_expected.py /path/to/slime   # a checkout at COMMIT

Runs, from that checkout, on each view as one micro-batch of one training step, each row a sample and its own
rollout: ``policy_loss_function``'s TIS block and its metric lines (``loss.py``, exec'd by line range in a scope
holding the batch: ``vanilla_tis_function`` and ``icepop_function`` exec'd from their lines into a module
``slime.backends.megatron_utils.loss`` that ``load_function`` finds, the MIS helper imported from ``examples/``),
``get_sum_of_sample_mean`` (``cp_utils.py``), ``loss_function``'s token count, and ``reduce_train_step_metrics``
(``train_metric_utils.py``) with ``dist.all_reduce`` a no-op (one process, as slime's own tests run it). The
defaults are slime's argparse defaults (read from ``arguments.py``) and mis.yaml's values. Stubbed, as unrelated:
Megatron's ``mpu`` (context parallelism of size 1), ``slime.utils.http_utils``, and the observability and
flops modules ``train_metric_utils`` imports for other functions. The keys get ``model.py:883``'s ``train/``.
On the dumps with the current policy's log-probs (``tests/framework_cases.with_loss_inputs``) the batch's policy
log-probs are theirs and ``ppo_kl`` is ``policy_loss_function``'s own (its lines for a non-GSPO estimator), so the
TIS block's ``ois`` is kept; elsewhere the scope gives the current policy the old log-probs and ``ois`` is dropped.
There, too, a copy of the scope holds the advantages and runs the PPO loss (``compute_policy_loss`` from its lines
in ``ppo_utils.py``, advantage_estimator grpo, the eps flags' defaults and their resolution from ``arguments.py``),
the TIS block again on that loss and the reducer's lines: ``pg_loss``, ``pg_clipfrac`` and ``ppo_kl`` as logged.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.common import checkout, lines_of, load_module, package, pinned, run, stub, weights_of

REPOSITORY = "https://github.com/THUDM/slime"
COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
LOSS = "slime/backends/megatron_utils/loss.py"
TIS_FUNCTIONS = (LOSS, 884, 931)
TIS_BLOCK = (LOSS, 1050, 1092)
REPORTED = (LOSS, 1136, 1163)
NUM_TOKENS = (LOSS, 1317, 1317)
PPO_KL = (LOSS, 1031, 1033)
ADVANTAGES = (LOSS, 964, 964)
PG_LOSS = (LOSS, 1035, 1044)
REDUCED = (LOSS, 1094, 1107)
PPO_UTILS = "slime/utils/ppo_utils.py"
POLICY_LOSS = (PPO_UTILS, 125, 148)
EPS_FLAGS = ("slime/utils/arguments.py", 899, 906)
EPS_HIGH = ("slime/utils/arguments.py", 1876, 1877)
CP_UTILS = "slime/backends/megatron_utils/cp_utils.py"
METRIC_UTILS = "slime/observability/train_metric_utils.py"
MISC = "slime/utils/misc.py"
MIS = "examples/train_infer_mismatch_helper/mis.py"
MIS_YAML = "examples/train_infer_mismatch_helper/mis.yaml"
ARGUMENTS = ("slime/utils/arguments.py", 1027, 1083)
PER_TOKEN_FLAG = ("slime/utils/arguments.py", 879, 879)
MIS_PATH = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
ICEPOP_PATH = "slime.backends.megatron_utils.loss.icepop_function"
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tis": {"use_tis": True, "tis_clip": 1.05, "tis_clip_low": 0.9},
    "icepop_mismatch_only": {
        "get_mismatch_metrics": True,
        "custom_tis_function_path": ICEPOP_PATH,
        "tis_clip": 1.2,
        "tis_clip_low": 0.8,
    },
    "mis_yaml": {"use_tis": True, "custom_tis_function_path": MIS_PATH},
    "mis_seq_mask_per_token": {
        "use_tis": True,
        "custom_tis_function_path": MIS_PATH,
        "calculate_per_token_loss": True,
        "tis_level": "sequence",
        "tis_mode": "mask",
        "tis_lower_bound": 0.5,
        "tis_upper_bound": 2.0,
        "rs_level": "geometric",
        "rs_lower_bound": 0.99,
        "rs_upper_bound": 1.01,
    },
    "mis_geo_clip": {
        "use_tis": True,
        "custom_tis_function_path": MIS_PATH,
        "tis_level": "geometric",
        "tis_mode": "clip",
        "tis_lower_bound": 0.98,
        "tis_upper_bound": 1.02,
        "use_rs": False,
        "tis_batch_normalize": False,
    },
    "mis_metrics_only": {"get_mismatch_metrics": True, "custom_tis_function_path": MIS_PATH},
    "tis_dual_clip": {"use_tis": True, "eps_clip": 0.1, "eps_clip_high": 0.3, "eps_clip_c": 3.0},
}


def argparse_defaults(root: Path) -> dict[str, Any]:
    """The defaults of slime's flags rcdiag takes, read from ``arguments.py`` (store_true flags: False)."""
    text = lines_of(root, *ARGUMENTS)
    defaults: dict[str, Any] = {}
    for flag in ("use-tis", "tis-clip", "tis-clip-low", "get-mismatch-metrics", "custom-tis-function-path"):
        found = re.search(rf'"--{flag}",(.*?)default=([^,\n]+),', text, re.S)
        assert found is not None, flag
        defaults[flag.replace("-", "_")] = eval(found.group(2))  # a literal: True, False, 2.0, 0, None
    assert "store_true" in lines_of(root, *PER_TOKEN_FLAG)
    defaults["calculate_per_token_loss"] = False
    eps = lines_of(root, *EPS_FLAGS)
    for flag in ("eps-clip", "eps-clip-high", "eps-clip-c"):
        found = re.search(rf'"--{flag}",(.*?)default=([^,\n]+),', eps, re.S)
        assert found is not None, flag
        defaults[flag.replace("-", "_")] = eval(found.group(2))  # 0.2, None, None
    return defaults


def resolve_eps_clip_high(root: Path, args: argparse.Namespace) -> None:
    """``arguments.py``'s own lines: no eps_clip_high means eps_clip."""
    exec(compile(lines_of(root, *EPS_HIGH), "arguments.py", "exec"), {"args": args})


def _load(root: Path) -> dict[str, Any]:
    """slime's functions from the checkout: the reducers, the metric reduction, ``load_function``."""
    sys.path.insert(0, str(root))  # examples.train_infer_mismatch_helper.mis, as slime's load_function imports it
    mpu = types.SimpleNamespace(
        get_context_parallel_world_size=lambda: 1,
        get_context_parallel_rank=lambda: 0,
        get_context_parallel_group=lambda: None,
    )
    stub("megatron")
    stub("megatron.core", mpu=mpu)
    for name in ("slime", "slime.utils", "slime.backends", "slime.backends.megatron_utils", "slime.observability"):
        package(name, root.joinpath(*name.split(".")))
    stub("slime.utils.http_utils", is_port_available=None)
    stub("slime.observability.logging_utils")
    stub("slime.observability.metric_utils", compute_pass_rate=None, compute_rollout_step=None)
    stub("slime.observability.timer", Timer=None)
    stub("slime.utils.flops_utils", calculate_fwd_flops=None)
    stub("slime.utils.types", RolloutBatch=dict)
    misc = load_module("slime.utils.misc", root / MISC)
    cp_utils = load_module("slime.backends.megatron_utils.cp_utils", root / CP_UTILS)
    metric_utils = load_module("slime.observability.train_metric_utils", root / METRIC_UTILS)
    loss = types.ModuleType("slime.backends.megatron_utils.loss")  # only the two TIS functions, from their lines
    loss.__dict__.update({"torch": __import__("torch"), "Any": Any})
    exec(compile(lines_of(root, *TIS_FUNCTIONS), LOSS, "exec"), loss.__dict__)
    sys.modules[loss.__name__] = loss
    ppo_utils: dict[str, Any] = {"torch": __import__("torch")}  # compute_policy_loss alone, from its lines
    exec(compile(lines_of(root, *POLICY_LOSS), PPO_UTILS, "exec"), ppo_utils)
    return {"misc": misc, "cp_utils": cp_utils, "metric_utils": metric_utils, "loss": loss, "ppo_utils": ppo_utils}


def main() -> None:
    root = checkout(__doc__, COMMIT)
    import torch
    import yaml

    parts = _load(root)
    base = argparse_defaults(root)
    mis_yaml = yaml.safe_load((root / MIS_YAML).read_text())
    tis_block = compile(lines_of(root, *TIS_BLOCK), LOSS, "exec")
    reported = compile(lines_of(root, *REPORTED), LOSS, "exec")
    num_tokens = compile(lines_of(root, *NUM_TOKENS), LOSS, "exec")
    ppo_kl = compile(lines_of(root, *PPO_KL), LOSS, "exec")
    advantages_line = compile(lines_of(root, *ADVANTAGES), LOSS, "exec")
    pg_loss_lines = compile(lines_of(root, *PG_LOSS), LOSS, "exec")
    reduced_lines = compile(lines_of(root, *REDUCED), LOSS, "exec")

    def oracle(
        options: Mapping[str, Any], old: Any, rollout: Any, mask: Any, rows: Any, inputs: Any = None
    ) -> tuple[dict, dict]:
        values = {**base, **options}
        if values["custom_tis_function_path"] == MIS_PATH:
            values = {**base, **mis_yaml, **options}
            values["use_tis"] = options.get("use_tis", base["use_tis"])  # the flag, not the example's yaml
        args = argparse.Namespace(
            use_rollout_logprobs=False, use_kl_loss=False, use_opsm=False, advantage_estimator="grpo", **values
        )
        resolve_eps_clip_high(root, args)
        old_list = [torch.from_numpy(a) for a, _, _ in rows]
        rollout_list = [torch.from_numpy(b) for _, b, _ in rows]
        masks = [torch.from_numpy(m.astype("int32")) for _, _, m in rows]
        lengths = [len(a) for a, _, _ in rows]
        batch = {
            "log_probs": old_list,
            "rollout_log_probs": rollout_list,
            "loss_masks": masks,
            "rollout_mask_sums": torch.tensor([float(m.sum()) for m in masks], dtype=torch.float32),
        }
        cat = torch.cat(old_list) if old_list else torch.zeros(0)
        zero = torch.zeros(())
        cp = parts["cp_utils"]
        scope: dict[str, Any] = {
            "torch": torch,
            "args": args,
            "batch": batch,
            "total_lengths": lengths,
            "response_lengths": lengths,
            "pg_loss": torch.ones_like(cat),
            "ppo_kl": torch.zeros_like(cat),
            "log_probs": cat,
            "old_log_probs": cat,
            "train_log_probs_for_tis": old_list,
            "sum_of_sample_mean": cp.get_sum_of_sample_mean(
                lengths, lengths, masks, batch["rollout_mask_sums"], args.calculate_per_token_loss
            ),
            "get_sum_of_sample_mean": cp.get_sum_of_sample_mean,
            "load_function": parts["misc"].load_function,
            "vanilla_tis_function": parts["loss"].vanilla_tis_function,
            "loss": zero,
            "entropy_loss": zero,
            "pg_clipfrac": zero,
        }
        policy = None
        if inputs is not None:  # the current policy's log-probs, and ppo_kl = old - current as slime computes it
            scope.update(old_log_probs=old_list, log_probs=[torch.from_numpy(c) for c, _ in inputs])
            exec(ppo_kl, scope)
            # the loss on a copy of the scope: the PPO loss of the advantages, through the same TIS block, reduced
            batch_inputs = {**batch, "advantages": [torch.from_numpy(a) for _, a in inputs]}
            policy = {**scope, "batch": batch_inputs, "compute_cispo_loss": None, **parts["ppo_utils"]}
            exec(advantages_line, policy)
            exec(pg_loss_lines, policy)
        exec(tis_block, scope)
        weight = scope["pg_loss"]
        kept = torch.cat(scope.get("modified_response_masks", masks)) if masks else torch.zeros(0)
        if policy is not None:
            exec(tis_block, policy)
            exec(reduced_lines, policy)
            scope = policy
        exec(reported, scope)
        exec(num_tokens, scope)
        left_out = _NOT_FROM_A_DUMP if inputs is None else _NOT_FROM_A_DUMP[:2]
        log = {k: v for k, v in scope["reported_loss"].items() if k not in left_out}
        values_tensor = torch.tensor(
            [scope["num_tokens"] if args.calculate_per_token_loss else 0, *log.values()]  # loss.py:1355-1366
        )
        dist = parts["metric_utils"].dist
        saved, dist.all_reduce = dist.all_reduce, lambda *a, **k: None
        try:
            reduced = parts["metric_utils"].reduce_train_step_metrics(
                [{"keys": list(log), "values": values_tensor}],
                calculate_per_token_loss=args.calculate_per_token_loss,
                step_global_batch_size=len(rows),
                cp_size=1,
                dp_with_cp_group=None,
            )
        finally:
            dist.all_reduce = saved
        valid = torch.cat(masks).bool() if masks else torch.zeros(0, dtype=torch.bool)
        return {f"train/{k}": v for k, v in reduced.items()}, weights_of((weight * kept)[valid], valid)

    run(
        "slime",
        repository=REPOSITORY,
        commit=COMMIT,
        ran=[
            pinned(root, *TIS_FUNCTIONS),
            pinned(root, *TIS_BLOCK),
            pinned(root, *REPORTED),
            pinned(root, *NUM_TOKENS),
            pinned(root, *PPO_KL),
            pinned(root, CP_UTILS),
            pinned(root, METRIC_UTILS),
            pinned(root, MISC),
            pinned(root, MIS),
            pinned(root, MIS_YAML),
            pinned(root, *ARGUMENTS),
            pinned(root, *PER_TOKEN_FLAG),
            pinned(root, *ADVANTAGES),
            pinned(root, *PG_LOSS),
            pinned(root, *REDUCED),
            pinned(root, *POLICY_LOSS),
            pinned(root, *EPS_FLAGS),
            pinned(root, *EPS_HIGH),
        ],
        settings=SETTINGS,
        oracle=oracle,
        with_inputs=True,
        notes=(
            "each view is one micro-batch of one training step; each row a sample, its own rollout",
            "loss and entropy_loss (the entropies) are not compared; pg_loss, pg_clipfrac, ppo_kl and ois only on "
            "the dumps with a current policy and advantages (compute_policy_loss, advantage_estimator grpo, through "
            "the TIS block and the reducer; elsewhere the scope gives the current policy the old log-probs)",
            "weights: the TIS function's pg_loss (of a loss of ones) times the mask it returns",
        ),
    )


_NOT_FROM_A_DUMP = ("loss", "entropy_loss", "pg_loss", "pg_clipfrac", "ppo_kl", "ois")
"""What the harness does not compare; all but the first two (the whole loss, the entropies) are compared on the dumps
with a current policy and advantages."""


if __name__ == "__main__":
    main()
