"""The verdict (docs/verdict.md): status and cause class on real-model dumps with one planted cause each, on the
samples and on issue 24's dumps; the prescription's effect against a brute-force count over the dump's arrays; every
prescription run back through ``rcdiag analyze`` raises none of analyze's own findings; the terminal opens with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SAMPLES
from dumps24 import long_biased

import rcdiag
from rcdiag.catalogue import FINDINGS
from rcdiag.diagnosis.prescribe import OUTLIER_BAND_NATS, REVIEW_CODES, TIS_THRESHOLD, outlier_band
from rcdiag.diagnosis.verdict import STATUS_OF
from rcdiag.records.report import Report

REAL = {
    # scenario: (status, cause classes, prescribed RS option or None)
    "clean_fp32": ("healthy", [], None),
    "bf16": ("healthy", [], None),  # k3_kl 1.3e-4: inside the dense bf16 range (NOISE_K3_MAX)
    "int4": ("correct", ["noise"], None),
    "spikes": ("correct", ["outliers"], "token_k1"),
    "rope_low_precision": ("correct", ["outliers"], "token_k1"),  # its late-position errors are sparse and huge
    "topk_50": ("fix", ["truncation"], None),  # kl - k3_kl = 1 - mean ratio: 2.2% of the mass renormalised away
    "topp_0.95": ("fix", ["truncation"], None),
    "swapped_int4": ("broken", ["swapped_columns"], None),
}
SAMPLE = {
    "healthy": ("healthy", []),
    "healthy_t06": ("healthy", []),
    "quantized_4bit": ("correct", ["noise"]),
    "outliers": ("correct", ["outliers"]),
    "topk_offset": ("fix", ["truncation"]),
    "rollout_temperature_only": ("fix", ["temperature"]),
    "train_forgot_temperature": ("fix", ["temperature"]),
}
"""The default analyze (the recorded temperatures, the kl/k3 gap and the bias detectors decide these)."""
SAMPLE_EXPLAINED = {
    "position_drift": ("fix", ["position"]),
    "step_trend": ("fix", ["trend"]),
    "topk_offset": ("fix", ["truncation"]),
    "train_forgot_temperature": ("fix", ["temperature"]),
}


def _classes(report: Report) -> list[str]:
    assert report.verdict is not None
    return [cause.cls for cause in report.verdict.causes]


@pytest.mark.parametrize("scenario", sorted(REAL))
def test_real_model_dumps_get_their_status_and_class(real_dumps: dict, scenario: str) -> None:
    status, classes, rs = REAL[scenario]
    report = rcdiag.analyze(real_dumps[scenario]["path"])
    verdict = report.verdict
    assert verdict is not None
    assert (verdict.status, _classes(report)) == (status, classes), verdict.headline
    assert verdict.headline.startswith(status + ":")
    if status == "correct":
        assert verdict.recommendation is not None and verdict.recommendation.effect is not None
        assert verdict.recommendation.config.rollout_is == "token"
        assert verdict.recommendation.config.rollout_rs == rs
        assert verdict.recommendation.preset == (None if rs else "decoupled_token_is")
    else:
        assert verdict.recommendation is None
    # the bias detectors ran (every analyze runs them): nothing "not examined"; what did not run says why
    assert not any("not examined" in step for step in verdict.next_steps)
    assert any(step.startswith("token_specific not run: ") for step in verdict.next_steps)


REAL_EXPLAINED = {
    "temperature_0.9": ("fix", ["temperature"]),  # kl 5.5e-3 on ~44k tokens: temperature_mismatch's sign test
    "temperature_0.7": ("fix", ["temperature"]),
    "topk_50": ("fix", ["truncation"]),
    "topp_0.95": ("fix", ["truncation"]),
    "swapped_int4": ("broken", ["swapped_columns"]),  # the sign-reading detectors name nothing on swapped columns
    "drift": ("fix", ["trend"]),  # weights drifting from identical at step 0 (k3_kl at float rounding there)
    "clean_fp32": ("healthy", []),
    "bf16": ("healthy", []),
}
"""The detectors name the bug the size alone cannot: in the default analyze (which runs them) as with --explain."""


@pytest.mark.parametrize("explain", [False, True], ids=["default", "explain"])
@pytest.mark.parametrize("scenario", sorted(REAL_EXPLAINED))
def test_real_model_dumps_name_the_planted_bug(real_dumps: dict, scenario: str, explain: bool) -> None:
    report = rcdiag.analyze(real_dumps[scenario]["path"], explain=explain)
    assert report.verdict is not None
    assert (report.verdict.status, _classes(report)) == REAL_EXPLAINED[scenario], report.verdict.headline
    assert not any("not examined" in step for step in report.verdict.next_steps)


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_samples_get_their_status_and_class(name: str) -> None:
    report = rcdiag.analyze(SAMPLES / f"{name}.parquet")
    assert report.verdict is not None
    assert (report.verdict.status, _classes(report)) == SAMPLE[name], report.verdict.headline


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_causes_cite_only_findings_that_fired(name: str) -> None:
    """The verdict never contradicts the checklist: every code a cause cites is a finding of the report (a ✗ row)."""
    report = rcdiag.analyze(SAMPLES / f"{name}.parquet")
    assert report.verdict is not None
    fired = {f.code for f in report.findings}
    for cause in report.verdict.causes:
        assert set(cause.codes) <= fired, cause
    if report.verdict.status == "healthy":
        bugs = {spec.code for spec in FINDINGS if spec.cause is not None and STATUS_OF[spec.cause] != "correct"}
        assert not fired & bugs


@pytest.mark.parametrize("explain", [False, True], ids=["default", "explain"])
@pytest.mark.parametrize("name", sorted(SAMPLE_EXPLAINED))
def test_samples_name_the_detected_bug(name: str, explain: bool) -> None:
    report = rcdiag.analyze(SAMPLES / f"{name}.parquet", explain=explain)
    assert report.verdict is not None
    status, classes = SAMPLE_EXPLAINED[name]
    assert report.verdict.status == status and set(classes) <= set(_classes(report)), report.verdict.headline
    assert report.verdict.recommendation is None  # no threshold repairs a bug
    assert any(step.startswith("fix ") for step in report.verdict.next_steps)


def test_saturated_sequence_is_is_never_read_as_healthy(tmp_path: Path) -> None:
    """issue 24: decoupled_seq_is on long biased responses: every weight truncated, every IS check passing."""
    path = long_biased(tmp_path / "long.parquet")
    report = rcdiag.analyze(path, rcdiag.preset("decoupled_seq_is"))
    assert report.verdict is not None
    assert "saturated_is" in _classes(report)
    assert report.verdict.status != "healthy"
    # this dump's kl is negative beyond noise (the bias puts the trainer above the rollout): swapped columns too
    assert report.verdict.status == "broken" and _classes(report)[0] == "swapped_columns"


def test_a_saturating_token_threshold_gets_token_tis_prescribed() -> None:
    """issue 24: ``--is token --is-threshold 0.5`` gives a mean of exactly 0.5; the verdict prescribes TIS 2.0 and
    measures it on the dump."""
    config = rcdiag.CorrectionConfig(rollout_is="token", rollout_is_threshold=0.5)
    report = rcdiag.analyze(SAMPLES / "healthy.parquet", config)
    verdict = report.verdict
    assert verdict is not None and verdict.status == "correct" and _classes(report) == ["saturated_is"]
    assert verdict.recommendation is not None and verdict.recommendation.preset == "decoupled_token_is"
    effect = verdict.recommendation.effect
    assert effect is not None and effect.is_truncated_share is not None and effect.is_truncated_share < 0.01
    reference = rcdiag.analyze(SAMPLES / "healthy.parquet", rcdiag.preset("decoupled_token_is"))
    assert effect.is_ess == reference.metrics["rollout_corr/rollout_is_eff_sample_size"]


def _arrays(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Valid tokens' log-ratios (float32, as the dump holds them), their response index, and the response count."""
    table = pq.read_table(path)
    old = table.column("old_log_prob").combine_chunks()
    rollout = table.column("rollout_log_prob").combine_chunks()
    lengths = np.diff(np.asarray(old.offsets))
    response = np.repeat(np.arange(len(lengths)), lengths)
    lr = old.values.to_numpy().astype(np.float32) - rollout.values.to_numpy().astype(np.float32)
    if "response_mask" in table.column_names:
        mask = table.column("response_mask").combine_chunks().values.to_numpy().astype(bool)
        lr, response = lr[mask], response[mask]
    return lr, response, len(lengths)


def test_effect_matches_a_brute_force_count(real_dumps: dict) -> None:
    """spikes: token TIS 2.0 + token_k1 on |log-ratio| <= 1: the rejected tokens and responses, the truncated share
    and the ESS, counted over the dump's arrays with numpy."""
    path = real_dumps["spikes"]["path"]
    verdict = rcdiag.analyze(path).verdict
    assert verdict is not None and verdict.recommendation is not None
    assert verdict.recommendation.config.rollout_rs_threshold == outlier_band()
    effect = verdict.recommendation.effect
    assert effect is not None
    lr, response, rows = _arrays(path)
    lower, upper = (float(v) for v in outlier_band().split("_"))
    # verl's k1 keeps log L <= -lr <= log U (compared in float32)
    keep = (np.float32(np.log(lower)) <= -lr) & (-lr <= np.float32(np.log(upper)))
    rejected = ~keep
    assert abs(np.log(upper) - OUTLIER_BAND_NATS) < 1e-3
    assert effect.tokens_rejected == pytest.approx(rejected.mean(), abs=0.5 / lr.size)
    assert effect.responses_rejected == pytest.approx(np.unique(response[rejected]).size / rows, abs=1e-12)
    raw = np.exp(np.clip(lr.astype(np.float64), -20.0, 20.0))
    weights = np.minimum(raw, TIS_THRESHOLD)
    assert effect.is_truncated_share == pytest.approx((raw > TIS_THRESHOLD).mean(), abs=0.5 / lr.size)
    ess = weights.mean() ** 2 / (weights**2).mean()
    assert effect.is_ess == pytest.approx(ess, rel=1e-5)


def _cli_analyze(path: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(path), *args, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("scenario", ["int4", "spikes"])
def test_every_prescription_passes_analyzes_own_findings(real_dumps: dict, scenario: str) -> None:
    """The prescribed setting, given to ``rcdiag analyze`` on the same dump, raises none of the findings a
    prescription is checked against, and its metrics are the effect the verdict quoted (no second pass then)."""
    path = real_dumps[scenario]["path"]
    prescribed = _cli_analyze(path)["verdict"]["recommendation"]
    config = prescribed["config"]
    args = ["--is", config["rollout_is"], "--is-threshold", str(config["rollout_is_threshold"])]
    if config["rollout_rs"] is not None:
        args += ["--rs", config["rollout_rs"], "--rs-threshold", str(config["rollout_rs_threshold"])]
    under = _cli_analyze(path, *args)
    assert not {f["code"] for f in under["findings"]} & set(REVIEW_CODES)
    assert "FLAGGED" not in prescribed["why"]
    metrics = under["metrics"]
    assert prescribed["effect"]["is_ess"] == metrics["rollout_corr/rollout_is_eff_sample_size"]
    assert prescribed["effect"]["is_truncated_share"] == metrics["rollout_corr/rollout_is_ratio_fraction_high"]
    assert under["verdict"]["recommendation"]["effect"] == prescribed["effect"]


def test_terminal_opens_with_the_verdict_and_details_show_the_tables() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLES / "quantized_4bit.parquet"), *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    terse = run()
    lines = terse.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("verdict"))
    assert "CORRECT" in lines[first] and lines[first + 1].startswith("correct:")
    assert first < 8  # after the header lines only
    assert "rollout_is: token" in terse and "measured on this dump: tokens rejected" in terse
    assert "Off-policy diagnostics" not in terse and "Findings checklist" not in terse
    assert "--details" in terse
    detailed = run("--details")
    assert detailed.index("verdict") < detailed.index("Off-policy diagnostics") < detailed.index("Findings checklist")


def test_compare_gives_a_verdict_per_side() -> None:
    from rcdiag.compare import compare

    comparison = compare(SAMPLES / "healthy.parquet", SAMPLES / "quantized_4bit.parquet")
    out = comparison.to_dict()
    assert out["verdicts"]["a"]["status"] == "healthy" and out["verdicts"]["b"]["status"] == "correct"
    assert out["verdicts"]["b"] == out["b"]["verdict"]
    assert out["verdicts"]["b"]["recommendation"]["effect"]["is_ess"] is not None


def test_every_cause_class_has_a_status() -> None:
    assert {spec.cause for spec in FINDINGS if spec.cause is not None} <= set(STATUS_OF)


def test_a_prescription_that_raises_a_finding_is_flagged() -> None:
    """effect_of reads the effect from the report computed under the setting and flags what it raises (here a
    token threshold of 0.5, which saturates: is_saturated)."""
    from rcdiag.diagnosis.prescribe import effect_of

    config = rcdiag.CorrectionConfig(rollout_is="token", rollout_is_threshold=0.5)
    under = rcdiag.analyze(SAMPLES / "healthy.parquet", config)
    assert "is_saturated" in {f.code for f in under.findings}
    verdict = rcdiag.analyze(SAMPLES / "quantized_4bit.parquet").verdict
    assert verdict is not None and verdict.recommendation is not None
    flagged, steps, remedy = effect_of(verdict.recommendation, under)
    assert "FLAGGED" in flagged.why and "is_saturated" in flagged.why
    assert steps and "is_saturated" in steps[0] and remedy  # no RS: no response rejected
    assert flagged.effect is not None
    assert flagged.effect.is_truncated_share == under.metrics["rollout_corr/rollout_is_ratio_fraction_high"]


def test_merged_states_have_no_dump_to_measure_and_say_so(tmp_path: Path) -> None:
    from rcdiag.render.verdict_text import effect_text

    state = tmp_path / "s.json"
    rcdiag.analyze(SAMPLES / "quantized_4bit.parquet", save_state=state)
    merged = rcdiag.merge_states([state])
    assert merged.verdict is not None and merged.verdict.status == "correct"
    assert merged.verdict.recommendation is not None and merged.verdict.recommendation.effect is None
    assert effect_text(merged.verdict.recommendation.effect).startswith("effect not measured")
