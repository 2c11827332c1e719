"""Issue 24: the findings that keep a verdict honest (is_saturated, kl_negative, seq_is_hopeless, sparse_outliers),
detectors that say when they did not run, and position_drift robust to rare huge tokens."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES, padded_chunk, rows_with_ratios
from dumps24 import long_biased, short_without_steps, swapped, uniform_spikes
from explain_states import drift_state
from severities import checked

import rcdiag
from rcdiag.diagnosis.health import (
    IS_SATURATED_SHARE,
    OUTLIER_K3_SHARE,
    OUTLIER_TOKEN_SHARE,
    Context,
    _kl_negative,
    _seq_is_hopeless,
    _sparse_outliers,
    kl_k3_critical,
    outlier_shares,
)
from rcdiag.explain.breakdowns import SUMS
from rcdiag.explain.detectors import DETECTORS, DRIFT_ABS_RATIO_MIN, position_drift
from rcdiag.io import synthetic
from rcdiag.metrics.batch import BatchResult
from rcdiag.metrics.histogram import EDGES
from rcdiag.records.report import Histogram

P = "rollout_corr/"
NEW = {"kl_negative", "is_saturated", "seq_is_hopeless", "sparse_outliers"}


def codes(report: rcdiag.Report) -> dict[str, tuple | None]:
    return {f.code: f.steps for f in checked(report.findings)}


def result(metrics: dict[str, float], extras: dict[str, float] | None = None, histogram: Histogram | None = None):
    metrics = {P + k: v for k, v in metrics.items()}
    extras = extras or {}
    return BatchResult(metrics, extras, {**metrics, **extras}, (), 10, 100, 0, log_ratio=histogram)


# ------------------------------------------------------------------------------------------------ is_saturated


def test_saturated_sequence_is_on_long_biased_responses_is_a_finding(tmp_path: Path) -> None:
    """verl's three IS checks pass (mean 2 in [0.5, 2], std 0, ESS 1) while every weight is the cap."""
    report = rcdiag.analyze(long_biased(tmp_path / "lb.parquet"), rcdiag.preset("decoupled_seq_is"))
    m = report.metrics
    assert m[P + "rollout_is_mean"] == 2.0 and m[P + "rollout_is_std"] == 0.0
    assert m[P + "rollout_is_ratio_fraction_high"] == 1.0 and m[P + "rollout_is_eff_sample_size"] == 1.0
    found = codes(report)
    assert not {"is_mean_out_of_range", "is_std_high", "is_ess_low"} & set(found)
    assert {"is_saturated", "seq_is_hopeless"} <= set(found)
    saturated = next(f for f in report.findings if f.code == "is_saturated")
    assert saturated.value == 1.0 and "token-level TIS" in saturated.message


def test_token_is_with_a_threshold_below_one_is_saturated() -> None:
    report = rcdiag.analyze(
        SAMPLES / "healthy.parquet", rcdiag.CorrectionConfig(rollout_is="token", rollout_is_threshold=0.5)
    )
    assert report.metrics[P + "rollout_is_mean"] == 0.5  # inside verl's [0.5, 2]
    assert codes(report) == {"is_saturated": (0, 1, 2, 3, 4, 5)}


@pytest.mark.parametrize(("above", "fires"), [(90, True), (89, False)])
def test_is_saturated_threshold_is_the_share_of_ratios_beyond_the_cap(above: int, fires: bool) -> None:
    assert IS_SATURATED_SHARE == 0.9
    old, rollout, mask = rows_with_ratios([[3.0] * above + [1.0] * (100 - above)])
    report = rcdiag.analyze_chunks(
        [padded_chunk(old, rollout, mask)],
        rcdiag.CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0),
    )
    assert report.metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(above / 100)
    assert ("is_saturated" in codes(report)) == fires


# ------------------------------------------------------------------------------------------------- kl_negative


def test_swapped_columns_give_kl_negative(tmp_path: Path) -> None:
    source = SAMPLES / "rollout_temperature_only.parquet"
    report = rcdiag.analyze(swapped(tmp_path / "s.parquet", source))
    assert report.metrics[P + "kl"] == pytest.approx(-rcdiag.analyze(source).metrics[P + "kl"])
    found = next(f for f in report.findings if f.code == "kl_negative")
    assert found.severity == "error" and found.steps == (0, 1, 2, 3, 4, 5)
    assert "swapped" in found.message


def test_kl_negative_boundary_is_the_noise_limit_and_the_floor() -> None:
    se, dof, steps = 1e-3, 1e6, 4
    limit = kl_k3_critical(steps, dof - 1.0) * se
    extras = {"rcdiag/kl_std_error": se, "rcdiag/kl_std_error_dof": dof}
    assert _kl_negative(result({"kl": -limit}, extras), Context(steps)) == []
    assert _kl_negative(result({"kl": math.nextafter(-limit, -1.0)}, extras), Context(steps))[0].code == "kl_negative"
    exact = {"rcdiag/kl_std_error": 0.0, "rcdiag/kl_std_error_dof": dof}  # bitwise-equal engines: the floor
    assert _kl_negative(result({"kl": -1e-5}, exact), Context(1)) == []
    assert _kl_negative(result({"kl": -1.01e-5}, exact), Context(1))


# --------------------------------------------------------------------------------------------- seq_is_hopeless


def test_seq_is_hopeless_boundary_is_verls_ess_minimum() -> None:
    on = 1.0 / 0.3 - 1.0  # ESS 1 / (1 + chi2_seq) = 0.3
    assert _seq_is_hopeless(result({"chi2_seq": on * (1 - 1e-9)}), Context(1)) == []
    hit = _seq_is_hopeless(result({"chi2_seq": on * (1 + 1e-9)}), Context(1))
    assert hit and "of the responses, below 0.3" in hit[0].facts


# --------------------------------------------------------------------------------------------- sparse_outliers


def histogram(tokens: dict[float, int]) -> Histogram:
    """Tokens at the given log-ratios, binned as the engine bins them (bin i holds [EDGES[i-1], EDGES[i]))."""
    counts = np.zeros(len(EDGES) + 1, np.int64)
    for value, n in tokens.items():
        counts[int(np.searchsorted(EDGES, value, side="right"))] += n
    return Histogram(tuple(EDGES.tolist()), tuple(int(c) for c in counts))


def k3(d: float) -> float:
    return math.exp(d) - 1.0 - d


def test_outlier_shares_bound_the_k3_they_carry_from_the_bin_edges() -> None:
    # bulk at 0.12 (bin [0.1, 0.158...): far edge 10^-0.8), outliers at 3 (bin [10^0.4, 10^0.6): near edge 10^0.4)
    far, near = float(np.float32(10**-0.8)), float(np.float32(10**0.4))
    count, share, k3_share = outlier_shares(histogram({0.12: 10_000, 3.0: 15}))
    assert (count, share) == (15, 15 / 10_015)
    assert k3_share == pytest.approx(15 * k3(near) / (15 * k3(near) + 10_000 * k3(far)), rel=1e-12)
    assert 15 * k3(near) < 15 * k3(3.0)  # a lower bound


@pytest.mark.parametrize(
    ("tokens", "fires"),
    [
        ({0.01: 9_900, 5.0: 100}, True),  # outliers exactly 1% of the tokens
        ({0.01: 9_900, 5.0: 101}, False),  # a hair more than 1%: not sparse
        ({0.12: 10_000, 3.0: 16}, True),  # they carry >= 50% of the k3 sum (lower bound 0.516)
        ({0.12: 10_000, 3.0: 15}, False),  # lower bound 0.4995
        ({0.12: 10_000}, False),  # no outlier
    ],
)
def test_sparse_outliers_thresholds(tokens: dict[float, int], fires: bool) -> None:
    assert (OUTLIER_TOKEN_SHARE, OUTLIER_K3_SHARE) == (0.01, 0.5)
    assert bool(_sparse_outliers(result({}, histogram=histogram(tokens)), Context(1))) == fires


@pytest.mark.parametrize("seed", [1, 4])
def test_rare_huge_tokens_at_uniform_positions_fire_sparse_outliers_and_no_detector(tmp_path: Path, seed: int) -> None:
    """Seeds 1 and 4 made position_drift warn (k3_kl 37x and 29x later in the response) before it also required
    the mean |log-ratio| to grow."""
    report = rcdiag.analyze(uniform_spikes(tmp_path / "u.parquet", seed=seed), explain=True)
    found = codes(report)
    assert "sparse_outliers" in found
    assert not set(DETECTORS) & set(found), found
    flat = [b.abs_log_ratio_mean for b in report.explain.breakdowns.position]
    assert max(flat) / min(flat) < 1.3  # the bulk does not drift


def test_position_drift_sample_still_fires() -> None:
    report = rcdiag.analyze(SAMPLES / "position_drift.parquet", explain=True)
    drift = next(f for f in report.findings if f.code == "position_drift")
    assert drift.evidence["abs_log_ratio_ratio"] > 2 * DRIFT_ABS_RATIO_MIN


@pytest.mark.parametrize(("abs_ratio", "fires"), [(1.5, True), (1.5 * (1 - 2.0**-10), False)])
def test_position_drift_needs_the_mean_abs_log_ratio_to_grow(abs_ratio: float, fires: bool) -> None:
    assert DRIFT_ABS_RATIO_MIN == 1.5
    state = drift_state(2.0**-8, 4 * 2.0**-8)
    state.breakdowns.position[:, 0, SUMS.index("abs_lr")] = 1024 * 0.01
    state.breakdowns.position[:, 4, SUMS.index("abs_lr")] = 1024 * 0.01 * abs_ratio
    assert (position_drift(state) is not None) == fires


# ------------------------------------------------------------------------------------------------ false alarms


@pytest.mark.parametrize("name", ["healthy.parquet", "healthy_t06.parquet"])
def test_new_findings_stay_quiet_on_clean_samples(name: str) -> None:
    for config in (None, rcdiag.preset("decoupled_seq_is"), rcdiag.preset("decoupled_token_is")):
        assert not NEW & set(codes(rcdiag.analyze(SAMPLES / name, config))), config


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_new_findings_stay_quiet_on_synthetic_healthy_dumps(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "h.parquet"
    synthetic.write(synthetic.generate("healthy", seed=seed + 10), path)
    assert not NEW & set(codes(rcdiag.analyze(path, rcdiag.preset("decoupled_seq_is"))))


@pytest.mark.parametrize("name", ["rollout_temperature_only", "train_forgot_temperature", "quantized_4bit"])
def test_sparse_outliers_does_not_fire_on_broad_mismatch(name: str) -> None:
    """A temperature mismatch or a 4-bit rollout moves many tokens: not a sparse tail."""
    assert "sparse_outliers" not in codes(rcdiag.analyze(SAMPLES / f"{name}.parquet"))


# -------------------------------------------------------------------------------------------------- not run


def test_detectors_without_their_data_say_not_run(tmp_path: Path) -> None:
    report = rcdiag.analyze(short_without_steps(tmp_path / "s.parquet"), explain=True)
    rows = {row.code: row for row in report.checklist}
    assert rows["mismatch_trend"].status == "not_computed"
    assert rows["mismatch_trend"].reason == "not run: the dump has no steps"
    assert rows["position_drift"].status == "not_computed"
    assert rows["position_drift"].reason == "not run: 0 tokens at positions >= 256, needs 2,000"
    assert rows["temperature_mismatch"].status == rows["logprob_offset"].status == "ok"  # these ran
    assert report.to_dict()["detectors_not_run"] == {
        "mismatch_trend": "not run: the dump has no steps",
        "position_drift": "not run: 0 tokens at positions >= 256, needs 2,000",
        "token_specific": "not run: the dump has no token ids (--token-col NAME)",
    }


def test_detectors_with_their_data_all_run() -> None:
    report = rcdiag.analyze(SAMPLES / "healthy.parquet", explain=True)
    no_ids = {"token_specific": "not run: the dump has no token ids (--token-col NAME)"}  # the sample has no ids
    assert report.to_dict()["detectors_not_run"] == no_ids
    assert all(row.status == "ok" for row in report.checklist if row.code in DETECTORS and row.code not in no_ids)
    with_ids = rcdiag.analyze(SAMPLES / "stop_token.parquet", explain=True)
    assert with_ids.to_dict()["detectors_not_run"] == {}  # every detector, token_specific too, ran
