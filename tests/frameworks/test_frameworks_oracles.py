"""``rcdiag analyze --as openrlhf`` and ``--as areal`` against OpenRLHF 0.11.0's ``PolicyLoss`` and AReaL 1.0.4's
``ppo_actor_loss_fn`` with its own logging lines (tests/framework_oracles.py), on real-model dumps and synthetic
ones with padding, empty and fully masked rows and long responses: per step and pooled, under each framework's
defaults and several other settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_cases import all_rows, check_readings, close, dump_rows, padded, readings, synthetic_dump
from framework_oracles import areal_metrics, openrlhf_metrics, require

import rcdiag


def _dumps(tmp_path: Path) -> list[Path]:
    from shape_dumps import dump

    return [dump("bf16", 0), dump("int4", 1), synthetic_dump(tmp_path, 0), synthetic_dump(tmp_path, 1, scale=0.3)]


def _views(report: rcdiag.Report, path: Path):
    steps = dump_rows(path)
    views = [(step.metrics, step.extras, steps[step.step]) for step in report.steps]
    return [*views, (report.metrics, report.extras, all_rows(steps))]


OPENRLHF = (
    {},
    {"algo.advantage.is_correction_enable": True},
    {
        "algo.advantage.is_correction_enable": True,
        "algo.advantage.is_correction_type": "icepop",
        "algo.advantage.is_correction_threshold": [0.9, 1.1],
    },
    {
        "algo.advantage.is_correction_enable": True,
        "algo.advantage.is_correction_type": "seq-mask-tis",
        "algo.advantage.is_correction_threshold": [0.99, 1.01],
    },
    {"algo.advantage.is_correction_enable": True, "actor.policy_loss_type": "gspo"},
)


@pytest.mark.parametrize("options", OPENRLHF, ids=["defaults", "tis", "icepop", "seq-mask-tis", "gspo"])
def test_openrlhf_matches_its_own_code(options: dict, tmp_path: Path) -> None:
    torch = require("openrlhf")
    enable = options.get("algo.advantage.is_correction_enable", False)
    kwargs = {
        "threshold": tuple(options.get("algo.advantage.is_correction_threshold", (0.5, 5.0))),
        "kind": options.get("algo.advantage.is_correction_type", "tis"),
        "loss": options.get("actor.policy_loss_type", "ppo"),
    }
    for path in _dumps(tmp_path):
        report = rcdiag.analyze(path, framework="openrlhf", framework_options=options)
        for metrics, extras, rows in _views(report, path):
            old, rollout, mask = padded(rows)
            vllm_kl, coefficients = openrlhf_metrics(old, rollout, mask, enable=enable, **kwargs)
            if vllm_kl is None:
                assert "vllm_kl" not in metrics and "rcdiag/openrlhf/weight_mean" not in extras
                continue
            assert close(metrics["vllm_kl"], vllm_kl, rel=1e-5, abs_=1e-8), (path.name, metrics["vllm_kl"], vllm_kl)
            truncated = None
            if kwargs["kind"] == "tis":  # the clamp moved the coefficient off the raw ratio (a gradient: to rounding)
                truncated = ~torch.isclose(
                    coefficients.double(), torch.exp(old - rollout).double(), rtol=1e-5, atol=0.0
                )
            check_readings("openrlhf", extras, readings(coefficients, mask, truncated), (path.name, options))


AREAL = (
    {},
    {"use_decoupled_loss": True, "rejection_sampling": {"upper": 1.2, "lower": 0.8}},
    {"use_decoupled_loss": True, "rejection_sampling": {"action": "clamp", "upper": 1.05}},
    {"use_decoupled_loss": True, "rejection_sampling": {"level": "sequence", "upper": 1.02, "lower": 0.98}},
    {
        "use_decoupled_loss": True,
        "rejection_sampling": {"level": "sequence", "agg": "max", "metric": "kl_k3", "upper": 0.02},
    },
    {
        "use_decoupled_loss": True,
        "rejection_sampling": {"level": "sequence", "agg": "sum", "action": "clamp", "upper": 1.5},
    },
    {"use_decoupled_loss": True, "rejection_sampling": {"metric": "kl_k1", "upper": 0.05, "lower": -0.05}},
    {"rejection_sampling": {"metric": "kl_k2", "upper": 0.001}},
)


@pytest.mark.parametrize(
    "options", AREAL, ids=["defaults", "token", "clamp", "seq", "seq-max-k3", "seq-sum-clamp", "k1", "coupled"]
)
def test_areal_matches_its_own_code(options: dict, tmp_path: Path) -> None:
    require("areal")
    rejection = options.get("rejection_sampling")
    for path in _dumps(tmp_path):
        report = rcdiag.analyze(path, framework="areal", framework_options=options)
        for metrics, extras, rows in _views(report, path):
            ours = [k for k in metrics if k.startswith("ppo_actor/")]
            if rejection is None:
                assert not ours and "rcdiag/areal/weight_mean" not in extras
                continue
            old, rollout, mask = padded(rows)
            logged, weights = areal_metrics(
                old, rollout, mask, decoupled=options.get("use_decoupled_loss", False), rejection=rejection
            )
            assert [k for k in ours if metrics[k] is not None] == list(logged), (path.name, ours, list(logged))
            for key, value in logged.items():
                assert close(metrics[key], value, rel=1e-5, abs_=1e-7), (path.name, options, key, metrics[key], value)
            check_readings("areal", extras, readings(weights, mask, _areal_clamped(old, rollout, mask, rejection, weights)),
                           (path.name, options))  # fmt: skip


def _areal_clamped(old, rollout, mask, rejection, weights):
    """Where AReaL's clamp moved the weight off its unclamped value (exp(lr) per token; a response's geometric mean
    at level sequence), computed as its ``apply_rejection_sampling`` computes them; ``None`` for a mask."""
    import torch

    if not rejection or rejection.get("action", "mask") != "clamp":
        return None
    lr = torch.where(mask.bool(), old - rollout, torch.zeros_like(old))
    if rejection.get("level", "token") == "token":
        raw = torch.exp(lr)
    else:
        raw = torch.exp(lr.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)).expand_as(old)
    return weights != raw
