"""Each finding fires when its condition holds and stays quiet when it does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import padded_chunk, random_batch, rows_with_ratios, run_padded
from severities import checked

import rcdiag
from rcdiag.diagnosis.health import FINDING_CODES

P = "rollout_corr/"


def codes(report: rcdiag.Report) -> set[str]:
    return {f.code for f in checked(report.findings)}


def test_healthy_batch_has_no_findings() -> None:
    old, rollout, mask = random_batch(np.random.default_rng(0), rows=64, width=64, noise=0.02, empty_rows=0)
    for preset in ("decoupled_token_is", "decoupled_seq_is", "decoupled_geo_rs", "decoupled_k3_rs_token_tis"):
        config = {k: v for k, v in rcdiag.preset(preset).to_dict().items() if k.startswith("rollout_")}
        if preset == "decoupled_geo_rs":
            config["rollout_rs_threshold"] = "0.9_1.1"
        assert codes(run_padded(old, rollout, mask, **config)) == set(), preset


def test_is_mean_out_of_range() -> None:
    old, rollout, mask = rows_with_ratios([[0.3] * 4] * 3)
    report = run_padded(old, rollout, mask, rollout_is="token")
    finding = next(f for f in report.findings if f.code == "is_mean_out_of_range")
    assert finding.value == pytest.approx(0.3, rel=1e-6) and finding.threshold == (0.5, 2.0)
    assert finding.severity == "warning" and finding.metric == P + "rollout_is_mean" and finding.steps is None
    old, rollout, mask = rows_with_ratios([[0.6] * 4] * 3)
    assert "is_mean_out_of_range" not in codes(run_padded(old, rollout, mask, rollout_is="token"))


def test_low_ess_and_high_std() -> None:
    old, rollout, mask = rows_with_ratios([[math.exp(3.0)] * 2] + [[1.0] * 2] * 30)
    report = run_padded(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=1000.0)
    assert {"is_ess_low", "is_std_high"} <= codes(report)
    # sequence weights (every row has 2 tokens, so per token the same shares): e^6 for the first row (below the
    # cap of 1000), 1 for the other 30
    weights = np.array([math.exp(6.0)] + [1.0] * 30)
    ess = next(f for f in report.findings if f.code == "is_ess_low")
    assert ess.value == pytest.approx(weights.sum() ** 2 / (31 * (weights**2).sum()), rel=1e-5)  # ~0.0805
    std = next(f for f in report.findings if f.code == "is_std_high")
    assert std.value == pytest.approx(weights.std(), rel=1e-5)  # population std, ~71.6
    assert report.metrics[P + "rollout_is_mean"] == pytest.approx(weights.mean(), rel=1e-5)
    assert not {"is_ess_low", "is_std_high"} & codes(run_padded(old, rollout, mask, rollout_is="sequence"))


def test_kl_high_and_the_kl_k3_disagreement() -> None:
    old, rollout, mask = rows_with_ratios([[math.exp(-0.2)] * 5] * 4)
    assert {"kl_high", "kl_k3_disagree"} <= codes(run_padded(old, rollout, mask))
    # a constant offset below the kl threshold is still a systematic shift
    old, rollout, mask = rows_with_ratios([[math.exp(-0.05)] * 5] * 4)
    report = run_padded(old, rollout, mask)
    assert codes(report) == {"kl_k3_disagree"}
    finding = report.findings[0]
    assert "1 - mean(ratio)" in finding.message and finding.metric == P + "kl"


def test_noise_does_not_look_like_a_shift() -> None:
    for seed in range(5):
        old, rollout, mask = random_batch(np.random.default_rng(seed), rows=40, width=50, noise=0.05, empty_rows=0)
        assert "kl_k3_disagree" not in codes(run_padded(old, rollout, mask))


def test_chi2_token_high() -> None:
    old, rollout, mask = rows_with_ratios([[3.0, 0.2] * 3] * 4)
    report = run_padded(old, rollout, mask)
    assert "chi2_token_high" in codes(report)
    assert report.metrics[P + "chi2_token"] == pytest.approx((9 + 0.04) / 2 - 1, rel=1e-5)


def test_rs_rejecting_everything() -> None:
    old, rollout, mask = rows_with_ratios([[2.0] * 3] * 2)
    report = run_padded(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold="0.9_1.1")
    assert "rs_rejects_all_tokens" in codes(report)
    report = run_padded(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold="0.4_2.5")
    assert "rs_rejects_all_tokens" not in codes(report)


def test_bypass_ppo_clip_never_applies_is_weights() -> None:
    old, rollout, mask = random_batch(np.random.default_rng(1), noise=0.01)
    config = rcdiag.CorrectionConfig(rollout_is="token", bypass_mode=True)
    report = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config)
    assert codes(report) == {"is_weights_unused"}
    assert report.findings[0].severity == "info"
    config = config.replace(loss_type="reinforce")
    assert codes(rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config)) == set()


def test_findings_group_across_steps_and_quote_the_worst() -> None:
    old, rollout, mask = rows_with_ratios([[1.0] * 4] * 2 + [[math.exp(-0.3)] * 4] * 2 + [[math.exp(-0.5)] * 4] * 2)
    steps = np.array([0, 0, 1, 1, 2, 2])
    report = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask, steps=steps)])
    kl = next(f for f in report.findings if f.code == "kl_high")
    assert kl.steps == (1, 2)
    assert kl.value == pytest.approx(0.5, rel=1e-5)
    assert kl.message.startswith("at 2 of 3 steps (1, 2); worst at step 2:")
    empty = rows_with_ratios([[1.0]] * 3)
    mask = empty[2].copy()
    mask[1] = 0
    report = rcdiag.analyze_chunks([padded_chunk(*empty[:2], mask, steps=np.array([0, 1, 2]))])
    crash = next(f for f in report.findings if f.code == "verl_crash_empty_batch")
    assert crash.steps == (1,) and crash.severity == "error"
    assert report.findings[0].code == "verl_crash_empty_batch"  # errors first


def test_every_code_is_listed() -> None:
    assert len(set(FINDING_CODES)) == len(FINDING_CODES) == 41
