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
from reference import all_metrics
from verl_oracle import load_verl, require_verl, verl_metrics

from rcdiag.settings.correction import PRESETS, RS_OPTIONS

pytestmark = pytest.mark.verl
try:
    import torch
except ImportError:  # the fixture below reports it (a failure under CI=true)
    torch = None


@pytest.fixture(autouse=True)
def _verl() -> None:
    """Every test here needs verl itself: missing, it skips saying what to install, or fails under CI=true."""
    require_verl()


F32_ULP = 2.0**-23
"""Spacing of float32 numbers in [1, 2): one unit in the last place, relative."""
VARIANCE_ULPS = 16
"""verl's population std is sqrt(E[x^2] - E[x]^2) in float32 with both means float32 sums (torch sums pairwise):
its variance is within about 16 ulps of E[x^2] of the exact one."""
VALUE_ULPS = 4
"""verl's per-value inputs (an exp, a float32 row sum) are within a few ulps of their magnitude of exact ones."""


def _close(got: float, want: float, key: str, spreads: dict[str, tuple[float, float]]) -> bool:
    """Ours (float64, accurate) against verl's value, within verl's own float32 error where its arithmetic loses
    more than rounding; relative 1e-4 elsewhere.

    A population ``*_std``: verl's variance is within ``VARIANCE_ULPS`` ulps of E[x^2] of the exact one, so its std
    lies in [sqrt(var - e), sqrt(var + e)], widened by the rounding of its inputs (a std moves by at most the
    largest change of a value). A sample std (N - 1) in place of the population std falls outside. ``seq_std``
    is torch.std (accurate) of float32 values: their rounding. chi2 is E[ratio^2] - 1 in float32 in verl.
    """
    name = key.removeprefix("rollout_corr/")
    if name.endswith("seq_std") and name.removesuffix("seq_std") + "std" in spreads:
        _, magnitude = spreads[name.removesuffix("seq_std") + "std"]
        return math.isclose(got, want, rel_tol=1e-4, abs_tol=VALUE_ULPS * F32_ULP * magnitude + 1e-6)
    if name in spreads:
        second_moment, magnitude = spreads[name]
        error = VARIANCE_ULPS * F32_ULP * second_moment
        inputs = VALUE_ULPS * F32_ULP * magnitude
        variance = got * got
        return math.sqrt(max(variance - error, 0.0)) - inputs <= want <= math.sqrt(variance + error) + inputs
    return math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5 if "chi2" in key else 1e-6)


def spreads(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, config: dict) -> dict[str, tuple[float, float]]:
    """E[x^2] and the float32 rounding magnitude behind each population std metric (the float64 reference)."""
    out: dict[str, tuple[float, float]] = {}
    all_metrics(old, rollout, mask, out, **config)
    return out


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
        elif got is None or not _close(got, want, key, moments):
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
    assert _close(ours, theirs, key, bounds)
    assert not _close(sample, theirs, key, bounds)
