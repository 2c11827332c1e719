"""The input findings, RS over-rejection and the kl/k3_kl noise test: triggers, boundaries and false alarms."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, padded_chunk, rows_with_ratios, run_padded
from generator_model import expected
from severities import checked

import rcdiag
from rcdiag.diagnosis.health import Context, _kl_k3, kl_k3_critical
from rcdiag.io import synthetic
from rcdiag.io.screen import ScreenStats
from rcdiag.metrics.batch import BatchResult

P = "rollout_corr/"


def by_code(report: rcdiag.Report) -> dict[str, rcdiag.Finding]:
    return {f.code: f for f in checked(report.findings)}


# ------------------------------------------------------------------------------------------ kl_k3_disagree


def normal_upper_quantile(tail: float) -> float:
    """z with P(|Z| > z) = tail, by bisection on erfc (independent of statistics.NormalDist)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2)) > tail else (lo, mid)
    return lo


@pytest.mark.parametrize("tests", [1, 8, 1000])
def test_critical_z_holds_the_dump_wide_false_alarm_rate(tests: int) -> None:
    per_test = 1 - (1 - 1e-4) ** (1 / tests)
    assert kl_k3_critical(tests) == pytest.approx(normal_upper_quantile(per_test), abs=1e-6)
    assert kl_k3_critical(1) == pytest.approx(3.8906, abs=1e-4)  # two-sided 1e-4, a table value
    assert kl_k3_critical(1, dof=10) == pytest.approx(6.2111, abs=1e-3)  # t_10, two-sided 1e-4 (tables)
    assert kl_k3_critical(tests, dof=1e7) == pytest.approx(kl_k3_critical(tests), rel=1e-5)


def batch(kl: float, k3: float, se: float, responses: float = 1e9) -> BatchResult:
    metrics = {P + "kl": kl, P + "k3_kl": k3}
    extras = {"rcdiag/kl_std_error": se, "rcdiag/kl_std_error_dof": responses}
    return BatchResult(metrics, extras, {**metrics, **extras}, (), 10, 100, 0)


def test_kl_k3_boundary_is_the_noise_limit() -> None:
    se, steps = 1e-3, 8
    limit = kl_k3_critical(steps, 1e9 - 1) * se  # above half the KL and the floor
    assert _kl_k3(batch(limit, 0.0, se), Context(steps)) == []  # a gap exactly on the limit holds
    assert _kl_k3(batch(1e-3 + limit * 0.999, 1e-3, se), Context(steps)) == []
    (hit,) = _kl_k3(batch(1e-3 + limit * 1.001, 1e-3, se), Context(steps))
    assert hit.threshold == pytest.approx(limit)
    assert f"{limit * 1.001 / se:.1f} standard errors" in hit.facts and "8 batches" in hit.facts
    # the same gap is noise when 1000 steps are tested at once
    assert _kl_k3(batch(1e-3 + limit * 1.001, 1e-3, se), Context(1000)) == []


def test_kl_k3_limit_grows_when_few_responses_carry_the_noise() -> None:
    se = 1e-3
    gap = 5.0 * se  # beyond the normal limit for one batch (3.89), within t with 9 degrees of freedom (6.59)
    assert _kl_k3(batch(1e-3 + gap, 1e-3, se), Context(1))
    assert _kl_k3(batch(1e-3 + gap, 1e-3, se, responses=10), Context(1)) == []
    assert _kl_k3(batch(1.0, 0.0, 0.0, responses=1.5), Context(1)) == []  # one response: no noise estimate


def test_kl_k3_needs_the_gap_to_be_half_the_kl_too() -> None:
    # 100 standard errors, but a gap of 0.4 of the KL: significant and too small to matter
    assert _kl_k3(batch(1.0e-2, 0.6e-2, 4e-5), Context(1)) == []
    assert _kl_k3(batch(1.0e-2, 0.4e-2, 4e-5), Context(1))  # 0.6 of the KL


@pytest.mark.parametrize("scenario", ["healthy", "healthy_t06"])
@pytest.mark.parametrize("steps", [1, 4, 16, 32])
def test_no_false_kl_k3_alarm_on_clean_dumps(scenario: str, steps: int, tmp_path: Path) -> None:
    """424 clean batches of 48 responses in 32 dumps: the dump-wide rate is 1e-4, so any alarm is a bug."""
    for seed in range(4):
        table = synthetic.generate(scenario, rows=48 * steps, steps=steps, seed=seed, median_length=40)
        synthetic.write(table, tmp_path / "d.parquet")
        report = rcdiag.analyze(tmp_path / "d.parquet")
        assert report.findings == (), (seed, [f.message for f in report.findings])


def test_the_issue_seeds_no_longer_fire(tmp_path: Path) -> None:
    """8 steps of 48 responses at T=1 fired kl_k3_disagree at 2.4 standard errors before the noise test."""
    for seed in (0, 32):
        synthetic.write(synthetic.generate("healthy", rows=384, steps=8, seed=seed), tmp_path / "d.parquet")
        assert "kl_k3_disagree" not in by_code(rcdiag.analyze(tmp_path / "d.parquet"))


def test_topk_sample_still_fires_with_the_number_of_standard_errors() -> None:
    report = rcdiag.analyze(ROOT / "sample_data" / "topk_offset.parquet")
    found = by_code(report)["kl_k3_disagree"]
    assert found.steps == (0, 1, 2, 3, 4, 5) and "6 batches" in found.message
    # the quoted gap is the generator's: 1 - the trainer's mass on the rollout's top-k (tests/generator_model.py)
    model = expected("topk_offset")
    quoted = re.search(
        r"= 1 - mean\(ratio\) = ([\d.]+), ([\d.]+) standard errors of kl \(rcdiag/kl_std_error = ([\d.e-]+)",
        found.message,
    )
    assert quoted is not None, found.message
    gap, sigmas, se = (float(v) for v in quoted.groups())
    assert gap == pytest.approx(model["kl"].mean - model["k3_kl"].mean, abs=0.005)  # ~0.168, per step
    assert sigmas == pytest.approx(gap / se, rel=0.01) and sigmas > 50


# ------------------------------------------------------------------------------------------ RS rejecting most


def test_rs_rejects_most_tokens_boundary_and_names_the_option() -> None:
    # token_k1 with 0.5_2.0 keeps ratios in [0.5, 2]: a ratio of 3 is rejected
    at_share = rows_with_ratios([[3.0], [1.0], [1.0], [1.0], [1.0]])  # 1 of 5 = 0.2 exactly: holds
    report = run_padded(*at_share, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    assert report.metrics[P + "rollout_rs_masked_fraction"] == 0.2
    assert "rs_rejects_most_tokens" not in by_code(report)
    above = rows_with_ratios([[3.0], [1.0], [1.0], [1.0]])  # 1 of 4
    report = run_padded(*above, rollout_rs="token_k1,seq_max_k3", rollout_rs_threshold="0.5_2.0,10")
    found = by_code(report)["rs_rejects_most_tokens"]
    assert found.value == 0.25 and found.threshold == 0.2 and found.metric == P + "rollout_rs_masked_fraction"
    assert "token_k1 rejects the most on its own (25.0%)" in found.message and "rcdiag sweep" in found.message
    # a sequence option: its share of tokens (2 of 7), not its share of rows (2 of 4)
    short_rows = rows_with_ratios([[0.2], [0.2], [1.0] * 3, [1.0, 1.0]])
    report = run_padded(*short_rows, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.5_2.0")
    assert report.metrics[P + "rollout_rs_seq_mean_k1_seq_masked_fraction"] == 0.5
    assert "seq_mean_k1 rejects the most on its own (28.6%)" in by_code(report)["rs_rejects_most_tokens"].message
    everything = rows_with_ratios([[3.0], [3.0]])
    codes = by_code(run_padded(*everything, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"))
    assert "rs_rejects_all_tokens" in codes and "rs_rejects_most_tokens" not in codes


# ------------------------------------------------------------------------------------------ the mask


def test_mask_looks_inverted_boundary() -> None:
    half = rows_with_ratios([[1.0]] * 3 + [[]] * 3)  # 3 of 6 rows empty: exactly half, holds
    assert "mask_looks_inverted" not in by_code(run_padded(*half))
    most = rows_with_ratios([[1.0]] * 3 + [[]] * 4)
    found = by_code(run_padded(*most))["mask_looks_inverted"]
    assert found.value == pytest.approx(4 / 7) and found.threshold == 0.5 and found.steps is None
    assert "4 of 7 rows have no valid token" in found.message and "--mask-col" in found.message


def test_an_inverted_mask_is_flagged() -> None:
    lengths = np.array([30] * 30 + [10] * 10)  # most responses fill their row
    mask = (np.arange(30)[None, :] < lengths[:, None]).astype(np.int64)
    rng = np.random.default_rng(3)
    old = (-rng.random((40, 30))).astype(np.float32)
    rollout = old + rng.normal(0, 0.01, (40, 30)).astype(np.float32)
    rollout = np.minimum(rollout, 0.0)
    assert "mask_looks_inverted" not in by_code(run_padded(old, rollout, mask))
    found = by_code(run_padded(old, rollout, 1 - mask))["mask_looks_inverted"]
    assert "30 of 40 rows have no valid token" in found.message and "200 of 1,200 tokens are valid" in found.message


def nemo_rl_file(path: Path, with_mask: bool) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w") as handle:
        for i in range(4):
            lp = (-rng.random(8)).round(4).tolist()
            record = {"prev_logprobs": [lp], "generation_logprobs": [lp], "idx": i}
            if with_mask:
                record["token_loss_mask"] = [[0, 0, 0] + [1] * 5]
            handle.write(json.dumps(record) + "\n")


def test_mask_missing_in_a_format_with_prompts(tmp_path: Path) -> None:
    path = tmp_path / "train_data_step1.jsonl"
    nemo_rl_file(path, with_mask=False)
    found = by_code(rcdiag.analyze(path))["mask_missing"]
    assert "32 valid tokens of 32" in found.message and "--mask-col" in found.message
    nemo_rl_file(tmp_path / "train_data_step2.jsonl", with_mask=False)
    assert "mask_missing" in by_code(rcdiag.analyze(tmp_path))  # "nemo-rl, 2 files"
    nemo_rl_file(path, with_mask=True)
    assert rcdiag.analyze(path).findings == ()


def test_mask_missing_in_prime_rl_exports(tmp_path: Path) -> None:
    step = tmp_path / "token_exports" / "step_0"
    step.mkdir(parents=True)
    record = {"step": 0, "inference_logprobs": [-0.5, -1.0, -0.2], "trainer_logprobs": [-0.5, -1.0, -0.2]}
    (step / "rank_0.jsonl").write_text(json.dumps(record) + "\n")
    assert "mask_missing" in by_code(rcdiag.analyze(tmp_path))
    record["loss_mask"] = [False, True, True]
    (step / "rank_0.jsonl").write_text(json.dumps(record) + "\n")
    assert "mask_missing" not in by_code(rcdiag.analyze(tmp_path))


def test_a_format_without_prompts_needs_no_mask(tmp_path: Path) -> None:
    from conftest import write_dump

    path = write_dump(tmp_path / "d.parquet", {"old_log_prob": [[-1.0, -2.0]], "rollout_log_prob": [[-1.0, -2.0]]})
    assert rcdiag.analyze(path).findings == ()


# ------------------------------------------------------------------------------------------ -inf log-probs


def test_neg_inf_log_probs_give_one_finding_with_the_first_position() -> None:
    old, rollout, mask = rows_with_ratios([[1.0] * 4] * 3)
    rollout[1, 2] = -np.inf
    old[2, 0] = -np.inf
    steps = np.array([0, 0, 1])
    report = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask, steps=steps)])
    codes = by_code(report)
    assert "metric_not_finite" not in codes
    found = codes["logprob_neg_inf"]
    assert found.value == 2 and found.steps is None
    assert "1 in old_log_prob and 1 in rollout_log_prob" in found.message
    assert "the first is in rollout_log_prob at row 1, position 2" in found.message
    assert found.detail is not None and found.detail["step 0: rollout_corr/kl"] == "-inf"
    assert found.detail["step 1: rollout_corr/kl"] == "inf"
    assert report.to_dict()["findings"][0]["detail"] == found.detail or any(
        f["detail"] == found.detail for f in report.to_dict()["findings"]
    )


def test_neg_inf_first_position_merges_to_the_earliest() -> None:
    a = ScreenStats(neg_inf_first={"old_log_prob": [7, 1]})
    b = ScreenStats(neg_inf_first={"old_log_prob": [3, 9], "rollout_log_prob": [5, 0]})
    merged = a.merge(b)
    assert merged.neg_inf_first == {"old_log_prob": [3, 9], "rollout_log_prob": [5, 0]}
    assert ScreenStats.from_dict(merged.to_dict()).neg_inf_first == merged.neg_inf_first


# ------------------------------------------------------------------------------------------ temperatures


def test_analyze_reports_differing_recorded_temperatures(tmp_path: Path) -> None:
    table = synthetic.generate(synthetic.with_overrides("healthy", t_train=0.7), rows=24, steps=1, seed=1)
    synthetic.write(table, tmp_path / "d.parquet")
    found = by_code(rcdiag.analyze(tmp_path / "d.parquet"))["temperature_recorded_mismatch"]
    assert (found.value, found.threshold, found.severity) == (0.7, 1.0, "warning")
    same = synthetic.generate(synthetic.with_overrides("healthy", t_rollout=0.7, t_train=0.7), rows=24, steps=1)
    synthetic.write(same, tmp_path / "d.parquet")
    assert "temperature_recorded_mismatch" not in by_code(rcdiag.analyze(tmp_path / "d.parquet"))


# ------------------------------------------------------------------------------------------ end to end


def test_cli_json_carries_the_input_findings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from conftest import write_dump

    from rcdiag.cli import main

    inf = float("-inf")
    path = write_dump(
        tmp_path / "d.parquet",
        {
            "old_log_prob": [[-1.0, -1.0, -1.0]] * 2 + [[-1.0, inf, -1.0]],
            "rollout_log_prob": [[-1.0, -1.0, -1.0]] * 3,
            "response_mask": [[0, 0, 0]] * 2 + [[1, 1, 0]],  # 2 of 3 rows empty
        },
        metadata={"temperature": "0.6", "train_temperature": "1"},
    )
    with pytest.raises(SystemExit) as info:
        main(["analyze", str(path), "--format", "json"])
    assert not info.value.code
    report = json.loads(capsys.readouterr().out)
    found = {f["code"]: f for f in report["findings"]}
    assert set(found) == {"mask_looks_inverted", "temperature_recorded_mismatch", "logprob_neg_inf"}
    assert found["logprob_neg_inf"]["detail"]["rollout_corr/kl"] == "inf"
    assert "row 2, position 1" in found["logprob_neg_inf"]["message"]
    assert report["input"]["neg_inf_first"] == {"old_log_prob": [2, 1]}
    with pytest.raises(SystemExit):
        main(["analyze", str(path)])
    out = capsys.readouterr().out
    assert "[logprob_neg_inf]" in out and "metric_not_finite]" not in out


def test_topk_table_reads_negative_chi2_as_a_shift(capsys: pytest.CaptureFixture) -> None:
    from rcdiag.cli import main

    with pytest.raises(SystemExit):
        main(["analyze", str(ROOT / "sample_data" / "topk_offset.parquet"), "--details"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("rollout_corr/chi2_token"))
    assert "-0.28" in row and "negative" in row and "small spread" not in row
