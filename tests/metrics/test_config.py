"""Threshold parsing, validation and presets, with verl's exact messages."""

from __future__ import annotations

import math

import pytest

import rcdiag
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import PRESETS, CorrectionConfig, parse_is_threshold, parse_rs_thresholds, preset


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (2.0, (2.0, None)),
        (3, (3.0, None)),
        ("2.5", (2.5, None)),
        (" 2.5 ", (2.5, None)),
        ("0.5_5.0", (5.0, 0.5)),
        ("2_2", (2.0, 2.0)),  # L == U is allowed
        ("0.5_5.0_7", (5.07, 0.5)),  # Python's float() accepts digit-group underscores, as in verl
        ("inf", (math.inf, None)),
    ],
)
def test_is_threshold_parsing(spec: object, expected: tuple) -> None:
    assert parse_is_threshold(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (True, "not a boolean"),
        ("", "must not be an empty string"),
        ("abc", "Invalid rollout_is_threshold 'abc'."),
        ("a_b", "Invalid rollout_is_threshold 'a_b'."),
        (0, "upper bound must be positive, got 0.0."),
        (-1.0, "upper bound must be positive, got -1.0."),
        ("0_2", "lower bound must be positive, got 0.0."),
        ("3_2", "lower bound must be <= upper bound."),
        ([2.0], "must be a float or a string threshold specification."),
    ],
)
def test_is_threshold_errors(spec: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_is_threshold(spec)
    assert message in str(info.value)


def test_rs_thresholds_broadcast_zip_and_k1_reciprocal() -> None:
    got = parse_rs_thresholds(["token_k1", "seq_mean_k3"], "2.0")
    assert got["token_k1"] == (0.5, 2.0)
    assert got["seq_mean_k3"] == (None, 2.0)
    got = parse_rs_thresholds(["token_k1", "seq_mean_k3"], "0.7_1.3, 0.01")
    assert got == {"token_k1": (0.7, 1.3), "seq_mean_k3": (None, 0.01)}
    assert parse_rs_thresholds(["seq_sum_k1"], 1.25)["seq_sum_k1"] == (1.0 / 1.25, 1.25)
    assert parse_rs_thresholds(["token_k2"], 3) == {"token_k2": (None, 3.0)}


@pytest.mark.parametrize(
    ("options", "spec", "message"),
    [
        (["token_k1"], None, "rollout_rs_threshold must be provided for rejection sampling."),
        (["token_k1"], " , ", "must contain at least one threshold value."),
        (["token_k1", "token_k2"], "1,2,3", "exactly 2 thresholds"),
        (["token_k1"], [1.0], "must be a string or numeric value"),
        (["token_k2"], "0.5_2", "must provide a single upper bound without '_'. Received '0.5_2'."),
        (["token_k2"], "abc", "Invalid numeric threshold 'abc' for option 'token_k2'."),
        (["token_k3"], "0", "Threshold for option 'token_k3' must be positive, got 0."),
        (["token_k1"], "a_2", "Invalid numeric threshold 'a_2' for option 'token_k1'."),
        (["token_k1"], "0_2", "Thresholds for option 'token_k1' must be positive, got 0_2."),
        (["token_k1"], "-2", "Thresholds for option 'token_k1' must be positive, got -2."),
        (["token_k1"], "2_1", "must be lower <= upper, got 2_1."),
        # where verl itself crashes (ZeroDivisionError / a bare float() error), rcdiag says why
        (["token_k1"], "0", "verl v0.9.0 crashes here with ZeroDivisionError"),
        (
            ["seq_sum_k1"],
            "abc",
            "Invalid numeric threshold 'abc' for option 'seq_sum_k1'. (verl v0.9.0 crashes",
        ),
    ],
)
def test_rs_threshold_errors(options: list, spec: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_rs_thresholds(options, spec)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rollout_is": "geometric"}, "Invalid rollout_is: geometric. Must be one of"),
        (
            {"rollout_rs": "token_k1"},
            "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled.",
        ),
        ({"rollout_rs": "sequence", "rollout_rs_threshold": 2.0}, "Invalid rollout_rs option: sequence."),
        ({"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 2.0}, "Invalid rollout_rs option: seq_max_k1."),
        ({"rollout_rs": "Token_K1", "rollout_rs_threshold": 2.0}, "Invalid rollout_rs option: Token_K1."),
        (
            {"rollout_rs": " , ", "rollout_rs_threshold": 2.0},
            "rollout_rs must contain at least one valid option.",
        ),
        (
            {"bypass_mode": True, "loss_type": "ppo"},
            "Invalid loss_type: ppo. Must be 'reinforce' or 'ppo_clip'.",
        ),
    ],
)
def test_config_errors(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CorrectionConfig(**fields).resolve()
    assert message in str(info.value)


def test_is_threshold_none_silently_skips_is() -> None:
    assert CorrectionConfig(rollout_is="token", rollout_is_threshold=None).resolve().is_spec is None


def test_default_is_metrics_only() -> None:
    resolved = CorrectionConfig().resolve()
    assert resolved.is_spec is None and resolved.rs_options == ()


def test_rs_option_resolution() -> None:
    resolved = CorrectionConfig(rollout_rs="seq_mean_k1,seq_max_k3", rollout_rs_threshold="0.999_1.001,0.5").resolve()
    geo, k3 = resolved.rs_options
    assert (geo.agg, geo.estimator, geo.level) == ("mean", "k1", "sequence")
    assert geo.thr_hi == pytest.approx(math.log(1.001)) and geo.thr_lo == pytest.approx(math.log(0.999))
    assert (k3.agg, k3.estimator, k3.thr_hi, k3.thr_lo) == ("max", "k3", 0.5, 0.0)


def test_nineteen_presets() -> None:
    assert len(PRESETS) == 19
    for name in PRESETS:
        preset(name).resolve()
    assert preset("decoupled_token_icepop").rollout_is_threshold == "0.5_5.0"
    assert preset("bypass_pg_geo_rs_token_tis") == CorrectionConfig(
        rollout_is="token",
        rollout_rs="seq_mean_k1",
        rollout_rs_threshold="0.999_1.001",
        bypass_mode=True,
        loss_type="reinforce",
    )
    with pytest.raises(ConfigError, match="Unknown preset 'decoupled_k1_rs'"):
        preset("decoupled_k1_rs")  # named in verl's docs, but it does not exist


def test_public_api_is_importable() -> None:
    for name in rcdiag.__all__:
        assert getattr(rcdiag, name) is not None
