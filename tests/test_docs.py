"""The docs name every metric key, finding code, preset, command and exit code the code has."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT, random_batch, run_padded

from rcdiag.config import PRESETS, RS_OPTIONS
from rcdiag.errors import ExitCode
from rcdiag.health import FINDING_CODES

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


@pytest.mark.parametrize("key", sorted(all_metric_keys()))
def test_every_metric_key_is_documented(key: str) -> None:
    assert key.removeprefix("rollout_corr/") in DOCS


@pytest.mark.parametrize("code", FINDING_CODES)
def test_every_finding_code_is_documented(code: str) -> None:
    assert f"`{code}`" in DOCS


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
