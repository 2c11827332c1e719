"""A report carries its configuration resolved once (``Report.config``, a ``ResolvedConfig`` built where the report
is built): no module rebuilds it from a dict, the JSON says the fields as given, a state file's configuration is
read back in one place (``rcdiag.engine.state_files``), and IcePop is told from TIS by what verl's parser made of the threshold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, run

import rcdiag
from rcdiag.compare import compare_reports
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import CorrectionConfig, ResolvedConfig

OUTLIERS = str(SAMPLES / "outliers.parquet")
ICEPOP = CorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_rs="token_k2",
                          rollout_rs_threshold="0.5")  # fmt: skip
TIS = CorrectionConfig(rollout_is="token", rollout_is_threshold="2")

BUILDERS = {"settings/correction.py": 1, "diagnosis/prescribe.py": 1}
"""The only places a configuration is made from loose fields: verl's presets, and a prescription's four settings
(``prescribe.prescribed_setting``). A state file's is read by ``dataclass_from`` in ``rcdiag.engine.state_files``."""


def _sources() -> dict[str, str]:
    package = ROOT / "rcdiag"
    return {str(path.relative_to(package)): path.read_text() for path in sorted(package.rglob("*.py"))}


def test_only_the_builders_make_a_configuration_from_loose_fields() -> None:
    found = {name: text.count("CorrectionConfig(**") for name, text in _sources().items()}
    assert {name: count for name, count in found.items() if count} == BUILDERS


def test_no_module_reads_a_report_configuration_as_a_dict_or_a_threshold_string() -> None:
    """``report.config["rollout_is"]``, ``a.config.get(...)``, ``"_" in row.threshold``: each re-parses what the
    record already holds resolved."""
    as_dict = re.compile(r"\b(report|a|b|base|under)\.config(\[|\.get\()")
    icepop_by_text = re.compile(r'"_" in (row|rec|self)\.threshold')
    offenders = [
        (name, line.strip())
        for name, text in _sources().items()
        for line in text.splitlines()
        if as_dict.search(line) or icepop_by_text.search(line)
    ]
    assert offenders == []


def test_the_guard_sees_a_planted_reparse() -> None:
    planted = '    spec = CorrectionConfig(**report.config, verl_version=report.config["verl_version"])'
    assert "CorrectionConfig(**" in planted
    assert re.search(r"\b(report|a|b|base|under)\.config(\[|\.get\()", planted)


def test_analyze_returns_the_resolved_record_and_the_json_says_the_fields_as_given() -> None:
    report = rcdiag.analyze(OUTLIERS, ICEPOP)
    assert isinstance(report.config, ResolvedConfig)
    assert report.config == ICEPOP.resolve()
    assert report.config.is_spec is not None and report.config.is_spec.icepop
    assert (report.config.is_spec.lower, report.config.is_spec.upper) == (0.5, 2.0)
    assert report.config.rs_option("token_k2").upper == 0.5
    with pytest.raises(KeyError):
        report.config.rs_option("token_k1")
    shown = report.to_dict()["config"]
    assert list(shown) == [
        "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold",
        "bypass_mode", "loss_type", "verl_version",
    ]  # fmt: skip
    assert shown["rollout_is_threshold"] == "0.5_2.0" and shown["rollout_rs_threshold"] == "0.5"  # as given


def test_compare_reports_judges_the_resolved_records() -> None:
    """``2`` and ``2.0`` are one threshold (as merge judges states); ``3.0`` is another computation."""
    a = rcdiag.analyze(OUTLIERS, TIS)
    b = rcdiag.analyze(OUTLIERS, TIS.replace(rollout_is_threshold=2.0))
    assert compare_reports(a, b).a is a
    with pytest.raises(ConfigError, match="different engine configurations"):
        compare_reports(a, rcdiag.analyze(OUTLIERS, TIS.replace(rollout_is_threshold=3.0)))


def test_a_merged_state_rebuilds_the_record_from_its_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state, first, merged = (str(tmp_path / name) for name in ("s.json", "a.json", "m.json"))
    args = ("--is", "token", "--is-threshold", "0.5_2.0", "--rs", "token_k2", "--rs-threshold", "0.5")
    code, _, _ = run(capsys, "analyze", OUTLIERS, *args, "-q", "--save-state", state, "--format", "json", "-o", first)
    assert code == 0
    code, _, _ = run(capsys, "merge", state, "-q", "--format", "json", "-o", merged)
    assert code == 0
    assert json.loads(Path(merged).read_text())["config"] == json.loads(Path(first).read_text())["config"]
    code, out, _ = run(capsys, "merge", state, "--details")
    assert code == 0 and "IcePop: weights outside [0.5, 2] zeroed" in out and "k2 per token <= 0.5" in out


@pytest.mark.parametrize(
    ("config", "setting"),
    [(ICEPOP, "IcePop: weights outside [0.5, 2] zeroed"), (TIS, "TIS: weights clamped at 2")],
)
def test_the_is_setting_reads_the_resolved_kind(config: CorrectionConfig, setting: str) -> None:
    from rcdiag.render.summary import correction_rows

    rows = correction_rows(rcdiag.analyze(OUTLIERS, config))
    assert rows[0].name == "IS token" and rows[0].setting == setting


def test_sweep_html_labels_icepop_and_tis_curves_by_the_resolved_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """One option swept at a TIS and at an IcePop threshold: two kinds of curve; the same from a saved state."""
    pytest.importorskip("matplotlib")
    page, state = tmp_path / "sweep.html", str(tmp_path / "s.json")
    grid = ("--is", "token", "--thresholds", "1.5,2.0,0.5_2.0,0.25_4.0")
    code, _, _ = run(capsys, "sweep", OUTLIERS, *grid, "-q", "--html", str(page), "--save-state", state,
                     "-o", str(tmp_path / "x"))  # fmt: skip
    assert code == 0
    text = page.read_text()
    assert "TIS tokens" in text and "IcePop tokens" in text
    merged = tmp_path / "merged.html"
    assert run(capsys, "merge", state, "-q", "--html", str(merged), "-o", str(tmp_path / "m"))[0] == 0
    text = merged.read_text()
    assert "TIS tokens" in text and "IcePop tokens" in text
    page_tis = tmp_path / "tis.html"
    code, _, _ = run(capsys, "sweep", OUTLIERS, "--is", "token", "--thresholds", "1.5,2.0", "-q", "--html",
                     str(page_tis), "-o", str(tmp_path / "y"))  # fmt: skip
    assert code == 0 and "TIS tokens" in page_tis.read_text() and "IcePop tokens" not in page_tis.read_text()
