"""Every metric against the independent float64 padded reference (tests/reference.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_metrics_close, random_batch, run_padded
from reference import all_metrics
from severities import checked

from rcdiag.settings.correction import RS_OPTIONS

CONFIGS = [
    {},
    {"rollout_is": "token"},
    {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True},
    {"rollout_is": "sequence", "rollout_is_threshold": 5.0},
    {"rollout_is": "sequence", "rollout_is_batch_normalize": True},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.8_1.25", "rollout_is_batch_normalize": True},
    {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"},
    {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.7_1.3"},
    {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.3},
    {
        "rollout_rs": ",".join(RS_OPTIONS),
        "rollout_rs_threshold": "0.7_1.3,0.02,0.01,0.5_2.0,0.5,0.2,0.99_1.01,0.005,0.003,0.05,0.05",
    },
    {"rollout_is": "token", "rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.9_1.05,0.001"},
    {"rollout_is": "sequence", "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"},
    {"rollout_rs": "seq_max_k2,token_k3", "rollout_rs_threshold": 0.1},
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("noise", [0.01, 0.2, 1.0])
def test_every_metric_matches_reference(config: dict, noise: float) -> None:
    rng = np.random.default_rng(int(noise * 1000) + len(config))
    old, rollout, mask = random_batch(rng, rows=32, width=48, noise=noise, outliers=0.01)
    report = run_padded(old, rollout, mask, **config)
    expected = all_metrics(old, rollout, mask, **config)
    assert_metrics_close(report.metrics, expected, rel=2e-5, abs_tol=2e-6)


def test_extreme_log_ratios_follow_verl_clamps() -> None:
    """Log-ratios beyond ±20 (and beyond float32's exp range) use verl's clamps where verl clamps."""
    old = np.array([[-0.1, -0.2, -30.0, -0.5], [-95.0, -0.3, -0.1, -0.2], [-0.4, -0.4, -0.4, -0.4]], np.float32)
    rollout = np.array([[-0.1, -25.0, -0.1, -0.5], [-0.1, -0.3, -0.1, -0.2], [-0.4, -0.3, -0.5, -0.4]], np.float32)
    mask = np.ones_like(old, dtype=np.int64)
    for config in (
        {"rollout_is": "token"},
        {"rollout_is": "sequence"},
        {"rollout_rs": "seq_sum_k2", "rollout_rs_threshold": 5},
    ):
        report = run_padded(old, rollout, mask, **config)
        expected = all_metrics(old, rollout, mask, **config)
        assert_metrics_close(report.metrics, expected, rel=1e-5, abs_tol=1e-6)
    # k3_kl is unclamped: exp(24.8) is finite, so it is huge but finite here
    assert report.metrics["rollout_corr/k3_kl"] == pytest.approx(expected["rollout_corr/k3_kl"], rel=1e-5)


def test_k3_kl_overflow_is_null_with_a_finding() -> None:
    old = np.array([[-0.1, -0.2]], np.float32)
    rollout = np.array([[-99.0, -0.2]], np.float32)  # log-ratio 98.9: exp overflows float32
    report = run_padded(old, rollout, np.ones((1, 2), np.int64))
    assert report.metrics["rollout_corr/k3_kl"] is None
    assert report.metrics["rollout_corr/kl"] == pytest.approx(-98.9 / 2, rel=1e-6)
    codes = {(f.code, f.metric) for f in checked(report.findings)}
    assert ("metric_not_finite", "rollout_corr/k3_kl") in codes
