"""Running the CLI in a fresh interpreter to see which numba modules it loads, and comparing two reports key by key:
the helpers of the tests that hold the compiled kernels and the numpy small path (explain, tokens, sweep) to one
result."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from rcdiag.kernels.small import SWITCH

MODULES = """
import runpy, sys
out, sys.argv = sys.argv[1], ["rcdiag", *sys.argv[2:]]
try:
    runpy.run_module("rcdiag", run_name="__main__")
except SystemExit:
    pass
open(out, "w").write(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite"))))
"""
"""Runs the CLI as ``python -m rcdiag`` does, then writes the numba and llvmlite modules it loaded to ``argv[1]``."""


def cli_modules(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A real CLI run in a fresh interpreter (an empty numba cache of its own) and the numba modules it loaded."""
    out = tmp_path / "modules.txt"
    full_env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba_cache"), "RCDIAG_COMPILE_NOTICE": "1", **env}
    done = subprocess.run(
        [sys.executable, "-c", MODULES, str(out), *args], capture_output=True, text=True, env=full_env, timeout=600
    )
    return done, out.read_text().split()


def without_numba_then_forced(
    tmp_path: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The command on an empty numba cache: it loads no numba module, says nothing and writes no kernel cache;
    forced to the kernels (``RCDIAG_SMALL_DUMP_BYTES=0``) it loads numba, says it compiles and writes the cache.
    Returns both runs."""
    done, loaded = cli_modules(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert loaded == [] and done.stderr == ""
    assert not any((tmp_path / "numba_cache").rglob("*.nbi"))
    forced, loaded = cli_modules(tmp_path, *args, **{SWITCH: "0"})
    assert forced.returncode == 0, forced.stderr
    assert "numba" in loaded and "compiling kernels" in forced.stderr
    assert any((tmp_path / "numba_cache").rglob("*.nbi"))
    return done, forced


def flat(value: object, key: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in flat(item, f"{key}.{name}").items()}
    if isinstance(value, list | tuple):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{key}[{i}]").items()}
    return {key: value}


def far_apart(want: dict[str, object], got: dict[str, object]) -> list[tuple[str, object, object]]:
    """The keys of two flattened reports (``flat``) whose values differ: a float by more than 1e-11 relative (NaN
    equals NaN), anything else at all; a key in one report only is listed too."""
    far: list[tuple[str, object, object]] = [(key, got.get(key), None) for key in got.keys() - want.keys()]
    for key, expected in want.items():
        found = got.get(key)
        if isinstance(expected, float) and isinstance(found, float):
            same = found == expected or (math.isnan(found) and math.isnan(expected))
            if not (same or math.isclose(found, expected, rel_tol=1e-11)):
                far.append((key, found, expected))
        elif key not in got or found != expected:
            far.append((key, found, expected))
    return far
