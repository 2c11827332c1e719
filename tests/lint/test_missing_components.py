"""The CI=true rule itself: a missing real component fails the run in CI and, elsewhere, skips saying what to
install. Run on a throwaway test file in a child pytest, with and without CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS

PROBE = """
import pytest
from missing_components import missing


def test_importorskip():
    pytest.importorskip("rcdiag_no_such_module")


def test_oracle():
    missing("verl-0.7.1")


def test_other_skip():
    pytest.skip("no CUDA device")
"""


def _run(tmp_path: Path, ci: str | None) -> str:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "missing_components", "-p", "no:cacheprovider", "-rA", "-q",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    return result.stdout


@pytest.mark.parametrize("ci", ["true"])
def test_in_ci_a_missing_component_fails(tmp_path: Path, ci: str) -> None:
    out = _run(tmp_path, ci)
    assert "2 failed, 1 skipped" in out, out
    assert "FAILED" in out and "test_importorskip" in out and "test_oracle" in out
    assert "CI=true and a real component is missing" in out
    assert "SKIPPED [1]" in out and "no CUDA device" in out  # a skip for another reason stays a skip


def test_outside_ci_it_skips_saying_what_to_install(tmp_path: Path) -> None:
    out = _run(tmp_path, None)
    assert "3 skipped" in out, out
    assert "verl-0.7.1 is not installed; install it with: pip install --no-deps --target .gl/verl-0.7.1 'verl==0.7.1'" in out
    assert "could not import 'rcdiag_no_such_module'" in out and "install it with: pip install" in out
