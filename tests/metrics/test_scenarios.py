"""Hand-computed scenarios (spec section 15), including the ones verl's own suite misses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import random_batch, rows_with_ratios, run_padded

import rcdiag
from rcdiag.runtime.errors import ConfigError, InputError

P = "rollout_corr/"


def test_token_rs_masks_tokens_and_keeps_weights() -> None:
    old, rollout, mask = rows_with_ratios([[math.exp(-1)] * 3, [math.exp(0.5)] * 3])
    m = run_padded(
        old, rollout, mask, rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"
    ).metrics
    assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert m[P + "rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.5)
    assert m[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    # IS weights are not zeroed by RS: 0.368 (no lower clamp in TIS) and 1.649
    assert m[P + "rollout_is_mean"] == pytest.approx((math.exp(-1) + math.exp(0.5)) / 2, rel=1e-6)
    assert m[P + "rollout_is_min"] == pytest.approx(math.exp(-1), rel=1e-6)
    assert m[P + "rollout_is_max"] == pytest.approx(math.exp(0.5), rel=1e-6)


def test_icepop_zeroes_weights_oob_std_and_ess() -> None:
    old, rollout, mask = rows_with_ratios([[0.4, 0.8, 6.0]])
    m = run_padded(old, rollout, mask, rollout_is="token", rollout_is_threshold="0.5_5.0").metrics
    assert m[P + "rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    assert m[P + "rollout_is_std"] == pytest.approx(0.3771236, rel=1e-6)
    assert m[P + "rollout_is_eff_sample_size"] == pytest.approx(1 / 3, rel=1e-6)
    assert m[P + "rollout_is_mean"] == pytest.approx(0.8 / 3, rel=1e-6)
    assert m[P + "rollout_is_min"] == 0.0
    assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m[P + "rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)


def test_seq_fraction_high_looks_at_raw_weights() -> None:
    old, rollout, mask = rows_with_ratios([[1.0, 6.0], [1.0, 1.0]])
    m = run_padded(old, rollout, mask, rollout_is="token", rollout_is_threshold=2.0).metrics
    assert m[P + "rollout_is_seq_fraction_high"] == pytest.approx(0.5)  # raw mean 3.5 > 2, clamped mean 1.5
    assert m[P + "rollout_is_seq_max"] == pytest.approx(1.5, rel=1e-6)
    assert m[P + "rollout_is_seq_max_deviation"] == pytest.approx(0.5, rel=1e-5)


def test_asymmetric_k1_bounds_keep_the_inverted_ratio_interval() -> None:
    # "0.7_1.3" keeps ratios in [1/1.3, 1/0.7] = [0.769, 1.4286], not [0.7, 1.3]
    ratios = [[0.75], [1.4], [1.0], [1.45], [0.72]]
    old, rollout, mask = rows_with_ratios(ratios)
    m = run_padded(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold="0.7_1.3").metrics
    assert m[P + "rollout_rs_token_k1_masked_fraction"] == pytest.approx(3 / 5)  # 0.75, 1.45, 0.72 rejected
    # fraction_high counts ratios that are too LOW (k1 = -log r > log U), fraction_low the too-high ones
    assert m[P + "rollout_rs_token_k1_fraction_high"] == pytest.approx(2 / 5)
    assert m[P + "rollout_rs_token_k1_fraction_low"] == pytest.approx(1 / 5)


def test_bare_k1_threshold_means_reciprocal_bounds() -> None:
    old, rollout, mask = rows_with_ratios([[0.8], [1.2], [0.7], [1.4]])
    m = run_padded(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold=1.3).metrics
    assert m[P + "rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.5)  # 0.7 and 1.4 outside [1/1.3, 1.3]


def test_the_two_seq_masked_fraction_denominators() -> None:
    # 7 rows: 2 empty, 5 valid, 3 of the valid ones with a rejected token
    ratios = [[1.0, 1.0], [3.0, 1.0], [1.0, 0.2], [], [1.0], [5.0], []]
    old, rollout, mask = rows_with_ratios([r or [1.0] for r in ratios])
    mask[3] = 0
    mask[6] = 0
    m = run_padded(old, rollout, mask, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0").metrics
    assert m[P + "rollout_rs_token_k1_seq_masked_fraction"] == pytest.approx(3 / 5)  # among valid rows
    assert m[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(3 / 7)  # among all rows
    assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(3 / 8)  # 3 of 8 valid tokens


def test_ess_zero_division_is_null_with_a_crash_finding() -> None:
    old, rollout, mask = rows_with_ratios([[0.1, 0.2], [9.0]])
    report = run_padded(old, rollout, mask, rollout_is="token", rollout_is_threshold="0.5_5.0")
    assert report.metrics[P + "rollout_is_eff_sample_size"] is None
    assert report.metrics[P + "rollout_is_oob_ratio"] == 1.0
    assert report.metrics[P + "rollout_is_mean"] == 0.0
    crash = [f for f in report.findings if f.code == "verl_crash_ess_zero_division"]
    assert len(crash) == 1 and crash[0].severity == "error"
    assert crash[0].metric == P + "rollout_is_eff_sample_size"
    assert "ZeroDivisionError" in crash[0].message


def test_sequence_icepop_rejecting_every_row_also_crashes_verl() -> None:
    old, rollout, mask = rows_with_ratios([[3.0, 3.0], [0.1]])
    report = run_padded(old, rollout, mask, rollout_is="sequence", rollout_is_threshold="0.5_5.0")
    assert report.metrics[P + "rollout_is_eff_sample_size"] is None
    assert {f.code for f in report.findings} >= {"verl_crash_ess_zero_division"}


def test_batch_without_a_valid_token() -> None:
    old, rollout, mask = rows_with_ratios([[1.0, 2.0], [0.5]])
    mask[:] = 0
    report = run_padded(old, rollout, mask, rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    # verl >= 0.8.0's calculate_debug_metrics gives valid 0 (and NaN) before rollout correction raises
    valid = report.metrics.pop("training/rollout_probs_diff_valid")
    assert valid == 0.0 and report.metrics and all(v is None for v in report.metrics.values())
    assert [f.code for f in report.findings] == ["verl_crash_empty_batch"]
    assert report.input.valid_tokens == 0 and report.input.rows == 2


def test_batch_normalization_factors() -> None:
    """The factors against numpy on the raw arrays (TIS at 2.0): token level the token-weighted mean weight,
    sequence level the mean weight over rows with a valid token (seq_mean averages over all rows)."""
    rng = np.random.default_rng(5)
    old, rollout, mask = random_batch(rng, rows=16, width=20, noise=0.3, empty_rows=4, hole_rate=0.1)
    valid = mask.astype(bool)
    d = old.astype(np.float64) - rollout
    m = run_padded(old, rollout, mask, rollout_is="token", rollout_is_batch_normalize=True).metrics
    assert m[P + "rollout_is_batch_norm_factor"] == pytest.approx(np.minimum(np.exp(d), 2.0)[valid].mean(), rel=1e-6)
    assert m[P + "rollout_is_batch_norm_factor"] == m[P + "rollout_is_mean"]  # verl's identity, bit for bit
    m = run_padded(old, rollout, mask, rollout_is="sequence", rollout_is_batch_normalize=True).metrics
    row_weight = np.minimum(np.exp(np.where(valid, d, 0.0).sum(1)), 2.0)
    nonempty = valid.any(1)
    assert nonempty.sum() == 12
    assert m[P + "rollout_is_batch_norm_factor"] == pytest.approx(row_weight[nonempty].mean(), rel=1e-6)
    assert m[P + "rollout_is_seq_mean"] == pytest.approx(row_weight[nonempty].sum() / 16, rel=1e-6)


def test_batch_norm_factor_falls_back_to_one() -> None:
    old, rollout, mask = rows_with_ratios([[9.0, 0.1]])
    m = run_padded(
        old,
        rollout,
        mask,
        rollout_is="token",
        rollout_is_threshold="0.5_5.0",
        rollout_is_batch_normalize=True,
    ).metrics
    assert m[P + "rollout_is_batch_norm_factor"] == 1.0


def test_identities_between_metrics() -> None:
    rng = np.random.default_rng(9)
    old, rollout, mask = random_batch(rng, rows=20, width=30, noise=0.2, empty_rows=0)
    m = run_padded(
        old,
        rollout,
        mask,
        rollout_rs="token_k1,seq_mean_k1,seq_mean_k3",
        rollout_rs_threshold="0.5_2.0,0.5_2.0,1.0",
    ).metrics
    assert m[P + "rollout_rs_token_k1_mean"] == pytest.approx(m[P + "kl"], rel=1e-6)
    assert m[P + "rollout_rs_seq_mean_k1_mean"] == pytest.approx(m[P + "kl"], rel=1e-5)
    assert m[P + "rollout_rs_seq_mean_k3_mean"] == pytest.approx(m[P + "k3_kl"], rel=1e-5)
    assert m[P + "rollout_rs_token_k1_seq_mean"] == pytest.approx(m[P + "log_ppl_diff"], rel=1e-5)
    frac = m[P + "rollout_rs_token_k1_fraction_high"] + m[P + "rollout_rs_token_k1_fraction_low"]
    assert m[P + "rollout_rs_token_k1_masked_fraction"] == pytest.approx(frac)


def test_duplicate_rs_options_are_merged_first_occurrence_wins() -> None:
    rng = np.random.default_rng(2)
    old, rollout, mask = random_batch(rng)
    m = run_padded(
        old, rollout, mask, rollout_rs="token_k1, seq_max_k2,token_k1", rollout_rs_threshold="0.5_2.0,1.0"
    ).metrics
    options = [
        k.removesuffix("_mean").removeprefix(P + "rollout_rs_")
        for k in m
        if k.endswith("_mean") and "_rs_" in k and not k.endswith("_seq_mean")
    ]
    assert options == ["token_k1", "seq_max_k2"]
    with pytest.raises(ConfigError, match="exactly 1 thresholds"):
        rcdiag.CorrectionConfig(rollout_rs="token_k1,token_k1", rollout_rs_threshold="0.5_2.0,0.6_1.5").resolve()


@pytest.mark.parametrize(
    ("config", "count"),
    [
        ({}, 13),
        ({"rollout_is": "token"}, 27),
        ({"rollout_is": "sequence"}, 27),
        ({"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}, 28),
        (dict(rcdiag.preset("decoupled_seq_is_rs").to_dict()), 44),
        (
            {
                "rollout_is": "token",
                "rollout_is_batch_normalize": True,
                "rollout_rs": "token_k1,seq_mean_k3",
                "rollout_rs_threshold": "0.5_2.0,0.01",
            },
            59,
        ),
    ],
)
def test_key_counts(config: dict, count: int) -> None:
    config = {k: v for k, v in config.items() if k not in ("bypass_mode", "loss_type")}
    old, rollout, mask = random_batch(np.random.default_rng(0))
    metrics = run_padded(old, rollout, mask, **config).metrics
    assert len([k for k in metrics if k.startswith("rollout_corr/")]) == count
    assert len([k for k in metrics if k.startswith("training/")]) == 5  # decoupled mode: verl's debug metrics


def test_key_order_follows_verl() -> None:
    old, rollout, mask = random_batch(np.random.default_rng(0))
    token = list(run_padded(old, rollout, mask, rollout_is="token").metrics)
    seq = list(run_padded(old, rollout, mask, rollout_is="sequence", rollout_is_batch_normalize=True).metrics)
    offpolicy = [
        "training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
        "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq",
    ]  # fmt: skip
    tail = [
        "seq_mean",
        "seq_std",
        "seq_max",
        "seq_min",
        "seq_max_deviation",
        "seq_fraction_high",
        "seq_fraction_low",
    ]
    head_token = ["mean", "ratio_fraction_high", "ratio_fraction_low", "max", "min", "std", "eff_sample_size"]
    head_seq = ["max", "min", "mean", "ratio_fraction_high", "ratio_fraction_low", "std", "eff_sample_size"]
    debug = [f"training/rollout_probs_diff_{k}" for k in ("valid", "max", "mean", "std")]
    debug.append("training/rollout_actor_probs_pearson_corr")  # verl logs them first, when old_log_probs are recomputed
    assert token == debug + [P + "rollout_is_" + k for k in head_token + tail] + [P + k for k in offpolicy]
    expected_seq = [P + "rollout_is_" + k for k in [*head_seq, *tail, "batch_norm_factor"]]
    assert seq == debug + expected_seq + [P + k for k in offpolicy]
    rs = list(run_padded(old, rollout, mask, rollout_rs="seq_max_k3,token_k1", rollout_rs_threshold="1.0,2.0").metrics)
    k1 = ["mean", "max", "min", "fraction_high", "fraction_low", "std", "seq_mean", "seq_std", "seq_max", "seq_min",
          "seq_max_deviation", "seq_fraction_high", "seq_fraction_low", "masked_fraction", "seq_masked_fraction"]  # fmt: skip
    k3 = [s for s in k1 if s != "seq_fraction_low"]
    expected = [P + "rollout_rs_seq_max_k3_" + s for s in k3] + [P + "rollout_rs_token_k1_" + s for s in k1]
    expected += [P + "rollout_rs_masked_fraction", P + "rollout_rs_seq_masked_fraction"]
    assert rs == debug + expected + [P + k for k in offpolicy]


def test_empty_rows_count_in_all_row_metrics() -> None:
    old, rollout, mask = rows_with_ratios([[2.0, 2.0], [1.0]])
    mask[1] = 0  # row 1 is now empty
    m = run_padded(old, rollout, mask, rollout_is="token", rollout_is_threshold=5.0).metrics
    # training_ppl averages exp(-mean old) over both rows, the empty one contributing exp(0) = 1
    mo = -3.0 + math.log(2.0)
    assert m[P + "training_ppl"] == pytest.approx((math.exp(-mo) + 1.0) / 2, rel=1e-6)
    assert m[P + "chi2_seq"] == pytest.approx((4.0**2 + 1.0) / 2 - 1.0, rel=1e-5)
    assert m[P + "log_ppl_diff_max"] == 0.0  # the empty row's gap is 0; row 0's is -log 2
    assert m[P + "log_ppl_diff_min"] == pytest.approx(-math.log(2.0), rel=1e-6)
    assert m[P + "rollout_is_seq_min"] == 0.0
    assert m[P + "rollout_is_seq_max_deviation"] == 1.0
    assert m[P + "rollout_is_seq_fraction_low"] == 0.5  # the empty row's raw mean is 0 < 1/U


def test_invalid_values_are_input_errors() -> None:
    old, rollout, mask = rows_with_ratios([[1.0, 2.0], [0.5]])
    old[1, 0] = np.nan
    with pytest.raises(InputError, match=r"row 1.*NaN"):
        run_padded(old, rollout, mask)
    old[1, 0] = -0.5
    rollout[0, 1] = 0.7
    with pytest.raises(InputError, match="positive log-prob"):
        run_padded(old, rollout, mask)
    rollout[0, 1] = -np.inf  # probability 0 is legal: clamps apply
    report = run_padded(old, rollout, mask, rollout_is="token")
    assert report.metrics[P + "rollout_is_max"] == 2.0
    assert report.extras["rcdiag/clamped_token_fraction"] == pytest.approx(1 / 3)
    # NaN in padding is ignored, as in verl's masked ops: the same report as without it
    assert mask[1, 1] == 0
    old[1, 1] = np.nan
    with_nan = run_padded(old, rollout, mask, rollout_is="token")
    assert with_nan.metrics == report.metrics and with_nan.extras == report.extras


@pytest.mark.parametrize("overlap", [False, True])
def test_rs_aggregate_with_token_and_sequence_options(overlap: bool) -> None:
    # row 0: one token rejected by token_k1; row 1: rejected whole by seq_sum_k1; row 2: clean;
    # with overlap, row 1 also has a token rejected by token_k1 (it must not be counted twice)
    ratios = [[3.0, 0.6, 0.6], [1.6, 1.6, 1.5], [1.0, 1.0, 1.0]]
    if overlap:
        ratios[1][0] = 2.5
    old, rollout, mask = rows_with_ratios(ratios)
    config = {"rollout_rs": "token_k1,seq_sum_k1", "rollout_rs_threshold": "0.5_2.0,0.4_2.5"}
    m = run_padded(old, rollout, mask, **config).metrics
    from reference import all_metrics

    expected = all_metrics(old, rollout, mask, **config)
    assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(4 / 9)
    assert m[P + "rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3)
    for key in (P + "rollout_rs_masked_fraction", P + "rollout_rs_seq_masked_fraction"):
        assert m[key] == pytest.approx(expected[key])
