"""``rcdiag analyze --as trl`` against TRL 1.16.0's own lines (tests/framework_oracles.py), on real-model dumps and
synthetic ones with padding, empty rows and long responses: per step and pooled, under TRL's defaults and three other
settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_cases import all_rows, close, dump_rows, padded, synthetic_dump
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


def _oracle_weights(ratio, mask, settings):
    """TRL's ratio tensor as the weight on each completion token: (token-weighted mean, zeroed share)."""
    weights = ratio.expand_as(mask) if ratio.shape[-1] == 1 else ratio
    kept = weights[mask]
    return float(kept.double().mean()), float((kept == 0).double().mean())


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
            weight, zeroed = _oracle_weights(ratio, mask, options)
            assert close(extras["rcdiag/trl/weight_mean"], weight, rel=1e-5), (path.name, weight)
            assert extras["rcdiag/trl/zeroed_fraction"] == pytest.approx(zeroed, abs=1e-12)


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
