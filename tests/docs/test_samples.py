"""The shipped sample dumps show what sample_data/README.md says, and the generator reproduces them."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES
from generator_model import expected
from severities import checked

import rcdiag

P = "rollout_corr/"


def assert_as_generated(path: Path, scenario: str, report: rcdiag.Report, keys: tuple[str, ...]) -> None:
    """The measured kl / k3_kl / token_mult_prob_error are where the generator's parameters put them: within
    four standard errors of the population mean implied by the scenario (tests/generator_model.py)."""
    mask = pq.read_table(path, columns=["response_mask"]).column("response_mask")
    tokens = int(pc.sum(pc.list_flatten(mask)).as_py())  # valid tokens, counted from the file itself
    model = expected(scenario)
    for key in keys:
        value = report.metrics.get(P + key, report.extras.get("rcdiag/" + key))
        assert model[key].holds(value, tokens), (key, value, model[key].bracket(tokens))


def codes(path: Path, config: rcdiag.CorrectionConfig | None = None) -> dict[str, tuple | None]:
    return {f.code: f.steps for f in checked(rcdiag.analyze(path, config).findings)}


def test_healthy_sample_is_quiet_under_every_preset() -> None:
    path = SAMPLES / "healthy.parquet"
    assert codes(path) == {}
    assert codes(path, rcdiag.CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")) == {}
    for name in ("decoupled_token_is", "decoupled_seq_is", "decoupled_token_icepop", "decoupled_k3_rs"):
        assert codes(path, rcdiag.preset(name)) == {}, name
    # RS presets tighter than outlier removal warn, at the steps where they reject more than one token in five
    # (counted by brute force from the file: seq_sum_k1 in [log 0.5, log 2], seq_mean_k1 in [log 0.999, log 1.001])
    for name, reduce, spec, steps in (
        ("decoupled_seq_is_rs", np.sum, "0.5_2.0", (4,)),
        ("decoupled_geo_rs", np.mean, "0.999_1.001", (0, 1, 2, 3, 4, 5)),
    ):
        assert rcdiag.preset(name).rollout_rs_threshold == spec
        shares = brute_rejected_share(path, reduce, spec)
        assert all(abs(share - 0.2) > 0.01 for share in shares.values())  # no step near the bound
        assert tuple(step for step, share in shares.items() if share > 0.2) == steps
        assert codes(path, rcdiag.preset(name)) == {"rs_rejects_most_tokens": steps}, name
        measured = [
            s.metrics[P + "rollout_rs_masked_fraction"] for s in rcdiag.analyze(path, rcdiag.preset(name)).steps
        ]
        assert measured == pytest.approx(list(shares.values()), rel=1e-9)
    report = rcdiag.analyze(path)
    assert_as_generated(path, "healthy", report, ("kl", "k3_kl", "token_mult_prob_error"))
    assert report.input.rows == 384 and report.input.steps == 6 and report.input.empty_rows == 2


def brute_rejected_share(path: Path, reduce: Callable[[np.ndarray], float], spec: str) -> dict[int, float]:
    """Per step, the share of valid tokens in responses whose k1 statistic (``reduce`` of -log-ratio over the
    response's valid tokens) falls outside the band ``L_U`` (bounds log L, log U rounded to float32, as verl)."""
    lo, hi = (float(np.float32(math.log(float(v)))) for v in spec.split("_"))
    data = pq.read_table(path).to_pydict()
    tokens: dict[int, int] = {}
    rejected: dict[int, int] = {}
    for old, rollout, mask, step in zip(
        *(data[k] for k in ("old_log_prob", "rollout_log_prob", "response_mask", "step")), strict=True
    ):
        d = (np.asarray(old, np.float32) - np.asarray(rollout, np.float32))[np.asarray(mask, bool)]
        tokens[step] = tokens.get(step, 0) + d.size
        outside = d.size > 0 and not lo <= float(reduce(-d.astype(np.float64))) <= hi
        rejected[step] = rejected.get(step, 0) + (d.size if outside else 0)
    return {step: rejected[step] / tokens[step] for step in sorted(tokens)}


def test_topk_offset_sample() -> None:
    path = SAMPLES / "topk_offset.parquet"
    found = codes(path)
    assert found == {
        "kl_high": (0, 1, 2, 3, 4, 5),
        "kl_k3_disagree": (0, 1, 2, 3, 4, 5),
        "mismatch_not_noise": None,  # 2% of the trainer's mass missing: not precision noise
        "logprob_offset": None,  # the bias detectors, on every analyze (their numbers: tests/findings/test_detectors.py)
        "sampling_truncation": None,
    }
    assert_as_generated(path, "topk_offset", rcdiag.analyze(path), ("kl", "k3_kl", "token_mult_prob_error"))


def test_forgotten_temperature_sample() -> None:
    path = SAMPLES / "train_forgot_temperature.parquet"
    found = codes(path)
    assert set(found) == {
        "kl_high", "chi2_token_high", "temperature_recorded_mismatch", "mismatch_not_noise", "temperature_mismatch"
    }  # fmt: skip
    assert found["kl_high"] == (0, 1, 2, 3, 4, 5)
    # the generator samples at T=0.6 and scores at T=1.0, and records both
    report = rcdiag.analyze(path)
    assert_as_generated(path, "train_forgot_temperature", report, ("kl", "k3_kl"))
    recorded = next(f for f in report.findings if f.code == "temperature_recorded_mismatch")
    assert (recorded.value, recorded.threshold, recorded.steps) == (1.0, 0.6, None)


def test_healthy_at_temperature_06_sample() -> None:
    path = SAMPLES / "healthy_t06.parquet"
    assert codes(path) == {}
    for name in ("decoupled_token_is", "decoupled_seq_is", "decoupled_token_icepop"):
        assert codes(path, rcdiag.preset(name)) == {}, name
    assert codes(path, rcdiag.preset("decoupled_geo_rs")) == {"rs_rejects_most_tokens": (0, 1, 2, 3, 4, 5)}
    assert min(brute_rejected_share(path, np.mean, "0.999_1.001").values()) > 0.21  # every step, by brute force
    report = rcdiag.analyze(path)
    assert_as_generated(path, "healthy_t06", report, ("kl", "k3_kl", "token_mult_prob_error"))
    assert report.input.metadata["temperature"] == "0.6"


def test_outliers_sample() -> None:
    path = SAMPLES / "outliers.parquet"
    assert codes(path) == {
        "chi2_token_high": (2,),
        "kl_k3_disagree": (2,),
        "sparse_outliers": (0, 1, 2, 3, 4, 5),  # 0.25% of the tokens carry >= 94% of k3_kl pooled
        "seq_is_hopeless": (0, 2),  # chi2_seq 5.1 pooled; above 2.33 (ESS 0.3) at steps 0 and 2
    }
    assert codes(path, rcdiag.preset("decoupled_seq_is"))["is_mean_out_of_range"] == (0, 2, 3, 5)
    report = rcdiag.analyze(path)
    assert_as_generated(path, "outliers", report, ("kl", "k3_kl", "token_mult_prob_error"))
    # the generator's outlier noise (4.0 on the logits, 0.3% of tokens) reaches log-ratios beyond 10
    assert report.extras["rcdiag/abs_log_ratio_max"] > 10


def test_every_generator_scenario_ships_as_a_sample() -> None:
    sys.path.insert(0, str(SAMPLES))
    import make_samples

    from rcdiag.io import synthetic

    assert {scenario for scenario, _ in make_samples.SAMPLES.values()} == set(synthetic.SCENARIOS)
    for filename in make_samples.SAMPLES:
        assert (SAMPLES / filename).stat().st_size < 1_500_000, filename


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    sys.path.insert(0, str(SAMPLES))
    import make_samples

    from rcdiag.io import synthetic

    for filename, (scenario, seed) in make_samples.SAMPLES.items():
        path = tmp_path / filename
        synthetic.write(synthetic.generate(scenario, rows=384, steps=6, seed=seed), path)
        assert rcdiag.analyze(path).metrics == rcdiag.analyze(SAMPLES / filename).metrics, filename
