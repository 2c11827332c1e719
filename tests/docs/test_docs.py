"""The docs name every metric key, finding code, preset, command and exit code the code has."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import ROOT, random_batch, run_padded

from rcdiag.catalogue import FINDINGS, PREFIX, every_key, finding
from rcdiag.catalogue.findings import listing_order
from rcdiag.diagnosis.health import FINDING_CODES
from rcdiag.runtime.errors import ExitCode
from rcdiag.settings.correction import PRESETS, RS_OPTIONS, CorrectionConfig

DOCS = "\n".join(path.read_text() for path in sorted((ROOT / "docs").glob("*.md")))


def all_metric_keys() -> set[str]:
    old, rollout, mask = random_batch(np.random.default_rng(0))
    keys: set[str] = set()
    for level in ("token", "sequence"):
        report = run_padded(
            old, rollout, mask, rollout_is=level, rollout_is_threshold="0.5_5.0", rollout_is_batch_normalize=True,
            rollout_rs=",".join(RS_OPTIONS), rollout_rs_threshold=2.0,
        )  # fmt: skip
        keys |= set(report.metrics) | set(report.extras)
    return keys


def documented_keys() -> set[str]:
    """Every whole key written in backticks in docs/metrics.md (`kl`, `rollout_corr/kl`, `rcdiag/kl_std_error`)."""
    page = (ROOT / "docs" / "metrics.md").read_text()
    return {m.removeprefix(PREFIX) for m in re.findall(r"`([A-Za-z0-9_/]+)`", page)}


@pytest.mark.parametrize("key", every_key())
def test_every_catalogue_key_is_in_the_metrics_page(key: str) -> None:
    assert key.removeprefix(PREFIX) in documented_keys()  # whole keys: `kl` is not found inside `k3_kl`


def test_the_metrics_page_lists_no_key_the_catalogue_lacks() -> None:
    fields = {f.name for f in dataclasses.fields(CorrectionConfig)}
    keyish = {k for k in documented_keys() if re.fullmatch(r"(rollout_(is|rs)_|rcdiag/)\w+", k)}
    assert keyish - fields - {k.removeprefix(PREFIX) for k in every_key()} == set()


def test_reported_keys_are_exactly_the_catalogue() -> None:
    assert all_metric_keys() == set(every_key())


def test_whole_key_matching_cannot_pass_on_a_substring() -> None:
    assert "kl" in documented_keys() and "l_ppl_diff" not in documented_keys()


def code_table(page: str) -> list[tuple[str, str]]:
    """(code, severity) of each row of a page's first code table."""
    text = (ROOT / "docs" / page).read_text()
    return re.findall(r"^\| `([a-z0-9_]+)` \| (error|warning|info) \|", text, flags=re.MULTILINE)


@pytest.mark.parametrize(("page", "command"), [("findings.md", "analyze"), ("compare.md", "compare")])
def test_finding_docs_list_exactly_the_catalogue(page: str, command: str) -> None:
    listed = [(spec.code, spec.severity) for spec in FINDINGS if command in spec.commands]
    assert code_table(page) == sorted(listed, key=lambda item: listing_order(*item))


@pytest.mark.parametrize("code", FINDING_CODES)
def test_every_finding_code_has_a_section(code: str) -> None:
    spec = finding(code)
    assert f"### `{code}` ({spec.severity})" in (ROOT / "docs" / "findings.md").read_text()


def test_findings_doc_does_not_call_check_future_work() -> None:
    assert "future" not in (ROOT / "docs" / "findings.md").read_text()


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_documented(name: str) -> None:
    assert f"`{name}`" in DOCS


def test_exit_codes_and_commands_are_documented() -> None:
    page = (ROOT / "docs" / "exit-codes.md").read_text()
    for code in ExitCode:
        assert re.search(rf"\|\s*`?{int(code)}`?\s*\|", page), code
    for command in ("rcdiag analyze", "rcdiag presets"):
        assert command in DOCS


def test_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_every_test_the_threat_model_names_exists() -> None:
    """docs/threat-model.md names the test that keeps each promise (``tests/AREA/test_x.py::name``, then ``::name`` for
    more in the same file): each one is a test function of that file."""
    page = (ROOT / "docs" / "threat-model.md").read_text()
    named, current = [], None
    for match in re.finditer(r"`(tests/\w+/test_\w+\.py)(?:::(\w+))?`|`::(\w+)`", page):
        current = match.group(1) or current
        name = match.group(2) or match.group(3)
        if current is not None and name is not None:
            named.append((current, name))
    assert len(named) > 40
    missing = [(f, n) for f, n in named if f"def {n}(" not in (ROOT / f).read_text()]
    assert missing == []
