"""Under ``CI=true`` a test never skips because a real component (torch, verl, a test dependency) is missing: the
skip becomes a failure. Elsewhere the skip stays, and says what to install.

A missing component is an ``importorskip`` that could not import, or ``missing(...)`` below (the verl oracle).
Loaded by tests/conftest.py (its hook is re-exported there).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

MISSING = "missing component:"
INSTALL = {
    "torch": "pip install 'torch==2.13.0'",
    **{
        f"verl-{v}": f"pip install --no-deps --target .gl/verl-{v} 'verl=={v}' (and torch; see .ci/run)"
        for v in ("0.7.1", "0.8.0", "0.9.0", "0.9.1")
    },
    **{
        f"{name}-{v}": f"pip install --no-deps --target .gl/{name}-{v} '{name}=={v}' (and torch; see .ci/run)"
        for name, v in (("trl", "1.16.0"), ("openrlhf", "0.11.0"), ("areal", "1.0.4"))
    },
    "moto": "pip install 'moto[server]' (in the test extra: pip install -e '.[test]')",
    "ray": "pip install -e '.[ray]'",
    "matplotlib": "pip install -e '.[plot]'",
    "verl-deps": "pip install -e '.[verl]' \"torch==2.13.0\" (tensordict, omegaconf, transformers, codetiming, orjson: what verl's "
    "DataProto imports; hydra-core for its entry point)",
    "tracking": "pip install -e '.[tracking]' (TensorBoard and MLflow's clients, with sqlalchemy for sqlite stores)",
    "tokenizers": "pip install -e '.[tokens]'",
    "chromium": "apt-get install chromium (Debian), or set RCDIAG_CHROMIUM to a Chromium or Chrome binary",
}
DEFAULT_INSTALL = (
    "pip install -e '.[test,lint,plot,ray,tracking,verl,tokens]' 'torch==2.13.0', then the verl oracles as .ci/run does"
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def missing(component: str) -> NoReturn:
    """Skip (or, in CI, fail) a test because ``component`` is not installed."""
    raise pytest.skip.Exception(f"{MISSING} {component} is not installed; {install_hint(component)}")


def install_hint(component: str) -> str:
    return f"install it with: {INSTALL.get(component, DEFAULT_INSTALL)}"


def _missing_reason(reason: str) -> str | None:
    """The skip reason, completed with what to install, if the skip is for a missing component."""
    if reason.startswith(MISSING):
        return reason
    if reason.startswith("could not import "):  # pytest.importorskip
        module = reason.split("'")[1] if reason.count("'") >= 2 else "?"
        return f"{MISSING} {reason}; {install_hint(module.split('.')[0])}"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or call.excinfo is None or not isinstance(call.excinfo.value, pytest.skip.Exception):
        return
    reason = _missing_reason(str(call.excinfo.value.msg))
    if reason is None:
        return
    if in_ci():
        report.outcome = "failed"
        report.longrepr = f"CI=true and a real component is missing, so this test fails instead of skipping: {reason}"
    elif isinstance(report.longrepr, tuple):
        path, lineno, _ = report.longrepr
        report.longrepr = (path, lineno, f"Skipped: {reason}")
