"""rcdiag against verl v0.9.0 itself: same keys, same order, same values, same crashes.

verl is loaded from its installed package (``pip install --no-deps verl==0.9.0``, done by .ci/run); without it
these tests skip saying what to install, and fail under ``CI=true``. Tolerances: relative 1e-4, plus an absolute floor where verl's own float32 arithmetic
loses digits (std as E[x^2] - E[x]^2, chi2 as E[ratio^2] - 1): there rcdiag's float64 sums are the accurate
ones (tests/test_metrics_reference.py checks them against a float64 reference).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import ragged_lists, random_batch, run_padded, write_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verl_oracle import load_verl, require_verl, verl_metrics

from rcdiag.config import PRESETS, RS_OPTIONS

pytestmark = pytest.mark.verl
try:
    import torch
except ImportError:  # the fixture below reports it (a failure under CI=true)
    torch = None


@pytest.fixture(autouse=True)
def _verl() -> None:
    """Every test here needs verl itself: missing, it skips saying what to install, or fails under CI=true."""
    require_verl()


def _tolerance(key: str, expected: dict[str, float]) -> float:
    """Absolute tolerance: float32 rounding of the values a metric is built from (verl works in float32)."""
    if key.endswith("_std"):
        family = key[: -len("std")]
        scale = max((abs(expected.get(family + s, 0.0)) for s in ("max", "min")), default=0.0)
        # verl's sqrt(E[x^2] - E[x]^2) in float32 is off by up to about sqrt(8 * 6e-8) * |x|, i.e. 7e-4 * |x|.
        return 2e-3 + 1e-3 * (scale if math.isfinite(scale) else 0.0)
    if "chi2" in key:
        return 1e-5
    return 1e-6


def compare_with_verl(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, config: dict) -> None:
    report = run_padded(old, rollout, mask, **config)
    tensors = (torch.from_numpy(old), torch.from_numpy(rollout), torch.from_numpy(mask))
    try:
        expected = verl_metrics(*tensors, **config)
    except ZeroDivisionError:
        assert "verl_crash_ess_zero_division" in {f.code for f in report.findings}
        assert report.metrics["rollout_corr/rollout_is_eff_sample_size"] is None
        return
    except ValueError as exc:
        message = str(exc)
        assert [f.code for f in report.findings] == ["verl_crash_empty_batch"], message
        assert "at least one valid token" in message
        return
    assert list(report.metrics) == list(expected)
    bad = []
    for key, want in expected.items():
        got = report.metrics[key]
        if not math.isfinite(want):
            if got is not None:
                bad.append((key, got, want))
        elif got is None or not math.isclose(got, want, rel_tol=1e-4, abs_tol=_tolerance(key, expected)):
            bad.append((key, got, want))
    assert not bad, bad


def test_presets_match_verl_classmethods() -> None:
    _, verl_config = load_verl()
    for name, build in PRESETS.items():
        theirs = getattr(verl_config, name)()
        ours = build()
        for field in ours.to_dict():
            assert getattr(theirs, field) == getattr(ours, field), (name, field)


CONFIGS = [
    {},
    {"rollout_is": "token"},
    {"rollout_is": "sequence", "rollout_is_batch_normalize": True},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0", "rollout_is_batch_normalize": True},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0"},
    {
        "rollout_rs": ",".join(RS_OPTIONS),
        "rollout_rs_threshold": "0.7_1.3,2,0.02,0.5_2.0,5,0.5,0.99_1.01,0.01,0.01,0.5,0.2",
    },
    {"rollout_is": "token", "rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.9_1.05,0.001"},
    *[{k: v for k, v in build().to_dict().items() if k.startswith("rollout_")} for build in PRESETS.values()],
]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
@pytest.mark.parametrize("noise", [0.01, 0.1, 0.5, 2.0])
def test_fixed_configs(config: dict, noise: float) -> None:
    rng = np.random.default_rng(int(noise * 100))
    old, rollout, mask = random_batch(rng, rows=24, width=40, noise=noise, outliers=0.02)
    compare_with_verl(old, rollout, mask, config)


def test_extreme_ratios_and_infinities() -> None:
    old = np.array([[-0.1, -0.2, -30.0, -0.5, -np.inf], [-95.0, -0.3, -0.1, -0.2, -1.0]], np.float32)
    rollout = np.array([[-0.1, -25.0, -0.1, -0.5, -2.0], [-0.1, -0.3, -0.1, -0.2, -np.inf]], np.float32)
    mask = np.ones_like(old, dtype=np.int64)
    for config in CONFIGS:
        compare_with_verl(old, rollout, mask, config)


@st.composite
def rs_config(draw: st.DrawFn) -> dict:
    options = draw(st.lists(st.sampled_from(RS_OPTIONS), min_size=1, max_size=4))
    unique = list(dict.fromkeys(options))
    specs = []
    for option in unique:
        if option.endswith("k1"):
            lo = draw(st.floats(0.3, 1.0))
            hi = draw(st.floats(1.0, 3.0))
            specs.append(draw(st.sampled_from([f"{lo}_{hi}", f"{hi}"])))
        else:
            specs.append(str(draw(st.floats(1e-3, 2.0))))
    shared = (draw(st.booleans()) and all(o.endswith("k1") for o in unique)) or len(unique) == 1
    return {"rollout_rs": ",".join(options), "rollout_rs_threshold": specs[0] if shared else ",".join(specs)}


@st.composite
def any_config(draw: st.DrawFn) -> dict:
    config: dict = {}
    level = draw(st.sampled_from([None, "token", "sequence"]))
    if level:
        config["rollout_is"] = level
        upper = draw(st.floats(1.01, 10.0))
        if draw(st.booleans()):
            config["rollout_is_threshold"] = f"{draw(st.floats(0.05, 1.0))}_{upper}"
        else:
            config["rollout_is_threshold"] = upper
        config["rollout_is_batch_normalize"] = draw(st.booleans())
    if draw(st.booleans()):
        config.update(draw(rs_config()))
    return config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=any_config(),
    seed=st.integers(0, 2**31),
    rows=st.integers(1, 12),
    width=st.integers(1, 24),
    noise=st.sampled_from([0.001, 0.05, 0.3, 1.5, 6.0]),
    empty=st.integers(0, 3),
)
def test_random_configs_and_batches(config: dict, seed: int, rows: int, width: int, noise: float, empty: int) -> None:
    rng = np.random.default_rng(seed)
    old, rollout, mask = random_batch(
        rng, rows=rows, width=width, noise=noise, empty_rows=min(empty, rows), outliers=0.05
    )
    compare_with_verl(old, rollout, mask, config)


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--preset", "decoupled_seq_is_rs"),
        ("--is", "token", "--is-threshold", "0.5_5.0", "--batch-normalize"),
        ("--rs", "token_k1,seq_mean_k3,seq_max_k2", "--rs-threshold", "0.7_1.4,0.02,0.5"),
    ],
)
def test_cli_json_per_step_matches_verl(capsys: pytest.CaptureFixture, tmp_path: Path, flags: tuple) -> None:
    """End to end: a Parquet dump with steps, through `rcdiag analyze --format json`, against verl run on each
    step's padded batch and on all rows at once (the pooled view)."""
    from test_cli import run

    rng = np.random.default_rng(len(flags))
    old, rollout, mask = random_batch(rng, rows=36, width=30, noise=0.3, empty_rows=3, outliers=0.01)
    columns = ragged_lists(old, rollout, mask)
    steps = np.array([i % 3 for i in range(36)])
    columns["step"] = steps.tolist()
    path = write_dump(tmp_path / "dump.parquet", columns)
    code, out, err = run(capsys, "analyze", str(path), "--format", "json", *flags)
    assert code == 0, err
    report = json.loads(out)
    config = dict(report["config"])
    config.pop("bypass_mode"), config.pop("loss_type")
    for step in report["steps"]:
        rows = steps == step["step"]
        expected = verl_metrics(*(torch.from_numpy(a[rows]) for a in (old, rollout, mask)), **config)
        _assert_close(step["metrics"], expected)
    _assert_close(report["metrics"], verl_metrics(*(torch.from_numpy(a) for a in (old, rollout, mask)), **config))


def _assert_close(ours: dict, expected: dict) -> None:
    assert list(ours) == list(expected)
    bad = [
        (k, ours[k], v)
        for k, v in expected.items()
        if not (
            (ours[k] is None and not math.isfinite(v))
            or (ours[k] is not None and math.isclose(ours[k], v, rel_tol=1e-4, abs_tol=_tolerance(k, expected)))
        )
    ]
    assert not bad, bad
