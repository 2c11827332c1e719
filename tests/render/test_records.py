"""``rcdiag.records.report`` holds every record a renderer reads: a feature's section is a plain frozen record there (no
protocol standing in for a feature's class), and ``compare``'s findings are ``Finding``s with a ``side``, written
to JSON with the keys docs/compare.md lists."""

from __future__ import annotations

import ast
import dataclasses
import json

from conftest import ROOT, SAMPLES

import rcdiag
from rcdiag import MicroBatchSettings, analyze, preset
from rcdiag.compare import CompareFinding, compare_reports
from rcdiag.records.report import Finding, MicroBatchReport, StepMicroBatches

ANALYZE_KEYS = ["code", "severity", "message", "metric", "value", "threshold", "steps", "detail", "evidence"]
"""An ``analyze`` finding's JSON keys, in order (docs/json.md)."""
COMPARE_KEYS = ["code", "severity", "message", "side", "metric", "value", "threshold"]
"""A ``compare`` finding's JSON keys, in order (docs/compare.md)."""


def test_the_records_module_defines_only_records() -> None:
    """No ``Protocol``: every section a renderer reads is a frozen dataclass of ``rcdiag.records.report``."""
    tree = ast.parse((ROOT / "rcdiag" / "records" / "report.py").read_text())
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert classes
    for node in classes:
        record = getattr(rcdiag.records.report, node.name)
        assert dataclasses.is_dataclass(record), node.name
        assert record.__dataclass_params__.frozen, node.name


def test_the_microbatch_section_is_a_report_record() -> None:
    settings = MicroBatchSettings(micro_batch_size=4)
    report = analyze(SAMPLES / "healthy.parquet", preset("decoupled_k3_rs", "0.7.1"), microbatch=settings)
    assert type(report.microbatch) is MicroBatchReport
    assert all(type(step) is StepMicroBatches for step in report.microbatch.steps)
    assert report.microbatch.settings == settings.to_dict()
    data = json.loads(json.dumps(report.to_dict()))["microbatch"]
    assert data["settings"] == {**settings.to_dict()}
    assert data["path"] == "legacy_actor"


def test_compare_findings_are_report_findings_with_a_side() -> None:
    a = analyze(SAMPLES / "healthy.parquet")
    b = analyze(SAMPLES / "train_forgot_temperature.parquet")
    comparison = compare_reports(a, b)
    assert CompareFinding is Finding
    assert comparison.findings and all(type(f) is Finding for f in comparison.findings)
    assert {f.side for f in comparison.findings} == {"b"}
    written = comparison.to_dict()
    for finding, data in zip(comparison.findings, written["findings"], strict=True):
        assert list(data) == COMPARE_KEYS
        assert data["side"] == finding.side and data["code"] == finding.code
    for side in ("a", "b"):  # each side's own analyze findings keep analyze's keys, without a side
        assert all(list(data) == ANALYZE_KEYS for data in written[side]["findings"])


def test_a_pair_finding_writes_side_null_and_an_analyze_finding_no_side() -> None:
    pair = Finding("noise_consistent", "info", "m", metric="rollout_corr/kl", value=float("inf"), threshold=3.0)
    assert pair.to_pair_dict() == {"code": "noise_consistent", "severity": "info", "message": "m", "side": None,
                                   "metric": "rollout_corr/kl", "value": None, "threshold": 3.0}  # fmt: skip
    assert list(pair.to_dict()) == ANALYZE_KEYS
    assert list(dataclasses.replace(pair, side="a").to_dict()) == ANALYZE_KEYS
