"""Real-model dumps for the shape detectors' tests (temperature_mismatch, sampling_truncation), several seeds each.

Built with tests/realmodel (``make_dump``, 512 responses, ~44k tokens) and cached under the temp directory, keyed by
the hash of the model code, the checkpoint and this file, so a second session reuses them. ``FLATTER`` is a rollout
at T = 1.2 (flatter than the trainer): not one of realmodel's scenarios, so it is added to its table only while its
dump is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

import rcdiag
from rcdiag.explain.detectors import DETECTORS

HERE = Path(__file__).resolve().parent
MODEL = HERE / "realmodel"
N_RESPONSES = 512
FLATTER = "temperature_1.2"


def realmodel() -> Any:
    """tests/realmodel (it needs torch: without it the test skips saying what to install, or fails under CI)."""
    pytest.importorskip("torch")
    import realmodel as package

    return package


def _cache_root() -> Path:
    digest = hashlib.sha256()
    for file in [*sorted(MODEL.glob("*.py")), MODEL / "checkpoint.pt", Path(__file__)]:
        digest.update(file.name.encode() + file.read_bytes())
    digest.update(str(N_RESPONSES).encode())
    return Path(tempfile.gettempdir()) / f"rcdiag-shape-dumps-{digest.hexdigest()[:16]}"


def dump(scenario: str, seed: int) -> Path:
    """The dump of ``scenario`` at ``seed`` (built once, then cached on disk)."""
    package = realmodel()
    path = _cache_root() / f"{scenario}_s{seed}"
    if path.exists():
        return path
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=tempfile.gettempdir()))
    table = package.SCENARIOS
    added = scenario == FLATTER and scenario not in table
    if added:
        from realmodel.engines import Rollout

        table[scenario] = Rollout(temperature=1.2)
    try:
        package.make_dump(scenario, building / "dump", seed=seed, n_responses=N_RESPONSES)
    finally:
        if added:
            del table[scenario]
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # another session finished first
        (building / "dump").rename(path)
    shutil.rmtree(building, ignore_errors=True)
    return path


def detector_findings(path: Path) -> dict[str, rcdiag.Finding]:
    """The ``--explain`` detectors' findings on a dump, by code."""
    return {f.code: f for f in rcdiag.analyze(path, explain=True).findings if f.code in DETECTORS}


def defect_dump(name: str, seed: int) -> Path:
    """The dump of pipeline defect ``name`` (tests/realmodel ``DEFECTS``) at ``seed``, built once, then cached."""
    package = realmodel()
    path = _cache_root() / f"defect_{name}_s{seed}"
    if path.exists():
        return path
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=tempfile.gettempdir()))
    try:
        package.make_defect_dump(name, building / "dump", seed=seed, n_responses=N_RESPONSES)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # another session finished first
            (building / "dump").rename(path)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return path
