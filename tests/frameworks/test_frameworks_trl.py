"""``rcdiag analyze --as trl`` against TRL 1.16.0's own lines (tests/framework_oracles.py), on real-model dumps and
synthetic ones with padding, empty rows and long responses: per step and pooled, under TRL's defaults and three other
settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_cases import all_rows, check_readings, close, dump_rows, padded, readings, synthetic_dump
from framework_oracles import require, trl_metrics

import rcdiag

SETTINGS = (
    {},
    {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 1.05},
    {
        "vllm_importance_sampling_mode": "token_mask",
        "vllm_importance_sampling_clip_min": 0.9,
        "vllm_importance_sampling_clip_max": 1.1,
    },
    {"vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_clip_min": 0.5},
    {"vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 1.2},
)


def _dumps(tmp_path: Path) -> list[Path]:
    from shape_dumps import dump

    return [dump("bf16", 0), dump("int4", 1), synthetic_dump(tmp_path, 0), synthetic_dump(tmp_path, 1, scale=0.3)]


def _readings(ratio, old, rollout, mask, settings) -> dict:
    """rcdiag's readings by brute force from TRL's ratio tensor (per token, or per completion broadcast over its
    tokens); a truncation's moved ratios found against the unclamped ratio computed as TRL's lines compute it."""
    import torch

    weights = ratio.expand_as(mask) if ratio.shape[-1] == 1 else ratio
    mode = settings.get("vllm_importance_sampling_mode", "sequence_mask")
    truncated = None
    if mode.endswith("truncate"):
        d = torch.nan_to_num((old - rollout) * mask)
        raw = torch.exp(d.sum(-1, keepdim=True)) if mode.startswith("sequence") else torch.exp(d)
        truncated = (weights != raw.expand_as(mask)) & ~torch.isnan(raw.expand_as(mask))
    return readings(weights, mask, truncated)


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: o.get("vllm_importance_sampling_mode", "defaults"))
def test_trl_matches_its_own_code(options: dict, tmp_path: Path) -> None:
    require("trl")
    for path in _dumps(tmp_path):
        report = rcdiag.analyze(path, framework="trl", framework_options=options)
        steps = dump_rows(path)
        views = [(step.metrics, step.extras, steps[step.step]) for step in report.steps]
        views.append((report.metrics, report.extras, all_rows(steps)))
        for metrics, extras, rows in views:
            old, rollout, mask = padded(rows)
            logged, ratio = trl_metrics(old, rollout, mask, **options)
            assert list(logged) == [k for k in metrics if k.startswith("sampling/")]
            for key, value in logged.items():
                assert close(metrics[key], value), (path.name, options, key, metrics[key], value)
            check_readings("trl", extras, _readings(ratio, old, rollout, mask, options), (path.name, options))


def test_trl_settings_change_what_it_logs(tmp_path: Path) -> None:
    """The settings tested above are not all the same computation: the synthetic outliers trip each bound."""
    path = synthetic_dump(tmp_path, 1, scale=0.3)
    means = {
        str(o): rcdiag.analyze(path, framework="trl", framework_options=o).metrics[
            "sampling/importance_sampling_ratio/mean"
        ]
        for o in SETTINGS
    }
    assert len(set(means.values())) == len(SETTINGS)
    zeroed = rcdiag.analyze(path, framework="trl", framework_options=SETTINGS[2]).extras["rcdiag/trl/zeroed_fraction"]
    assert zeroed is not None and zeroed > 0.01
