"""The catalogue is the one home of metric and finding facts, and everything that shows them reads it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT
from rich.console import Console

import rcdiag
from rcdiag import api
from rcdiag.catalogue import FINDINGS, METRICS, PREFIX, Key, every_key, finding, framework_key, metric, reading, rs_key
from rcdiag.catalogue.metrics import PACKS, packs_help, rs_option, step_columns
from rcdiag.check.metric_names import metric_names
from rcdiag.render.table import render_table
from rcdiag.settings.correction import RS_OPTIONS, CorrectionConfig

SOURCES = {path: path.read_text() for path in sorted((ROOT / "rcdiag").rglob("*.py"))}


def test_the_prefix_is_written_once() -> None:
    places = [path.name for path, text in SOURCES.items() for _ in re.finditer(r"[\"']rollout_corr/[\"']", text)]
    assert places == ["keys.py"]


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


def test_every_declared_key_is_one_name_of_key_in_catalogue_order() -> None:
    names = {name: value for name, value in vars(Key).items() if name.isupper()}
    declared = [spec.name for spec in METRICS if "{option}" not in spec.key]
    assert list(names.values()) == declared and len(set(declared)) == len(declared)
    assert all(name == value.split("/", 1)[1].upper() for name, value in names.items())
    assert Key.KL == "rollout_corr/kl" and Key.KL_STD_ERROR == "rcdiag/kl_std_error"
    assert Key.ROLLOUT_PROBS_DIFF_MAX == "training/rollout_probs_diff_max"


def test_key_families_are_built_and_checked() -> None:
    assert rs_key("token_k1", "seq_fraction_low") == PREFIX + "rollout_rs_token_k1_seq_fraction_low"
    with pytest.raises(KeyError):
        rs_key("token_k2", "seq_fraction_low")  # k1 options only
    with pytest.raises(KeyError):
        rs_key("no_such_option", "masked_fraction")
    assert framework_key("slime", "ess") == "rcdiag/slime/ess"
    assert framework_key("roll", "*") == "rcdiag/roll/*"
    with pytest.raises(KeyError):
        framework_key("slime", "weight_max")


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
            assert threshold.finding is None or finding(threshold.finding).metric == spec.short
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
    render_table(rcdiag.analyze(path), plain, details=True)  # every analyze runs the bias detectors: their rows
    shown = plain.export_text()
    assert all(spec.code in shown for spec in FINDINGS if spec.explain)
    assert any("token_specific" in line and "not run: the dump has no token ids" in line for line in shown.splitlines())
    bare = api.accumulate(path)  # a state without the detectors' sums (none given): no row reads as a pass
    unjudged = Console(width=400, record=True)
    render_table(api.build_report(api.analyze_state(bare.state), bare.info, "cpu"), unjudged, details=True)
    assert not any(spec.code in unjudged.export_text() for spec in FINDINGS if spec.explain)
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


# ------------------------------------------------------------------------------------ one spec per finding


def test_every_code_has_one_spec_and_one_enum_member() -> None:
    from rcdiag.catalogue import Code

    assert [member.value for member in Code] == [spec.code for spec in FINDINGS]
    assert Code.KL_NEGATIVE == "kl_negative" and finding(Code.KL_NEGATIVE) is finding("kl_negative")


def test_every_cause_class_is_a_specs_class_or_derived_by_the_verdict() -> None:
    from typing import get_args

    from rcdiag.diagnosis.verdict import DERIVED_CLASSES, STATUS_OF
    from rcdiag.records.report import CauseClass

    classes = set(get_args(CauseClass))
    named = {spec.cause for spec in FINDINGS if spec.cause is not None}
    assert classes == named | set(DERIVED_CLASSES) and set(DERIVED_CLASSES) <= classes
    assert classes == set(STATUS_OF)
    assert "noise" not in named  # precision noise is never one finding's word: the verdict derives it


def test_detectors_and_their_texts_come_from_the_specs() -> None:
    """The detectors are the specs with a ``detects`` text (every analyze runs them, ``EXPLAIN_ONLY`` with
    ``--explain``); their codes, the CLI help and the verdict's "not examined" list read them there."""
    from rcdiag.catalogue.findings import detectors
    from rcdiag.cli.flags import ExplainOpt
    from rcdiag.explain.detectors import DETECTORS

    found = [spec.code for spec in detectors()]
    assert found == [spec.code for spec in FINDINGS if spec.explain] == list(DETECTORS)
    assert len(found) == 6
    help_text = ExplainOpt.__metadata__[0].help
    assert all(code in help_text for code in found), help_text


def test_thresholds_restated_elsewhere_are_read_from_the_catalogue() -> None:
    from rcdiag.catalogue.metrics import finding_threshold
    from rcdiag.diagnosis.health import seq_is_usable_ess
    from rcdiag.explain import detectors

    assert (detectors.KL_WARN, detectors.CHI2_WARN) == (0.1, 1.0)  # verl's own warnings, from the catalogue
    assert finding_threshold("kl_high").limit == detectors.KL_WARN
    assert finding_threshold("chi2_token_high").limit == detectors.CHI2_WARN
    assert seq_is_usable_ess() == finding_threshold("is_ess_low").limit == 0.3


def test_a_renamed_metric_fails_where_it_is_read() -> None:
    from rcdiag.catalogue.metrics import known_key

    assert known_key("k3_kl") == PREFIX + "k3_kl" and known_key("rcdiag/shape_corr") == "rcdiag/shape_corr"
    with pytest.raises(KeyError):
        known_key("k3_kl_renamed")


def test_the_verdict_advises_from_the_specs() -> None:
    """A class's fix step: its ``class_advice`` (truncation, whether the detector or the kl/k3 gap showed it);
    else its own finding's advice, never another class's (kl_negative under ``logprob_mode``)."""
    from rcdiag.diagnosis.verdict import class_advice
    from rcdiag.records.report import Cause

    truncation = finding("sampling_truncation").class_advice
    assert truncation is not None and truncation.startswith("Return log-probs of the same distribution")
    assert class_advice(Cause("truncation", ("kl_k3_disagree", "kl_high"), "")) == truncation
    assert class_advice(Cause("truncation", ("sampling_truncation",), "")) == truncation
    not_sampled = finding("logprobs_not_sampled").advice
    assert class_advice(Cause("logprob_mode", ("kl_negative",), "")) == not_sampled
    assert class_advice(Cause("logprob_mode", ("kl_negative", "logprobs_not_sampled"), "")) == not_sampled
    assert class_advice(Cause("swapped_columns", ("kl_negative", "logprobs_not_sampled"), "")) == (
        finding("kl_negative").advice
    )
    assert class_advice(Cause("crash", ("verl_crash_empty_batch",), "")) == ""  # no advice of its own


def test_findings_are_made_only_by_emit() -> None:
    """No module builds a ``Finding`` itself: ``rcdiag.catalogue.emit.emit`` takes the severity and advice from
    the spec (so a severity changed in the catalogue changes everywhere)."""
    built = [
        path.relative_to(ROOT).as_posix()
        for path, text in SOURCES.items()
        if re.search(r"\bFinding\(", text) and path.name != "emit.py"
    ]
    assert built == []
    sorts = [path.relative_to(ROOT).as_posix() for path, text in SOURCES.items() if "listing_order(" in text]
    assert sorts == ["rcdiag/catalogue/emit.py", "rcdiag/catalogue/findings.py"]  # one sort: ``ordered``


def _producers_findings() -> list[rcdiag.Finding]:
    """Findings from every producer: health rules and crash notes, signatures, ``--explain``'s detectors and the
    token detector, the micro-batch section, compare."""
    from rcdiag import MicroBatchSettings
    from rcdiag.compare import compare

    found: list[rcdiag.Finding] = []
    for path in sorted((ROOT / "sample_data").glob("*.parquet")):
        found.extend(rcdiag.analyze(path, explain=True).findings)
        found.extend(rcdiag.analyze(path, rcdiag.preset("decoupled_seq_is_rs")).findings)
    bypass = CorrectionConfig(rollout_is="token", rollout_is_threshold="2", bypass_mode=True, loss_type="ppo_clip")
    found.extend(rcdiag.analyze(ROOT / "sample_data" / "healthy.parquet", bypass).findings)
    micro = MicroBatchSettings(micro_batch_size=1)
    legacy = rcdiag.preset("decoupled_k3_rs", "0.7.1")
    found.extend(rcdiag.analyze(ROOT / "sample_data" / "healthy.parquet", legacy, microbatch=micro).findings)
    samples = ROOT / "sample_data"
    for a, b in (("healthy", "train_forgot_temperature"), ("healthy", "healthy_t06"), ("healthy", "topk_offset")):
        found.extend(compare(samples / f"{a}.parquet", samples / f"{b}.parquet").findings)
    return found


def test_every_producers_findings_carry_their_specs_severity_and_advice() -> None:
    found = _producers_findings()
    codes = {f.code for f in found}
    assert len(codes) >= 20, sorted(codes)  # the sample dumps reach most producers
    assert {"verl_crash_microbatch_all_rejected", "is_weights_unused", "token_specific", "temperature_kl_high"} <= codes
    for f in found:
        spec = finding(f.code)
        assert f.severity == spec.severity and f.advice == spec.advice, f.code
        assert f.facts and f.message.startswith(f.facts), f.code
        if spec.advice:
            assert f.message.endswith(spec.advice), f.code
