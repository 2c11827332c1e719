"""``rcdiag check --fail-on`` and ``--pack analyze``: a dump analyze warns about cannot pass the gate unnoticed
(real subprocesses: exit code, stdout, stderr, the JUnit and Markdown files)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A systematic shift (the trainer's log-probs 0.004 above the rollout's): kl = -0.0041, k3_kl = 0.00046, so
    every metric pack passes while analyze warns kl_k3_disagree and, since a kl that far below 0 cannot come from
    tokens sampled by the rollout engine, gives the error kl_negative."""
    rng = np.random.default_rng(0)
    rows, length = 64, 200
    rollout = [(-rng.exponential(1.0, length) - 0.05) for _ in range(rows)]
    old = [np.minimum(r + rng.normal(0.004, 0.03, length), 0.0) for r in rollout]
    path = tmp_path_factory.mktemp("gate") / "shifted.parquet"
    table = pa.table(
        {
            "old_log_prob": [o.tolist() for o in old],
            "rollout_log_prob": [r.tolist() for r in rollout],
            "response_mask": [[1] * length] * rows,
        }
    )
    pq.write_table(table, path)
    return path


def check(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rcdiag", "check", *map(str, args), "--no-pyproject"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, cwd=cwd)


def test_metric_packs_alone_pass_the_shifted_dump_but_analyze_warns(shifted: Path) -> None:
    """The defect: the README's gate passed a dump whose kl is -0.004."""
    result = check(shifted, "--pack", "verl", "--pack", "nemo-rl", "--max", "kl=2e-3", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["passed"] is True
    assert json.loads(result.stdout)["fail_on"] is None


def test_pack_analyze_fails_the_gate_with_junit_and_markdown(shifted: Path, tmp_path: Path) -> None:
    junit, markdown = tmp_path / "r.xml", tmp_path / "r.md"
    result = check(shifted, "--pack", "verl", "--pack", "nemo-rl", "--pack", "analyze", "--junit", junit,
                   "--markdown", markdown)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "✗ │ finding kl_negative (error)" in result.stdout
    assert "✗ │ finding kl_k3_disagree (warning)" in result.stdout
    assert "FAILED: 4 of 8 rules hold, 4 skipped; 2 findings fail --fail-on warning or worse" in result.stdout
    assert result.stderr == ""
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "2" and suite.get("tests") == "10"
    case = suite.find(".//testcase[@classname='rcdiag.check.fail_on'][@name='finding kl_k3_disagree (warning)']")
    assert case is not None and case.get("name") == "finding kl_k3_disagree (warning)"
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "rcdiag.FindingFailed"
    assert failure.get("message", "").startswith("kl (-0.00412) and k3_kl (0.000455) disagree")
    text = markdown.read_text()
    assert text.startswith("### ❌ rcdiag check failed: 4 of 8 rules hold, 4 skipped; 2 findings fail --fail-on")
    assert "| ❌ | finding kl_k3_disagree (warning) |" in text


def test_fail_on_severity_and_codes(shifted: Path) -> None:
    result = check(shifted, "--fail-on", "warning", "--format", "json")
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert out["passed"] is False and out["results"] == []
    assert out["fail_on"] == {"severity": "warning", "codes": []}
    assert [f["code"] for f in out["failing_findings"]] == ["kl_negative", "kl_k3_disagree"]
    result = check(shifted, "--fail-on", "error", "--max", "k3_kl=1e-3")
    assert result.returncode == 1, result.stderr
    assert "FAILED: 1 of 1 rules hold; 1 finding fails --fail-on error or worse" in result.stdout
    result = check(shifted, "--fail-on", "kl_negative", "--max", "k3_kl=1e-3")  # or by its code
    assert result.returncode == 1 and "1 finding fails --fail-on kl_negative" in result.stdout
    result = check(shifted, "--fail-on", "kl_k3_disagree,chi2_token_high")
    assert (
        result.returncode == 1 and "FAILED: 1 finding fails --fail-on kl_k3_disagree, chi2_token_high" in result.stdout
    )


def test_an_explain_code_runs_the_explain_detectors() -> None:
    """position_drift comes from --explain's detectors; without them the gate could never fire."""
    result = check(SAMPLES / "position_drift.parquet", "--fail-on", "position_drift", "--format", "json")
    assert result.returncode == 1, result.stderr
    assert [f["code"] for f in json.loads(result.stdout)["failing_findings"]] == ["position_drift"]


def test_an_unknown_fail_on_name_is_exit_2_listing_the_codes(shifted: Path) -> None:
    result = check(shifted, "--fail-on", "kl_k3_disagree,bogus")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(
        "rcdiag: error: --fail-on kl_k3_disagree,bogus: 'bogus' is neither a severity (error, warning, info) nor a "
        "finding code analyze gives; codes: verl_crash_empty_batch, "
    )
    assert "position_drift" in result.stderr and result.stderr.count("\n") == 1


def test_a_rules_file_gates_on_findings(shifted: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('fail_on = ["kl_k3_disagree"]\n[max]\nk3_kl = 1e-3\n')
    result = check(shifted, "--rules", rules)
    assert result.returncode == 1 and "1 finding fails --fail-on kl_k3_disagree" in result.stdout
    rules.write_text('packs = ["analyze"]\n')
    result = check(shifted, "--rules", rules)
    assert result.returncode == 1 and "FAILED: 2 findings fail --fail-on warning or worse" in result.stdout
