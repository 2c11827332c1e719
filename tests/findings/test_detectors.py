"""The four ``--explain`` detectors: quiet on clean dumps (many seeds, temperatures, noise levels, a 4-bit
rollout) and on every healthy sample, firing on dumps with each bug, with evidence that matches the generator."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES
from explain_states import drift_state
from generator_model import expected
from severities import checked

import rcdiag
from rcdiag.explain import detectors
from rcdiag.explain.detectors import DETECTORS, mismatch_trend, position_drift
from rcdiag.io import synthetic
from rcdiag.io.synthetic import SCENARIOS, Scenario

TEMPERATURES = (0.6, 0.8, 1.0, 1.2)
NOISES = (0.01, 0.03, 0.1, 0.3)
CLEAN = [
    pytest.param(Scenario("clean", "", noise=NOISES[(seed // 4) % 4], t_rollout=t, t_train=t), seed, id=f"s{seed}")
    for seed in range(24)
    for t in (TEMPERATURES[seed % 4],)
]
HEAVY = [
    pytest.param(replace(SCENARIOS[name], t_rollout=t, t_train=t), 100 + i, id=f"{name}-T{t}")
    for i, (name, t) in enumerate(
        [("quantized_4bit", 0.6), ("quantized_4bit", 0.8), ("quantized_4bit", 1.0), ("quantized_4bit", 1.2),
         ("outliers", 0.6), ("outliers", 1.0)]
    )
]  # fmt: skip


def explained(tmp_path: Path, scenario: Scenario | str, seed: int, rows: int = 192) -> dict[str, rcdiag.Finding]:
    path = tmp_path / "dump.parquet"
    synthetic.write(synthetic.generate(scenario, rows=rows, steps=6, seed=seed), path)
    return {f.code: f for f in checked(rcdiag.analyze(path, explain=True).findings) if f.code in DETECTORS}


@pytest.mark.parametrize(("scenario", "seed"), CLEAN + HEAVY)
def test_no_false_alarm_on_clean_dumps(tmp_path: Path, scenario: Scenario, seed: int) -> None:
    """24 seeds over 4 temperatures x 4 noise levels, plus a 4-bit quantised rollout and rare outlier tokens."""
    assert explained(tmp_path, scenario, seed) == {}


@pytest.mark.parametrize(
    "name", ["healthy.parquet", "healthy_t06.parquet", "quantized_4bit.parquet", "outliers.parquet"]
)
def test_healthy_samples_are_quiet(name: str) -> None:
    found = {f.code for f in rcdiag.analyze(SAMPLES / name, explain=True).findings}
    assert not found & set(DETECTORS)


@pytest.mark.parametrize(
    ("scenario", "code"),
    [
        ("rollout_temperature_only", "temperature_mismatch"),
        ("train_forgot_temperature", "temperature_mismatch"),
        (Scenario("flat", "trainer at T=0.7, rollout at T=1.0", t_train=0.7), "temperature_mismatch"),
        ("topk_offset", {"logprob_offset", "sampling_truncation"}),
        (Scenario("topp", "top-k 24 of 48", top_k=24), {"logprob_offset", "sampling_truncation"}),
        ("position_drift", "position_drift"),
        ("step_trend", "mismatch_trend"),
    ],
)
@pytest.mark.parametrize("seed", [31, 32, 33])
def test_each_bug_fires_its_detector_only(
    tmp_path: Path, scenario: Scenario | str, code: str | set[str], seed: int
) -> None:
    assert set(explained(tmp_path, scenario, seed)) == ({code} if isinstance(code, str) else code)


# ------------------------------------------------------------------------------------------ evidence


def findings(name: str) -> dict[str, rcdiag.Finding]:
    return {f.code: f for f in checked(rcdiag.analyze(SAMPLES / name, explain=True).findings)}


def test_one_sided_temperature_sample() -> None:
    """The rollout at T = 0.7: unlikely tokens lose log-prob, likely ones gain (the rollout is sharper)."""
    finding = findings("rollout_temperature_only.parquet")["temperature_mismatch"]
    spec = SCENARIOS["rollout_temperature_only"]
    truth = spec.t_train / spec.t_rollout  # 1/0.7: rollout log-probs are 1.43x the trainer's
    evidence = finding.evidence
    assert evidence["direction"] == "sharper" and "is sharper than" in finding.message
    assert evidence["log_ratio_unlikely"] > detectors.TEMPERATURE_MIN_SHIFT and evidence["log_ratio_likely"] < 0
    assert f"{finding.value:+.3g}" in finding.message
    assert 1.0 < evidence["slope"] < truth  # the regression slope: the direction, understating the ratio
    assert rcdiag.analyze(SAMPLES / "rollout_temperature_only.parquet").input.metadata["temperature"] == "0.7"


def test_position_drift_sample_matches_the_generator() -> None:
    finding = findings("position_drift.parquet")["position_drift"]
    table = pq.read_table(SAMPLES / "position_drift.parquet")
    positions, valid = [], []
    for mask in table.column("response_mask").to_pylist():
        positions.extend(range(len(mask)))
        valid.extend(mask)
    p = np.array(positions)[np.array(valid, dtype=bool)]
    scale = SCENARIOS["position_drift"].position_scale
    variance = (1 + p / scale) ** 2  # k3 ~ noise variance / 2 for small noise
    predicted = variance[p >= 256].mean() / variance[p < 64].mean()
    assert finding.evidence["ratio"] == pytest.approx(predicted, rel=0.35)
    assert finding.evidence["groups_above"] == 1.0
    assert finding.evidence["growth_per_doubling"] > 1.5


def test_step_trend_sample_matches_the_generator() -> None:
    finding = findings("step_trend.parquet")["mismatch_trend"]
    growth = SCENARIOS["step_trend"].step_growth ** 2  # k3 ~ variance ~ (std growth)^2 per step
    assert finding.evidence["growth_per_step"] == pytest.approx(growth, rel=0.1)
    assert finding.evidence["steps"] == [0, 1, 2, 3, 4, 5]
    crossing = finding.evidence["crossing_step"]["kl"]
    assert not crossing["already"] and crossing["step"] > 5
    spec = SCENARIOS["step_trend"]
    kl5 = expected(replace(spec, noise=spec.noise * spec.step_growth**5, step_growth=1.0))["kl"].mean  # step 5's
    assert crossing["step"] == pytest.approx(5 + math.log(0.1 / kl5) / math.log(growth), abs=1.5)


def test_topk_sample_offset_is_the_missing_mass() -> None:
    finding = findings("topk_offset.parquet")["logprob_offset"]
    model = expected("topk_offset")  # the generator's population values (tests/generator_model.py)
    mass = 1.0 - (model["kl"].mean - model["k3_kl"].mean)  # mean ratio = the trainer's mass on the top-k: ~0.832
    assert finding.evidence["mean_capped_ratio"] == pytest.approx(mass, abs=0.003)  # ~5 standard errors
    assert finding.value == pytest.approx(-math.log(mass), abs=0.004)
    assert finding.evidence["share_shifted"] > 0.5


# ------------------------------------------------------------------------------------------ boundaries


def test_position_drift_threshold_is_inclusive() -> None:
    assert position_drift(drift_state(2.0**-8, 3 * 2.0**-8)) is not None  # exactly 3x
    assert position_drift(drift_state(2.0**-8, 2.9990234375 * 2.0**-8)) is None


def test_trend_needs_four_steps_and_real_growth() -> None:
    rising = [(s, {"rollout_corr/k3_kl": 1e-4 * 3.0**s}) for s in range(4)]
    assert mismatch_trend(rising[:3]) is None
    assert mismatch_trend(rising) is not None
    wobble = [(s, {"rollout_corr/k3_kl": 1e-4 * (1.3 if s % 2 else 0.8)}) for s in range(8)]
    assert mismatch_trend(wobble) is None


def test_detectors_stay_quiet_on_non_finite_log_ratios(tmp_path: Path) -> None:
    """-inf on both sides (NaN log-ratio) or an overflowing k3 leave the detectors silent, not crashing."""
    table = synthetic.generate("healthy", rows=256, steps=6, seed=4)
    data = table.to_pydict()
    data["old_log_prob"][3][0] = data["rollout_log_prob"][3][0] = float("-inf")
    data["rollout_log_prob"][5][1] = -100.0  # log-ratio ~100: exp overflows float32
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table(data, schema=table.schema), path)
    found = {f.code for f in rcdiag.analyze(path, explain=True).findings}
    assert not found & set(DETECTORS)
