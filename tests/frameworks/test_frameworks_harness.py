"""``rcdiag analyze --as NAME`` for the frameworks without a release on the package index (slime, SkyRL, prime-rl,
NeMo-RL, ROLL) against what their own code logs on the same dumps: the expected values a harness of ours wrote by
running each framework's source at its pinned commit (tests/harness/NAME_expected.py, tests/harness/common.py),
under its defaults and several other settings, every step and the pooled view, to float32 rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.common import EXPECTED, compare, load

import rcdiag
from rcdiag.frameworks.registry import framework

NAMES = sorted(path.stem for path in EXPECTED.glob("*.json"))
TOLERANCES = {"slime": (1e-5, 1e-7), "prime-rl": (1e-5, 1e-7), "nemo-rl": (1e-5, 1e-7), "roll": (1e-5, 1e-7)}
"""(relative, absolute) for frameworks whose keys sum float32 per-sample terms in their own order (slime's
per-sample means, exp of float32 row sums) or average per-token values that cancel (``exp(d) - d - 1``, whose
float32 ``exp(d)`` near 1 is rounded to 6e-8; NeMo-RL's KL and JS terms, ROLL's probability differences): float32 rounding of those terms. Otherwise 2e-6 and 1e-9."""
CASES = [(name, setting) for name in NAMES for setting in load(name)["settings"]]


@pytest.mark.parametrize(("name", "setting"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_matches_its_own_code(name: str, setting: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the real-model dumps are built with torch
    rel, abs_ = TOLERANCES.get(name, (2e-6, 1e-9))
    assert compare(name, setting, tmp_path, rel=rel, abs_=abs_) > 0


@pytest.mark.parametrize("name", NAMES)
def test_the_json_names_the_commit_rcdiag_reproduces(name: str) -> None:
    expected = load(name)
    found = framework(name)
    assert expected["commit"].startswith(found.release)
    assert expected["ran"] and all(entry["sha256"] for entry in expected["ran"])
    assert {"defaults"} <= set(expected["settings"]) and len(expected["settings"]) >= 3


@pytest.mark.parametrize("name", NAMES)
def test_the_settings_are_not_all_the_same_computation(name: str, tmp_path: Path) -> None:
    """Each setting of the JSON changes what the framework logs or its weights on the wide synthetic dump (with the
    loss inputs: the same log-probs, and advantages for the settings that read them)."""
    from harness.common import build

    expected = load(name)
    path = build("synthetic_s1_token_advantages", tmp_path / "wide")
    seen = set()
    for options in expected["settings"].values():
        report = rcdiag.analyze(path, framework=name, framework_options=options)
        seen.add(tuple(sorted((k, v) for k, v in {**report.metrics, **report.extras}.items() if f"/{name}/" in k
                              or k in {key.key for key in framework(name).keys})))  # fmt: skip
    assert len(seen) == len(expected["settings"])
