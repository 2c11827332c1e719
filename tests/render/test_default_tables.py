"""Issue 34, item 6: the design card's tables by default. ``rcdiag analyze`` prints, after the verdict, one
off-policy table, a row per configured IS/RS option with the share it truncates or rejects, and the health
warnings one line each; ``--details`` keeps every metric, the per-step table, the checklist and the full messages.
Every check runs the real CLI in a subprocess (tests/hostile.py ``run_capped``) and reads the values the table
must show from the JSON report of the same run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from conftest import ROOT, SAMPLES, block_after, ragged_lists, write_dump
from hostile import run_capped

from rcdiag.render.text import fmt

HEALTHY = SAMPLES / "healthy.parquet"
OUTLIERS = SAMPLES / "outliers.parquet"
QUANTIZED = SAMPLES / "quantized_4bit.parquet"
OFFPOLICY = ("kl", "k3_kl", "chi2_token", "chi2_seq", "training_ppl", "rollout_ppl")
RS_K1 = ("--rs", "token_k1", "--rs-threshold", "0.5_2.0")


def _both(*args: str | Path) -> tuple[str, dict]:
    """The terminal output and the JSON report of the same run."""
    text = run_capped("analyze", *args, "-q")
    assert text.returncode == 0 and text.stderr == "", text.stderr
    done = run_capped("analyze", *args, "-q", "--format", "json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return text.stdout, json.loads(done.stdout)


def _table(text: str, title: str) -> dict[str, list[str]]:
    """The rows of the table whose title starts with ``title``: first cell -> the row's cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if "│" not in line and "┃" not in line and "━" not in line:
            break
        if "│" in line:
            cells = [cell.strip() for cell in line.split("│")]
            assert cells[0] not in rows, f"{cells[0]} twice in {title}"
            rows[cells[0]] = cells
    return rows


def _m(report: dict, key: str) -> str:
    """A metric as the table must print it: the JSON's value, formatted as every rcdiag table formats numbers."""
    return fmt(report["metrics"]["rollout_corr/" + key])


def test_default_shows_the_offpolicy_table_with_the_json_values_and_no_is_rs_row_without_is_or_rs() -> None:
    out, report = _both(HEALTHY)
    rows = _table(out, "Off-policy (all 6 steps pooled)")
    assert list(rows) == list(OFFPOLICY)
    for key in OFFPOLICY:
        assert rows[key][1] == _m(report, key), key
    assert rows["kl"][2] == "✓ |kl| <= 0.1" and rows["chi2_token"][2] == "✓ chi2_token <= 1"
    extras = report["extras"]
    assert f"rcdiag: mean |log-ratio| {fmt(extras['rcdiag/abs_log_ratio_mean'])}" in out
    assert not any(key.startswith(("rollout_corr/rollout_is", "rollout_corr/rollout_rs")) for key in report["metrics"])
    assert "IS/RS" not in out and "RS combined" not in out and "ESS" not in out
    assert "Health warnings: none" in out.splitlines()
    # the verdict comes first, the tables follow it; nothing of --details
    assert out.index("verdict") < out.index("Off-policy") < out.index("Health warnings")
    for details_only in ("Off-policy diagnostics", "Per step", "Findings checklist", "rollout_corr/kl"):
        assert details_only not in out, details_only
    # every supporting number once: kl is in the table, not also in the line under the verdict
    assert out.count(_m(report, "kl")) == 1
    assert out.splitlines()[-1].endswith("--details")


def test_the_rs_option_the_user_asked_for_is_a_row_with_its_masked_fractions() -> None:
    out, report = _both(QUANTIZED, *RS_K1)
    rows = _table(out, "IS/RS: share truncated or rejected (all 6 steps pooled)")
    assert list(rows) == ["RS token_k1", "RS combined"]
    option = rows["RS token_k1"]
    assert option[1] == "ratio pi_train/pi_rollout in [0.5, 2]"
    assert option[2:4] == [_m(report, "rollout_rs_token_k1_masked_fraction"),
                           _m(report, "rollout_rs_token_k1_seq_masked_fraction")]  # fmt: skip
    assert option[2:4] == ["0.00199177", "0.358639"]  # the design card's values are not all 0
    combined = rows["RS combined"]
    assert combined[2:4] == [_m(report, "rollout_rs_masked_fraction"), _m(report, "rollout_rs_seq_masked_fraction")]
    assert combined[-1] == "✓"  # rs_rejects_most_tokens did not fire
    assert list(_table(out, "Off-policy")) == list(OFFPOLICY)


def test_is_rows_give_the_truncated_share_and_the_ess_and_several_rs_options_one_row_each() -> None:
    out, report = _both(OUTLIERS, "--is", "token", "--is-threshold", "2.0", "--rs", "seq_sum_k1,token_k3",
                        "--rs-threshold", "0.5_2,0.01")  # fmt: skip
    rows = _table(out, "IS/RS")
    assert list(rows) == ["IS token", "RS seq_sum_k1", "RS token_k3", "RS combined"]
    tis = rows["IS token"]
    assert tis[1:5] == ["TIS: weights clamped at 2", _m(report, "rollout_is_ratio_fraction_high"), "—",
                        _m(report, "rollout_is_eff_sample_size")]  # fmt: skip
    for option in ("seq_sum_k1", "token_k3"):
        assert rows[f"RS {option}"][2:4] == [_m(report, f"rollout_rs_{option}_masked_fraction"),
                                             _m(report, f"rollout_rs_{option}_seq_masked_fraction")]  # fmt: skip
    assert rows["RS token_k3"][1] == "k3 per token <= 0.01"
    # the ESS is the IS row's, not a second time in the off-policy table
    assert list(_table(out, "Off-policy")) == list(OFFPOLICY)
    assert out.count(_m(report, "rollout_is_eff_sample_size")) == 1


def test_icepop_at_sequence_level_gives_the_zeroed_share_of_tokens() -> None:
    out, report = _both(HEALTHY, "--is", "sequence", "--is-threshold", "0.5_5")
    (row,) = _table(out, "IS/RS").values()
    assert row[:5] == ["IS sequence", "IcePop: weights outside [0.5, 5] zeroed", _m(report, "rollout_is_oob_ratio"),
                       "—", _m(report, "rollout_is_eff_sample_size")]  # fmt: skip
    assert float(row[2]) > 0


def test_a_preset_gives_its_is_and_rs_rows_and_their_failed_checks() -> None:
    out, report = _both(SAMPLES / "topk_offset.parquet", "--preset", "decoupled_geo_rs_token_tis")
    rows = _table(out, "IS/RS")
    assert list(rows) == ["IS token", "RS seq_mean_k1", "RS combined"]
    assert rows["RS seq_mean_k1"][2] == _m(report, "rollout_rs_seq_mean_k1_masked_fraction") == "1"
    assert rows["RS combined"][-1] == "✗"  # rs_rejects_all_tokens, named under Health warnings
    assert _table(out, "Off-policy")["kl"][2] == "✗ |kl| <= 0.1 (kl_high)  ✗ kl_k3_disagree"


def test_health_warnings_are_each_warning_and_error_once_on_one_line() -> None:
    out, report = _both(OUTLIERS)
    lines = out.splitlines()
    warned = [f for f in report["findings"] if f["severity"] in ("warning", "error")]
    assert {f["code"] for f in warned} == {"chi2_token_high", "kl_k3_disagree", "sparse_outliers"}
    heading = lines.index("Health warnings")
    listed = lines[heading + 1 : heading + 1 + len(warned)]
    for finding, line in zip(warned, listed, strict=True):
        assert line.startswith(f"{finding['severity'].upper()} [{finding['code']}] "), line
        assert len(line) <= 160  # one line of the piped width, cut with … rather than wrapped
    assert listed[0] == "WARNING [chi2_token_high] 3166.38 (1 step: 2): fails chi2_token <= 1"
    assert lines[heading + 1 + len(warned)].endswith("--details")
    # the messages' advice is not printed by default (the verdict's next steps carry it); info is not a warning
    for finding in report["findings"]:
        assert finding["message"] not in " ".join(out.split())
    assert "seq_is_hopeless" in out and "INFO" not in out  # named in the table and the next steps only
    assert sum(line.startswith(("WARNING", "ERROR")) for line in lines) == len(warned)


def test_details_still_show_every_metric_the_per_step_table_the_checklist_and_every_message() -> None:
    args = (OUTLIERS, "--is", "token", "--is-threshold", "2.0", *RS_K1, "--details")
    out, report = _both(*args)
    flat = " ".join(out.split())
    for title in ("Off-policy diagnostics (all steps pooled)", "IS weights, token level (TIS: weights clamped at 2)",
                  "RS token_k1: keeps ratio pi_train/pi_rollout in [0.5, 2]", "Rejection sampling, all options",
                  "rcdiag diagnostics (not verl keys)", "Per step (what verl logged at each step)",
                  "Findings checklist"):  # fmt: skip
        assert title in out, title
    for key, value in {**report["metrics"], **report["extras"]}.items():
        assert re.search(rf"^{re.escape(key)} +│ +{re.escape(fmt(value))} │", out, re.M), key
    for finding in report["findings"]:
        assert f"{finding['severity'].upper()} [{finding['code']}] {finding['message']}" in flat, finding["code"]
    # the supporting metrics under the verdict as before, and not the default view's tables a second time
    assert f"kl {_m(report, 'kl')}  ·  k3_kl" in out
    for default_only in ("IS/RS", "Health warnings", "Off-policy (all"):
        assert default_only not in out, default_only


def test_a_dump_without_steps_and_a_non_finite_metric(tmp_path: Path) -> None:
    """No step column: the titles say nothing is pooled; a metric without a finite value (JSON null) is "—" and
    its rule untested."""
    old = np.full((4, 8), -1.0)
    rollout = old - 0.01
    rollout[0, 0] = -np.inf  # legal: the rollout gave the token probability 0
    dump = write_dump(tmp_path / "d.parquet", ragged_lists(old, rollout, np.ones(old.shape, dtype=bool)))
    out, report = _both(dump, *RS_K1)
    rows = _table(out, "Off-policy")
    assert "Off-policy" in [line.rstrip() for line in out.splitlines()] and "pooled" not in out
    for key in OFFPOLICY:
        assert rows[key][1] == _m(report, key), key  # fmt(None) is "—", as in --details
    assert [key for key in OFFPOLICY if rows[key][1] == "—"] == ["kl", "k3_kl", "rollout_ppl"]
    assert rows["kl"][2] == "– |kl| <= 0.1 (no value)"  # not tested, so not a ✓
    assert rows["chi2_token"][1] == "7.35579e+15" and rows["chi2_token"][2] == "✗ chi2_token <= 1 (chi2_token_high)"
    assert "WARNING [logprob_neg_inf] " in out
    assert list(_table(out, "IS/RS")) == ["RS token_k1", "RS combined"]


def test_readme_default_examples_are_what_analyze_prints_today() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in ("rcdiag analyze sample_data/healthy.parquet --rs token_k1 --rs-threshold 0.5_2.0",
                    "rcdiag analyze sample_data/topk_offset.parquet --preset decoupled_token_is"):  # fmt: skip
        done = run_capped(*command.split()[1:], "-q", cwd=ROOT)
        assert done.returncode == 0, done.stderr
        printed = {line.rstrip() for line in done.stdout.splitlines()}
        quoted = [line.rstrip() for line in block_after(readme, command) if line != "..."]
        assert len(quoted) >= 10 and [line for line in quoted if line not in printed] == [], command
