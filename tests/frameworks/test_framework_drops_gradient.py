"""``framework_drops_gradient``: under ``--as NAME``, NAME's own correction taking away most of the gradient.

Fires on the real model's int4 rollouts under TRL's default sequence_mask (the weight collapses), is quiet on every
clean scenario under each framework's defaults, holds a value exactly on its bound (a dump whose weight mean is
0.5 by hand), and reaches the CLI's text and JSON only under ``--as``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from shape_dumps import defect_dump, dump

import rcdiag
from rcdiag.catalogue.findings import Code
from rcdiag.cli import main
from rcdiag.frameworks.gradient import ESS_FLOOR, WEIGHT_MEAN_MIN, ZEROED_MAX, failed_bounds
from rcdiag.frameworks.registry import FRAMEWORKS, choose

CODE = Code.FRAMEWORK_DROPS_GRADIENT
INT4 = str(ROOT / "sample_data" / "quantized_4bit.parquet")
CLEAN = [("clean_fp32", 0), ("bf16", 0), ("bf16", 1), ("bf16", 2), ("kv_fp8", 0), ("kv_fp8", 1), ("stale", 0)]
RIDING = [name for name in FRAMEWORKS if name != "verl"]  # --as verl adds no section: verl's own findings judge it


def _codes(report: rcdiag.Report) -> set[str]:
    return {f.code for f in report.findings}


def _path(scenario: str, seed: int) -> Path:
    return defect_dump(scenario, seed) if scenario in ("kv_fp8", "stale") else dump(scenario, seed)


def test_the_bounds_are_inclusive_and_each_fails_alone() -> None:
    assert (WEIGHT_MEAN_MIN, ZEROED_MAX, ESS_FLOOR) == (0.5, 0.5, 0.3)
    assert failed_bounds(0.5, 0.5, 0.3) == [] and failed_bounds(None, None, None) == []
    assert len(failed_bounds(math.nextafter(0.5, 0), 0.0, 1.0)) == 1
    assert len(failed_bounds(1.0, math.nextafter(0.5, 1), 1.0)) == 1
    assert len(failed_bounds(1.0, 0.0, math.nextafter(0.3, 0))) == 1


def _one_token_rows(path: Path, rollout: list[float]) -> Path:
    """Responses of one token each, old log-prob -0.1, at these rollout log-probs."""
    n = len(rollout)
    table = pa.table(
        {
            "old_log_prob": [[-0.1]] * n,
            "rollout_log_prob": [[value] for value in rollout],
            "response_mask": [[1]] * n,
        }
    )
    pq.write_table(table, path)
    return path


def test_a_weight_mean_exactly_on_the_bound_does_not_fire(tmp_path: Path) -> None:
    # TRL's sequence_mask: a one-token response's weight is exp(old - rollout), 0 outside [0, 3]. One response at
    # ratio 1, one at exp(4.9) > 3: weights [1, 0], mean 0.5, zeroed 0.5, ESS 1 / (2 * 1) = 0.5: on the bounds.
    on = rcdiag.analyze(_one_token_rows(tmp_path / "on.parquet", [-0.1, -5.0]), framework="trl")
    extras = on.sections["framework"].pooled.extras
    assert extras["rcdiag/trl/weight_mean"] == 0.5 and extras["rcdiag/trl/zeroed_fraction"] == 0.5
    assert extras["rcdiag/trl/ess"] == 0.5 and CODE not in _codes(on)
    # One more masked response: weights [1, 0, 0], mean 1/3 < 0.5, 2/3 zeroed, ESS 1/3: fires.
    off = rcdiag.analyze(_one_token_rows(tmp_path / "off.parquet", [-0.1, -5.0, -5.0]), framework="trl")
    found = next(f for f in off.findings if f.code == CODE)
    assert found.value == pytest.approx(1 / 3) and found.threshold == 0.5
    assert "weight mean 0.333 < 0.5" in found.message and "66.7% of the tokens zeroed > 50%" in found.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trl_default_sequence_mask_collapses_on_int4(seed: int) -> None:
    report = rcdiag.analyze(_path("int4", seed), framework="trl")
    found = next(f for f in report.findings if f.code == CODE)
    assert "vllm_importance_sampling_mode=sequence_mask" in found.message
    assert "vllm_importance_sampling_clip_max=3.0" in found.message and "(--as trl)" in found.message
    weights = report.sections["framework"].pooled.extras
    assert weights["rcdiag/trl/weight_mean"] < 0.2 and weights["rcdiag/trl/ess"] < ESS_FLOOR
    # the verdict names it, and what it prescribes in TRL's options does not itself trip the finding
    assert any(CODE in step for step in report.verdict.next_steps)
    spoken = report.verdict.recommendation.framework if report.verdict.recommendation else None
    assert spoken is not None and spoken.options["vllm_importance_sampling_mode"] == "token_truncate"
    effect = spoken.effect
    assert effect is not None and failed_bounds(effect.weight_mean, effect.tokens_zeroed, effect.ess) == []


def test_no_false_alarm_on_clean_scenarios_under_every_framework_default() -> None:
    fired = [
        (scenario, seed, name)
        for scenario, seed in CLEAN
        for name in RIDING
        if CODE in _codes(rcdiag.analyze(_path(scenario, seed), framework=choose(name, {})))
    ]
    assert fired == [], f"false alarms: {len(fired)} of {len(CLEAN) * len(RIDING)}: {fired}"


def test_a_setting_that_masks_most_responses_fires_in_that_frameworks_words(tmp_path: Path) -> None:
    # long responses, each token 0.05 nat more likely under the rollout: the sequence ratio is ~exp(-10)
    rng = np.random.default_rng(0)
    n, length = 64, 200
    old = -np.abs(rng.normal(1.0, 0.3, (n, length)))
    rollout = np.minimum(old + rng.normal(0.05, 0.05, (n, length)), 0.0)  # ratio ~ exp(-0.05) a token
    table = pa.table(
        {"old_log_prob": list(old), "rollout_log_prob": list(rollout), "response_mask": [[1] * length] * n}
    )
    path = tmp_path / "long.parquet"
    pq.write_table(table, path)
    report = rcdiag.analyze(path, framework="trl", framework_options={"vllm_importance_sampling_mode": "sequence_mask"})
    assert CODE in _codes(report)
    token = rcdiag.analyze(path, framework="trl", framework_options={"vllm_importance_sampling_mode": "token_truncate"})
    assert CODE not in _codes(token)


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, _ = capsys.readouterr()
    return int(exit_.value.code or 0), out


def test_cli_text_and_json_only_under_as(capsys: pytest.CaptureFixture) -> None:
    code, out = _cli(capsys, "analyze", INT4, "--as", "trl", "--format", "json", "-q")
    found = [f for f in json.loads(out)["findings"] if f["code"] == CODE]
    assert code == 0 and len(found) == 1
    # hand-checkable from the sample's own readings: TRL's sequence_mask leaves 0.185 of the weight
    assert found[0]["metric"] == "rcdiag/trl/weight_mean" and found[0]["value"] == pytest.approx(0.1852, abs=1e-4)
    assert "TRL 1.16.0's vllm_importance_sampling_mode=sequence_mask" in found[0]["message"]
    code, out = _cli(capsys, "analyze", INT4, "--as", "trl")
    assert code == 0 and f"WARNING [{CODE}]" in out and f"the configured correction: {CODE}" in out
    code, out = _cli(capsys, "analyze", INT4, "--format", "json", "-q")
    assert code == 0 and all(f["code"] != CODE for f in json.loads(out)["findings"])
