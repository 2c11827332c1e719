"""NeMo-RL's own code on the tests' dumps -> tests/harness/expected/nemo-rl.json (tests/harness/common.py says why).

    PYTHONPATH=$PWD python tests/harness/nemo_rl_expected.py /path/to/NeMo-RL   # a checkout at COMMIT

Runs, from that checkout, on each view as one global batch of one GRPO step, in one micro-batch:
``compute_and_apply_seq_logprob_error_masking`` (``grpo.py``, exec'd from its lines), the global counts of the
policy worker (``models/automodel/data.py``, exec'd), then ``ClippedPGLossFn`` with its ``ClippedPGLossConfig``
(``loss_functions.py``; the config's defaults are the example config's, ``grpo_math_1B.yaml``), with
``masked_mean`` and ``calculate_kl`` exec'd from ``algorithms/utils.py``, and the trainer's aggregation of a
metric over micro-batches (``grpo.py``, ``np.sum``). The current policy's log-probs are the old ones (advantages 0:
the loss keys are not compared); the data tensors get the leading position NeMo-RL's ``[:, 1:]`` drops. Stubbed,
as unrelated: the cross-tokenizer distillation utilities, the distributed model utilities and DTensor helpers
``loss_functions.py`` imports for other losses, and ``BatchedDataDict`` (a dict here).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.common import checkout, lines_of, load_module, package, pinned, run, stub, weights_of

REPOSITORY = "https://github.com/NVIDIA-NeMo/RL"
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
LOSS = "nemo_rl/algorithms/loss/loss_functions.py"
INTERFACES = "nemo_rl/algorithms/loss/interfaces.py"
KL = ("nemo_rl/algorithms/utils.py", 42, 101)
MEAN = ("nemo_rl/algorithms/utils.py", 212, 224)
SEQ_ERROR = ("nemo_rl/algorithms/grpo.py", 2513, 2640)
COUNTS = ("nemo_rl/models/automodel/data.py", 409, 416)
AGGREGATE = ("nemo_rl/algorithms/grpo.py", 3469, 3493)
CONFIG = "examples/configs/grpo_math_1B.yaml"
KEYS = (
    "token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error", "sampling_importance_ratio",
    "num_valid_samples", "is_oob_ratio",
)  # fmt: skip
SEQ_KEYS = (
    "max_seq_mult_prob_error", "mean_seq_mult_prob_error", "min_seq_mult_prob_error",
    "max_seq_mult_prob_error_after_mask", "mean_seq_mult_prob_error_after_mask",
    "min_seq_mult_prob_error_after_mask", "num_masked_seqs_by_logprob_error",
)  # fmt: skip
C = "loss_fn."
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tis": {f"{C}use_importance_sampling_correction": True, f"{C}truncated_importance_sampling_type": "tis",
            f"{C}truncated_importance_sampling_ratio": 1.05},
    "icepop_k1": {f"{C}use_importance_sampling_correction": True, f"{C}truncated_importance_sampling_type": "icepop",
                  f"{C}truncated_importance_sampling_ratio": 1.1, f"{C}truncated_importance_sampling_ratio_min": 0.9,
                  f"{C}reference_policy_kl_type": "k1"},
    "seq_mask_tis_threshold": {f"{C}use_importance_sampling_correction": True,
                               f"{C}truncated_importance_sampling_type": "seq-mask-tis",
                               f"{C}truncated_importance_sampling_ratio": 1.002,
                               f"{C}truncated_importance_sampling_ratio_min": 0.999,
                               "grpo.seq_logprob_error_threshold": 1.02},
    "sequence_tis_k2": {f"{C}use_importance_sampling_correction": True, f"{C}sequence_level_importance_ratios": True,
                        f"{C}token_level_loss": False, f"{C}truncated_importance_sampling_type": "tis",
                        f"{C}truncated_importance_sampling_ratio": 2.0, f"{C}truncated_importance_sampling_ratio_min": 0.5,
                        f"{C}reference_policy_kl_type": "k2"},
}  # fmt: skip


def _load(root: Path) -> Any:
    """NeMo-RL's loss module, from the checkout."""
    for name in ("nemo_rl", "nemo_rl.algorithms", "nemo_rl.algorithms.loss"):
        package(name, root.joinpath(*name.split(".")))
    utils = types.ModuleType("nemo_rl.algorithms.utils")  # only calculate_kl and masked_mean, from their lines
    utils.__dict__.update({"torch": __import__("torch"), "Optional": __import__("typing").Optional})
    for part in (KL, MEAN):
        exec(compile(lines_of(root, *part), part[0], "exec"), utils.__dict__)
    sys.modules[utils.__name__] = utils
    stub("nemo_rl.distributed")
    stub("nemo_rl.distributed.batched_data_dict", BatchedDataDict=dict)
    names = ("DistributedCrossEntropy", "cp_shift_next", "group_all_reduce_sum", "vocab_parallel_full_log_softmax",
             "vocab_parallel_gather_columns", "vocab_parallel_log_softmax")  # fmt: skip
    stub("nemo_rl.distributed.model_utils", **dict.fromkeys(names))
    stub("nemo_rl.algorithms.x_token")
    names = ("LocalizedAlignment", "build_exact_token_map", "ce_label_mask", "chunk_average_log_probs",
             "get_sparse_projection_matrix", "next_token_accuracy", "project_student_to_teacher_vocab",
             "select_teacher_topk_indices", "slice_sparse_projection_cols", "student_next_token_ce",
             "valid_chunk_mask")  # fmt: skip
    stub("nemo_rl.algorithms.x_token.loss_utils", **dict.fromkeys(names))
    stub("nemo_rl.models")
    stub("nemo_rl.models.dtensor")
    stub("nemo_rl.models.dtensor.parallelize", to_local_if_dtensor=None)
    load_module("nemo_rl.algorithms.loss.interfaces", root / INTERFACES)
    return load_module("nemo_rl.algorithms.loss.loss_functions", root / LOSS)


def main() -> None:
    root = checkout(__doc__, COMMIT)
    import numpy as np
    import torch
    import yaml

    loss = _load(root)
    example = yaml.safe_load((root / CONFIG).read_text())
    grpo: dict[str, Any] = {"torch": torch, "Optional": __import__("typing").Optional, "BatchedDataDict": dict}
    exec(compile(lines_of(root, *SEQ_ERROR), SEQ_ERROR[0], "exec"), grpo)
    counts = compile(lines_of(root, *COUNTS), COUNTS[0], "exec")
    aggregate = compile(lines_of(root, *AGGREGATE), AGGREGATE[0], "exec")

    def oracle(options: Mapping[str, Any], old: Any, rollout: Any, mask: Any, rows: Any) -> tuple[dict, dict]:
        config = {**example["loss_fn"], **{k[len(C) :]: v for k, v in options.items() if k.startswith(C)}}
        threshold = options.get("grpo.seq_logprob_error_threshold", example["grpo"]["seq_logprob_error_threshold"])
        lead = torch.zeros(old.shape[0], 1)
        data = {
            "token_mask": torch.cat([lead, mask.float()], dim=1),
            "sample_mask": torch.ones(old.shape[0]),
            "advantages": torch.zeros(old.shape[0], old.shape[1] + 1),
            "prev_logprobs": torch.cat([lead, old], dim=1),
            "generation_logprobs": torch.cat([lead, rollout], dim=1),
            "reference_policy_logprobs": torch.cat([lead, old], dim=1),
        }
        seq = grpo["compute_and_apply_seq_logprob_error_masking"](data, torch.zeros(old.shape[0]), threshold)
        seq["num_masked_seqs_by_logprob_error"] = seq.pop("num_masked_seqs")  # grpo.py:3281-3284
        scope = {"torch": torch, "batch": data}
        exec(counts, scope)
        loss_fn = loss.ClippedPGLossFn(loss.ClippedPGLossConfig(**config))
        _, metrics = loss_fn(old.clone(), data, scope["local_valid_seqs"], scope["local_valid_toks"])
        metrics = {k: [v] for k, v in metrics.items()}  # one micro-batch: the lists grpo.py reduces
        exec(aggregate, {"metrics": metrics, "np": np})
        logged = {f"train/{k}": metrics[k] for k in KEYS if k in metrics}
        logged.update({f"train/{k}": seq[k] for k in SEQ_KEYS})
        return logged, weights_of(_applied(loss_fn, old, data, scope), mask)

    def _applied(loss_fn: Any, old: Any, data: dict, scope: dict) -> Any:
        """The weight on each token's loss: with advantages a leaf and the current policy the old one, the
        token-level loss is -sum(w_t * A_t * mask_t) / N (the PPO ratio 1, unclipped), so w_t = -N dL/dA_t; for
        the sequence-level loss, -sum_i (sum_t w A mask / n_i) / S gives w_t = -S n_i dL/dA_t."""
        advantages = data["advantages"].clone().requires_grad_(True)
        value, _ = loss_fn(old.clone(), {**data, "advantages": advantages}, scope["local_valid_seqs"],
                           scope["local_valid_toks"])  # fmt: skip
        value.backward()
        grad = advantages.grad[:, 1:]
        keep = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
        if loss_fn.loss_type.name == "TOKEN_LEVEL":
            scale = scope["local_valid_toks"]
        else:
            scale = scope["local_valid_seqs"] * keep.sum(dim=-1, keepdim=True).clamp(min=1)
        return -grad * scale * keep

    run(
        "nemo-rl",
        repository=REPOSITORY,
        commit=COMMIT,
        ran=[
            pinned(root, LOSS),
            pinned(root, INTERFACES),
            pinned(root, *KL),
            pinned(root, *MEAN),
            pinned(root, *SEQ_ERROR),
            pinned(root, *COUNTS),
            pinned(root, *AGGREGATE),
            pinned(root, CONFIG),
        ],
        settings=SETTINGS,
        oracle=oracle,
        notes=(
            "each view is one global batch of one GRPO step in one micro-batch; every row a sample (sample_mask 1)",
            "weights: the coefficient ClippedPGLossFn puts on each token's loss, from its gradient with respect to "
            "the advantages (current policy = old: the PPO ratio is 1 and unclipped)",
        ),
    )


if __name__ == "__main__":
    main()
