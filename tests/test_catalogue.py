"""The catalogue is the one home of metric and finding facts, and everything that shows them reads it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT
from rich.console import Console

import rcdiag
from rcdiag.catalogue import FINDINGS, METRICS, PREFIX, every_key, finding, metric, reading
from rcdiag.catalogue.metrics import PACKS, packs_help, rs_option, step_columns
from rcdiag.check.metric_names import metric_names
from rcdiag.config import RS_OPTIONS, CorrectionConfig
from rcdiag.render.table import render_table

SOURCES = {path: path.read_text() for path in sorted((ROOT / "rcdiag").rglob("*.py"))}


def test_the_prefix_is_written_once() -> None:
    places = [path.name for path, text in SOURCES.items() for _ in re.finditer(r"[\"']rollout_corr/[\"']", text)]
    assert places == ["metrics.py"]


@pytest.mark.parametrize(
    "literal", ["(0.5, 2.0)", "ESS_MIN", "IS_STD_MAX", "KL_ABS_MAX", "CHI2_TOKEN_MAX", "IS_MEAN_RANGE", "1.05"]
)
def test_health_thresholds_live_only_in_the_catalogue(literal: str) -> None:
    places = [path.relative_to(ROOT).as_posix() for path, text in SOURCES.items() if literal in text]
    assert places in ([], ["rcdiag/catalogue/metrics.py"]), places


def test_every_computed_key_is_in_the_catalogue() -> None:
    everything = CorrectionConfig(
        rollout_is="token", rollout_is_threshold="0.5_2", rollout_is_batch_normalize=True,
        rollout_rs=",".join(RS_OPTIONS), rollout_rs_threshold="2",
    )  # fmt: skip
    keys = metric_names(everything.resolve())
    assert all(metric(key) is not None for key in keys)
    assert set(keys) <= set(every_key())
    assert metric("kl") is metric(PREFIX + "kl") and metric("no_such_metric") is None


def test_rs_templates_expand_to_each_option() -> None:
    assert rs_option(PREFIX + "rollout_rs_seq_mean_k1_masked_fraction") == "seq_mean_k1"
    assert metric("rollout_rs_token_k2_seq_fraction_low") is None  # k1 options only
    assert metric("rollout_rs_token_k1_seq_fraction_low") is not None
    per_option = [k for k in every_key() if rs_option(k) == "token_k1"]
    assert len(per_option) == 15 and len([k for k in every_key() if rs_option(k) == "token_k2"]) == 14


def test_catalogue_imports_without_typer_or_rich() -> None:
    code = "import sys, rcdiag.catalogue; assert not {'typer', 'rich'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_finding_codes_are_unique_and_thresholds_name_real_codes() -> None:
    codes = [spec.code for spec in FINDINGS]
    assert len(codes) == len(set(codes))
    for spec in METRICS:
        for threshold in spec.thresholds:
            assert threshold.finding is None or finding(threshold.finding).metric == spec.key
            assert set(threshold.packs) <= set(PACKS)


def test_readings_follow_the_thresholds() -> None:
    assert "fails rollout_is_mean in [0.5, 2]: systematic shift" in reading("rollout_is_mean", 2.5)
    assert "fails" not in reading("rollout_is_mean", 2.0)  # the bound itself holds
    assert "fails" not in reading("rollout_is_eff_sample_size", 0.3)
    assert "too low" in reading("rollout_is_eff_sample_size", 0.29)
    assert reading(PREFIX + "kl", -2e-3).endswith("moderate: typical of MoE or low-precision rollout")
    assert "likely a bug" in reading("kl", 0.2) and "likely a bug" not in reading("kl", 0.1)


def test_negative_chi2_reads_as_a_shift_not_a_small_spread() -> None:
    for key in ("chi2_token", "chi2_seq"):
        text = reading(key, -0.281)
        assert "mean ratio below 1" in text and "; small spread" not in text
    assert "small spread" in reading("chi2_token", 0.0)


def test_pack_help_and_step_columns_come_from_the_catalogue() -> None:
    text = packs_help()
    assert "`verl` (|kl| <= 0.1" in text and "rollout_is_eff_sample_size >= 0.3" in text
    assert "`miles-moe` (k3_kl <= 0.1)" in text
    assert step_columns("compare") == [PREFIX + "kl", PREFIX + "k3_kl", PREFIX + "chi2_token"]


def test_checklist_rows_come_from_the_finding_catalogue() -> None:
    path = ROOT / "sample_data" / "healthy.parquet"
    report = rcdiag.analyze(path, rcdiag.preset("decoupled_token_is"), explain=True)
    console = Console(width=400, record=True)
    render_table(report, console, details=True)
    text = console.export_text()
    for spec in FINDINGS:
        if spec.check is not None and "analyze" in spec.commands:
            assert spec.code in text
    plain = Console(width=400, record=True)
    render_table(rcdiag.analyze(path), plain, details=True)
    assert not any(spec.code in plain.export_text() for spec in FINDINGS if spec.explain)  # rows only with --explain
    assert "IS weights average near 1: rollout_is_mean in [0.5, 2]" in text
    assert "chi2_token <= 1" in text


def test_crash_codes_raised_by_accumulators_are_in_the_catalogue() -> None:
    raised = {code for text in SOURCES.values() for code in re.findall(r'VerlCrash\(\s*"(\w+)"', text)}
    assert raised == {"verl_crash_empty_batch", "verl_crash_ess_zero_division"}
    assert all(finding(code).severity == "error" for code in raised)


@pytest.mark.parametrize("name", list(PACKS))
def test_check_docs_give_each_pack_its_catalogue_bounds(name: str) -> None:
    from rcdiag.catalogue.metrics import pack_rules

    row = next(line for line in (ROOT / "docs" / "check.md").read_text().splitlines() if line.startswith(f"| `{name}`"))
    numbers = {float(n) for n in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", row)}
    for key, _kind, bound in pack_rules(name):
        assert f"`{key}`" in row and bound in numbers, (key, bound)


def test_a_crash_note_needs_a_catalogued_code() -> None:
    from rcdiag.metrics.base import VerlCrash

    assert VerlCrash("verl_crash_empty_batch", None, "no valid token").code == "verl_crash_empty_batch"
    with pytest.raises(KeyError):
        VerlCrash("verl_crash_not_in_the_catalogue", None, "")
