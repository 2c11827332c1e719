"""Run in a subprocess by tests/verl_parity/test_verl_integration.py: verl's REAL rollout-correction step on real
``DataProto`` batches, before and after ``rcdiag.integrations.verl.hook.install``, called the way verl's trainer
calls it (from a method of an object with ``global_steps``).

``python verl_wrapped_step.py VERL_ROOT DUMP_DIR OUT_JSON``: imports verl from VERL_ROOT (a release installed
without its dependencies), checks that the wrapped step returns exactly what the original returns on the same
batch, and writes verl's own metrics per step to OUT_JSON for the test to compare with ``rcdiag analyze``.
"""

from __future__ import annotations

import copy
import json
import sys
import types
import warnings

verl_root, dump_dir, out_json = sys.argv[1:4]
sys.path.insert(0, verl_root)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import rollout_corr_helper as helper  # noqa: E402

from rcdiag.integrations.verl.hook import STEP_FUNCTION, install  # noqa: E402

CONFIG = OmegaConf.create(  # as verl's trainer passes it: config.algorithm.rollout_correction, a DictConfig
    {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
     "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0", "bypass_mode": False}
)  # fmt: skip


def batch(seed: int, *, nan: bool = False) -> DataProto:
    """A training batch as verl's trainer holds it before the step: padded (B, T) float32 log-probs, an int64
    mask (a slice of the attention mask), the response token ids, the rollout temperature in meta_info."""
    rng = np.random.default_rng(seed)
    rows, width = 6, 9
    lengths = rng.integers(1, width + 1, rows)
    mask = torch.tensor(np.arange(width)[None, :] < lengths[:, None], dtype=torch.int64)
    rollout = torch.tensor(-rng.exponential(0.8, (rows, width)), dtype=torch.float32)
    old = (rollout + torch.tensor(rng.normal(0, 0.3, (rows, width)), dtype=torch.float32)).clamp(max=0.0)
    if nan:
        old[0, 0] = float("nan")
    responses = torch.tensor(rng.integers(0, 150_000, (rows, width)), dtype=torch.int64)
    return DataProto.from_dict(
        tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask, "responses": responses},
        meta_info={"temperature": 0.7},
    )


class Trainer:
    """Stands for verl's RayPPOTrainer: its step calls the helper by module attribute, at call time."""

    def __init__(self, step: int) -> None:
        self.global_steps = step

    def fit_step(self, data: DataProto) -> tuple[DataProto, dict]:
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        return compute_rollout_correction_and_add_to_batch(data, CONFIG)


def same(a: DataProto, b: DataProto) -> None:
    assert sorted(a.batch.keys()) == sorted(b.batch.keys()), (a.batch.keys(), b.batch.keys())
    for key in a.batch.keys():  # noqa: SIM118 (a TensorDict)
        assert a.batch[key].dtype == b.batch[key].dtype, key
        assert torch.equal(a.batch[key], b.batch[key]) or (
            torch.isnan(a.batch[key]).any() and torch.allclose(a.batch[key], b.batch[key], equal_nan=True)
        ), key
    assert a.meta_info == b.meta_info
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()


def metrics_equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), (key, a[key], b[key])


original = getattr(helper, STEP_FUNCTION)
early = types.ModuleType("verl.imported_by_name")  # a verl module that imported the step by name before install
early.compute_rollout_correction_and_add_to_batch = original
sys.modules[early.__name__] = early

wrapped = install(dump_dir)
assert getattr(helper, STEP_FUNCTION) is wrapped and wrapped is not original
assert early.compute_rollout_correction_and_add_to_batch is wrapped
assert install(dump_dir) is wrapped  # idempotent: no wrapper around the wrapper

verl_metrics = {}
for step, seed in ((7, 1), (8, 2)):
    data = batch(seed)
    before = copy.deepcopy(data)
    want_batch, want_metrics = original(copy.deepcopy(data), CONFIG)
    got_batch, got_metrics = Trainer(step).fit_step(data)
    same(got_batch, want_batch)
    metrics_equal(got_metrics, want_metrics)
    assert "rollout_is_weights" in got_batch.batch.keys()  # noqa: SIM118
    verl_metrics[step] = got_metrics
    assert torch.equal(before.batch["old_log_probs"], data.batch["old_log_probs"])

# A step the writer refuses (NaN at a valid position) is a notice; verl's step still runs and returns the same.
data = batch(3, nan=True)
want_batch, want_metrics = original(copy.deepcopy(data), CONFIG)
with warnings.catch_warnings(record=True) as caught:
    got_batch, got_metrics = Trainer(9).fit_step(data)
same(got_batch, want_batch)
metrics_equal(got_metrics, want_metrics)
notices = [str(w.message) for w in caught]

expected_ids = {
    step: [row[: int(np.flatnonzero(m)[-1]) + 1].tolist() for row, m in zip(
        batch(seed).batch["responses"].numpy(), batch(seed).batch["response_mask"].numpy(), strict=True)]
    for step, seed in ((7, 1), (8, 2))
}  # fmt: skip
with open(out_json, "w") as handle:
    json.dump({"metrics": verl_metrics, "notices": notices, "token_ids": expected_ids}, handle)
