"""rcdiag against verl v0.9.0 itself: same keys, same order, same values, same crashes (the other releases:
tests/verl_parity/test_verl_versions.py).

verl is loaded from its installed files (``pip install --no-deps --target .gl/verl-0.9.0 verl==0.9.0``, done by
.ci/run); without it
these tests skip saying what to install, and fail under ``CI=true``. Tolerances: relative 1e-4, or verl's own float32 error where its arithmetic
loses digits (std as E[x^2] - E[x]^2, chi2 as E[ratio^2] - 1): there rcdiag's float64 sums are the accurate
ones (tests/metrics/test_metrics_reference.py checks them against a float64 reference).
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
from verl_cases import CONFIGS, any_config, close_to_verl, spreads
from verl_oracle import load_verl, require_verl, verl_metrics

from rcdiag.settings.correction import PRESETS

pytestmark = pytest.mark.verl
try:
    import torch
except ImportError:  # the fixture below reports it (a failure under CI=true)
    torch = None


@pytest.fixture(autouse=True)
def _verl() -> None:
    """Every test here needs verl itself: missing, it skips saying what to install, or fails under CI=true."""
    require_verl()


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
    _assert_close(report.metrics, expected, spreads(old, rollout, mask, config))


def test_presets_match_verl_classmethods() -> None:
    _, verl_config = load_verl()
    for name, build in PRESETS.items():
        theirs = getattr(verl_config, name)()
        ours = build()
        for field in ours.to_dict():
            if field == "verl_version":  # rcdiag's own field
                continue
            assert getattr(theirs, field) == getattr(ours, field), (name, field)


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
@pytest.mark.parametrize("small_dump_bytes", ["0", str(1 << 40)], ids=["compiled", "numpy"])
def test_cli_json_per_step_matches_verl(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple, small_dump_bytes: str
) -> None:
    """End to end: a Parquet dump with steps, through `rcdiag analyze --format json`, against verl run on each
    step's padded batch and on all rows at once (the pooled view); by the numba kernels and by a small dump's numpy
    path (``rcdiag.kernels.small``)."""
    from conftest import run

    from rcdiag.kernels.small import SWITCH

    monkeypatch.setenv(SWITCH, small_dump_bytes)

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
        arrays = [a[rows] for a in (old, rollout, mask)]
        expected = verl_metrics(*(torch.from_numpy(a) for a in arrays), **config)
        _assert_close(step["metrics"], expected, spreads(*arrays, config))
    expected = verl_metrics(*(torch.from_numpy(a) for a in (old, rollout, mask)), **config)
    _assert_close(report["metrics"], expected, spreads(old, rollout, mask, config))


def _assert_close(ours: dict, expected: dict, moments: dict[str, tuple[float, float]]) -> None:
    assert list(ours) == list(expected)
    bad = []
    for key, want in expected.items():
        got = ours[key]
        if not math.isfinite(want):
            if got is not None:
                bad.append((key, got, want))
        elif got is None or not close_to_verl(got, want, key, moments):
            bad.append((key, got, want))
    assert not bad, bad


@pytest.mark.parametrize("config", [{"rollout_is": "token"}, {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}])
def test_the_std_tolerance_tells_population_from_sample_std(config: dict) -> None:
    """The std tolerance is verl's float32 error, not a loose floor: verl's population std passes, the sample
    std (N - 1) of the same values does not."""
    old, rollout, mask = random_batch(np.random.default_rng(77), rows=24, width=40, noise=0.1, empty_rows=0)
    key = "rollout_corr/rollout_is_std" if "rollout_is" in config else "rollout_corr/rollout_rs_token_k1_std"
    ours = run_padded(old, rollout, mask, **config).metrics[key]
    theirs = verl_metrics(*(torch.from_numpy(a) for a in (old, rollout, mask)), **config)[key]
    n = int(mask.sum())
    sample = ours * math.sqrt(n / (n - 1))
    bounds = spreads(old, rollout, mask, config)
    assert close_to_verl(ours, theirs, key, bounds)
    assert not close_to_verl(sample, theirs, key, bounds)
