"""``--verl-version``: rcdiag against the code of each verl release it reproduces (v0.7.1, v0.8.0, v0.9.0; 0.9.1
runs 0.9.0's byte-identical code), loaded from .gl/verl-<version> (tests/verl_oracle.py).

Same keys, same order, same values (the tolerances of tests/verl_cases.py, with v0.7.1's std/ESS on
the raw weights clamped to [1/U, U]); options a release lacked are refused naming the first release with them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, ragged_lists, random_batch, run, run_padded, write_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verl_cases import CONFIGS, F32_ULP, VALUE_ULPS, any_config, close_to_verl, spreads
from verl_oracle import ORACLE_VERSIONS, load_verl, require_verl, verl_metrics

from rcdiag import analyze
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import PRESETS, CorrectionConfig, preset
from rcdiag.settings.versions import DEFAULT_VERSION, VERSIONS

pytestmark = pytest.mark.verl
try:
    import torch
except ImportError:  # require_verl reports it (a failure under CI=true)
    torch = None

P = "rollout_corr/"


def oracle(version: str) -> str:
    """The release whose code reproduces ``version`` (0.9.1 -> 0.9.0), loaded or skipped/failed."""
    code = VERSIONS[version].semantics
    require_verl(code)
    return code


def for_release(config: dict, version: str) -> dict | None:
    """``config`` as a user of ``version`` would write it (v0.7.1 took a float IS threshold and had no IcePop);
    ``None`` where the release cannot express it."""
    config = dict(config)
    threshold = config.get("rollout_is_threshold")
    if version == "0.7.1" and config.get("rollout_is") is not None and threshold is not None:
        if isinstance(threshold, str) and "_" in threshold:
            return None
        config["rollout_is_threshold"] = float(threshold)
    return config


def legacy_spreads(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, config: dict) -> dict:
    """v0.7.1's IS std runs on the raw weights clamped to [1/U, U]: E[x^2] and the magnitude for its tolerance."""
    out = spreads(old, rollout, mask, config)
    level = config.get("rollout_is")
    if level is None:
        return out
    upper = float(config.get("rollout_is_threshold", 2.0))
    valid = mask.astype(bool)
    lr = (old - rollout).astype(np.float32)
    if level == "token":
        values = np.exp(np.clip(lr[valid], -20, 20)).astype(np.float64)
        weights = np.ones_like(values)
    else:
        sums = np.where(valid, lr.astype(np.float64), 0.0).sum(axis=1)
        values, weights = np.exp(np.clip(sums, -20, 20)), valid.sum(axis=1).astype(np.float64)
    clamped = np.clip(values, 1 / upper, upper)
    out["rollout_is_std"] = (float(np.average(clamped**2, weights=weights)), float(clamped.max()))
    return out


def at_the_bound(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, config: dict) -> float:
    """v0.8.0 compares the float32 mean of a row's clamped weights with U: for a row whose weights are all clamped
    the exact mean is U, but torch's float32 sum of n copies of U can round a few ulps above it, so verl counts
    that row as "high" at random. The share of rows where that can happen (rcdiag reports the exact answer)."""
    if config.get("rollout_is") is None:
        return 0.0
    upper = np.float32(float(str(config.get("rollout_is_threshold", 2.0)).split("_")[-1]))
    valid = mask.astype(bool)
    lr = (old - rollout).astype(np.float32)
    if config["rollout_is"] == "token":
        clamped = np.where(valid, np.exp(np.clip(lr, -20, 20)) >= upper, True)
        rows = clamped.all(axis=1) & valid.any(axis=1)
    else:
        sums = np.where(valid, lr.astype(np.float64), 0.0).sum(axis=1)
        rows = (np.exp(np.clip(sums, -20, 20)) >= upper) & valid.any(axis=1)
    return float(rows.mean())


def assert_matches(ours: dict, expected: dict, bounds: dict, raw_magnitude: float, slack: float = 0.0) -> None:
    assert list(ours) == list(expected)
    bad = []
    for key, want in expected.items():
        got = ours[key]
        if key.startswith(P + "rollout_is_seq_fraction_") and got is not None and abs(got - want) <= slack + 1e-6:
            continue
        if not math.isfinite(want):
            ok = got is None
        elif got is None:
            ok = False
        elif key == P + "rollout_is_seq_std":  # torch.std of float32 row means, which v0.7.1 takes of raw weights
            ok = math.isclose(got, want, rel_tol=1e-4, abs_tol=VALUE_ULPS * F32_ULP * raw_magnitude + 1e-6)
        else:
            ok = close_to_verl(got, want, key, bounds)
        if not ok:
            bad.append((key, got, want))
    assert not bad, bad


def compare(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, config: dict, version: str) -> None:
    code = oracle(version)
    tensors = [torch.from_numpy(a) for a in (old, rollout, mask)]
    report = run_padded(old, rollout, mask, verl_version=version, **config)
    try:
        expected = verl_metrics(*tensors, version=code, **config)
    except ZeroDivisionError:
        assert "verl_crash_ess_zero_division" in {f.code for f in report.findings}
        return
    except ValueError as exc:
        message = str(exc)
        assert [f.code for f in report.findings] == ["verl_crash_empty_batch"], message
        return
    bounds = legacy_spreads(old, rollout, mask, config) if code == "0.7.1" else spreads(old, rollout, mask, config)
    raw = report.metrics.get(P + "rollout_is_seq_max") or 1.0
    slack = at_the_bound(old, rollout, mask, config) if version == "0.8.0" else 0.0
    assert_matches(report.metrics, expected, bounds, abs(raw), slack)


VERSION_NAMES = list(VERSIONS)


@pytest.mark.parametrize("version", VERSION_NAMES)
@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
@pytest.mark.parametrize("noise", [0.05, 0.5, 3.0])
def test_fixed_configs_match_each_release(config: dict, noise: float, version: str) -> None:
    config = for_release(config, version)
    if config is None:
        return  # IcePop under 0.7.1: refused, tested below
    rng = np.random.default_rng(int(noise * 100))
    old, rollout, mask = random_batch(rng, rows=24, width=40, noise=noise, outliers=0.02)
    compare(old, rollout, mask, config, version)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from(["0.7.1", "0.8.0"]),
    config=any_config(),
    seed=st.integers(0, 2**31),
    rows=st.integers(1, 12),
    width=st.integers(1, 24),
    noise=st.sampled_from([0.001, 0.05, 0.3, 1.5, 6.0]),
    empty=st.integers(0, 3),
)
def test_random_configs_match_older_releases(
    version: str, config: dict, seed: int, rows: int, width: int, noise: float, empty: int
) -> None:
    config = for_release(config, version)
    if config is None:
        return
    rng = np.random.default_rng(seed)
    old, rollout, mask = random_batch(rng, rows=rows, width=width, noise=noise, empty_rows=min(empty, rows))
    compare(old, rollout, mask, config, version)


def test_huge_ratios_give_huge_means_under_0_7_1_only() -> None:
    """The reference's example: rows with log-ratios of +-49.9 (clamped to +-20). v0.7.1 averages the raw
    weights (up to e^20 per token); later releases the truncated ones."""
    old = np.zeros((4, 8), np.float32)
    rollout = np.full((4, 8), -0.01, np.float32)
    rollout[0, :2] = -49.9
    old[1, :3] = -49.9
    mask = np.ones((4, 8), np.int64)
    config = {"rollout_is": "token", "rollout_is_threshold": 2.0}
    means = {}
    for version in ORACLE_VERSIONS:
        compare(old, rollout, mask, config, version)
        means[version] = run_padded(old, rollout, mask, verl_version=version, **config).metrics[P + "rollout_is_mean"]
    assert means["0.7.1"] == pytest.approx(2 * math.exp(20) / 32, rel=1e-3)  # two tokens at e^20, of 32
    assert means["0.9.0"] == means["0.8.0"] < 2.0


def test_seq_fraction_high_is_dead_under_0_8_0_tis() -> None:
    """v0.8.0 compared the clamped per-row means with U, so under TIS its seq_fraction_high is 0; v0.9.0 uses the
    raw per-row mean."""
    old, rollout, mask = random_batch(np.random.default_rng(5), rows=16, width=12, noise=1.5, empty_rows=0)
    config = {"rollout_is": "token", "rollout_is_threshold": 1.5}
    key = P + "rollout_is_seq_fraction_high"
    values = {}
    for version in ("0.8.0", "0.9.0"):
        compare(old, rollout, mask, config, version)
        values[version] = run_padded(old, rollout, mask, verl_version=version, **config).metrics[key]
    assert values["0.8.0"] == 0.0 < values["0.9.0"]


def test_inverted_k1_band_is_accepted_before_0_9_0_and_rejects_everything() -> None:
    old, rollout, mask = random_batch(np.random.default_rng(9), rows=10, width=16, noise=0.2, empty_rows=1)
    config = {"rollout_rs": "token_k1,seq_mean_k1", "rollout_rs_threshold": "2.0_0.5"}
    for version in ("0.7.1", "0.8.0"):
        compare(old, rollout, mask, config, version)
        metrics = run_padded(old, rollout, mask, verl_version=version, **config).metrics
        assert metrics[P + "rollout_rs_masked_fraction"] == 1.0
    require_verl("0.9.0")
    helper, _ = load_verl("0.9.0")
    with pytest.raises(ValueError, match="must be lower <= upper") as theirs:
        helper.compute_rollout_correction_and_rejection_mask(
            *(torch.from_numpy(a) for a in (old, rollout, mask)), **config
        )
    with pytest.raises(ConfigError) as ours:
        CorrectionConfig(verl_version="0.9.0", **config).resolve()
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("version", ORACLE_VERSIONS)
def test_presets_match_each_release(version: str) -> None:
    require_verl(version)
    _, verl_config = load_verl(version)
    theirs_names = {name for name in PRESETS if hasattr(verl_config, name)}
    assert theirs_names <= set(PRESETS)
    for name in PRESETS:
        if name not in theirs_names:
            with pytest.raises(ConfigError, match=f"needs verl 0.8.0 or later; verl {version} does not have it"):
                preset(name, version)
            continue
        ours, theirs = preset(name, version), getattr(verl_config, name)()
        assert ours.verl_version == version
        for field, value in ours.to_dict().items():
            if field != "verl_version":
                assert getattr(theirs, field) == value, (version, name, field)
    assert len(theirs_names) == (17 if version == "0.7.1" else 19)


# ---------------------------------------------------------------------------------------------------- the CLI


@pytest.fixture
def dump(tmp_path: Path) -> tuple[Path, tuple[np.ndarray, ...], np.ndarray]:
    rng = np.random.default_rng(3)
    old, rollout, mask = random_batch(rng, rows=30, width=20, noise=1.0, empty_rows=2, outliers=0.05)
    columns = ragged_lists(old, rollout, mask)
    steps = np.array([i % 2 for i in range(30)])
    columns["step"] = steps.tolist()
    return write_dump(tmp_path / "dump.parquet", columns), (old, rollout, mask), steps


@pytest.mark.parametrize("version", VERSION_NAMES)
def test_cli_per_step_json_matches_each_release(capsys: pytest.CaptureFixture, dump: tuple, version: str) -> None:
    path, arrays, steps = dump
    code = oracle(version)
    status, out, err = run(capsys, "analyze", str(path), "--preset", "decoupled_geo_rs_token_tis", "--is-threshold",
                           "1.5", "--verl-version", version, "--format", "json")  # fmt: skip
    assert status == 0, err
    report = json.loads(out)
    assert report["config"]["verl_version"] == version
    config = {k: v for k, v in report["config"].items() if k.startswith("rollout_")}
    config["rollout_is_threshold"] = float(config["rollout_is_threshold"])
    for step in report["steps"]:
        rows = steps == step["step"]
        part = [a[rows] for a in arrays]
        expected = verl_metrics(*(torch.from_numpy(a) for a in part), version=code, **config)
        bounds = legacy_spreads(*part, config) if code == "0.7.1" else spreads(*part, config)
        assert_matches(step["metrics"], expected, bounds, abs(step["metrics"][P + "rollout_is_seq_max"]))


def test_cli_default_is_the_latest_release_and_the_header_names_it(capsys: pytest.CaptureFixture, dump: tuple) -> None:
    path = str(dump[0])
    assert json.loads(run(capsys, "analyze", path, "--format", "json")[1])["config"]["verl_version"] == "0.9.1"
    assert DEFAULT_VERSION == "0.9.1" == list(VERSIONS)[-1]
    for command in ("analyze", "compare", "check"):
        args = (path, path) if command == "compare" else (path, "--max", "kl=1") if command == "check" else (path,)
        out = run(capsys, command, *args, "--verl-version", "0.8.0")[1]
        assert "bypass_mode=false (decoupled), as verl 0.8.0 logs it" in " ".join(out.split()), command


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--is", "token", "--is-threshold", "0.5_5.0"), "--is-threshold '0.5_5.0' (IcePop, lower_upper) needs "
         "verl 0.8.0 or later; verl 0.7.1 does not have it."),
        (("--preset", "decoupled_token_icepop"), "The preset decoupled_token_icepop needs verl 0.8.0 or later; verl "
         "0.7.1 does not have it."),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["analyze", "compare", "check"])
def test_an_option_the_release_lacked_is_exit_2_naming_the_first_release(
    capsys: pytest.CaptureFixture, dump: tuple, flags: tuple, message: str, command: str
) -> None:
    path = str(dump[0])
    paths = (path, path) if command == "compare" else (path,)
    status, _, err = run(capsys, command, *paths, "--verl-version", "0.7.1", *flags)
    assert status == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_release_is_exit_2_listing_them(capsys: pytest.CaptureFixture, dump: tuple) -> None:
    status, _, err = run(capsys, "analyze", str(dump[0]), "--verl-version", "0.7.0")
    assert status == 2 and "Unknown verl version '0.7.0'. rcdiag reproduces: 0.7.1, 0.8.0, 0.9.0, 0.9.1." in err


def test_compare_and_check_run_under_a_release(capsys: pytest.CaptureFixture, dump: tuple, tmp_path: Path) -> None:
    path = str(dump[0])
    status, out, err = run(capsys, "compare", path, path, "--verl-version", "0.7.1", "--is", "token", "--format",
                           "json")  # fmt: skip
    assert status == 0, err
    data = json.loads(out)
    assert "0.7.1" in json.dumps(data)
    # The raw token ratios of this dump average far above 2 (numpy below); the truncated ones cannot exceed 2.
    old, rollout, mask = dump[1]
    valid = mask.astype(bool)
    assert np.exp(np.clip((old - rollout)[valid], -20, 20)).mean() > 2
    gate = ("--is", "token", "--max", "rollout_is_mean=2", "--format", "json")
    status, out, err = run(capsys, "check", path, "--verl-version", "0.7.1", *gate)
    assert status == 1, err
    assert json.loads(out)["config"]["verl_version"] == "0.7.1"
    status, out, err = run(capsys, "check", path, *gate)
    assert status == 0, err


def test_0_9_0_and_0_9_1_are_the_same_computation() -> None:
    resolved = {v: CorrectionConfig(rollout_is="token", verl_version=v).resolve() for v in VERSIONS}
    assert resolved["0.9.0"].same_computation(resolved["0.9.1"])
    assert not resolved["0.8.0"].same_computation(resolved["0.9.0"])
    assert not resolved["0.7.1"].same_computation(resolved["0.8.0"])


def test_state_files_keep_the_release(capsys: pytest.CaptureFixture, dump: tuple, tmp_path: Path) -> None:
    """A state saved under 0.7.1 merges back to 0.7.1's values; 0.9.0 and 0.9.1 shards merge as one computation, and
    a 0.7.1 shard does not merge with a 0.9.1 one."""
    _, arrays, steps = dump
    half = [write_dump(tmp_path / f"h{i}.parquet", ragged_lists(*(a[steps == i] for a in arrays))) for i in (0, 1)]
    analyze_json = ("analyze", "--is", "token", "-q", "--format", "json")
    state = str(tmp_path / "s.json")
    direct = json.loads(run(capsys, *analyze_json, str(half[0]), "--verl-version", "0.7.1", "--save-state", state)[1])
    merged = json.loads(run(capsys, "merge", state, "--format", "json")[1])
    assert merged["config"]["verl_version"] == "0.7.1" and merged["metrics"] == direct["metrics"]
    states = [str(tmp_path / f"v{i}.json") for i in (0, 1)]
    for part, version, target in zip(half, ("0.9.0", "0.9.1"), states, strict=True):
        assert run(capsys, *analyze_json, str(part), "--verl-version", version, "--save-state", target)[0] == 0
    assert run(capsys, "merge", *states, "--format", "json")[0] == 0
    run(capsys, *analyze_json, str(half[1]), "--verl-version", "0.7.1", "--save-state", states[1])
    status, _, err = run(capsys, "merge", *states)
    assert status == 2 and "verl_version=0.7.1" in err


# ------------------------------------------------------------------------------------------------ rcdiag sweep


@pytest.mark.parametrize("version", ["0.7.1", "0.8.0"])
def test_sweep_rows_equal_analyze_under_the_release(capsys: pytest.CaptureFixture, dump: tuple, version: str) -> None:
    """Each sweep row is analyze with that option at that threshold, under the same release (analyze is checked
    against each release's own code above); IcePop bands leave 0.7.1's default grids."""
    from rcdiag.sweep.grid import DEFAULT_GRIDS, resolve

    path = dump[0]
    status, out, err = run(capsys, "sweep", str(path), "--is", "token,sequence", "--rs", "token_k1,seq_mean_k3",
                           "--verl-version", version, "--format", "json", "--no-recommend", "-q")  # fmt: skip
    assert status == 0, err
    result = json.loads(out)
    assert result["verl_version"] == version
    icepop = version != "0.7.1"
    for option in ("is_token", "is_sequence", "token_k1"):
        expected = [s for s in DEFAULT_GRIDS[option] if icepop or "_" not in s or option == "token_k1"]
        assert [r["threshold"] for r in result["sweep"] if r["option"] == option] == expected
    for row in result["sweep"]:
        config = resolve(row["option"], row["threshold"], version).config(row["option"], version)
        report = analyze(path, config)
        for key, got in row["metrics"].items():
            want = report.metrics[key]
            assert (got is None and want is None) or math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (
                row["option"], row["threshold"], key, got, want)  # fmt: skip
    ranked = {p["name"] for p in result["presets"]}
    assert ("decoupled_token_icepop" in ranked) == icepop and "decoupled_token_is" in ranked


def test_sweep_refuses_icepop_under_0_7_1_and_states_keep_the_release(
    capsys: pytest.CaptureFixture, dump: tuple, tmp_path: Path
) -> None:
    path = str(dump[0])
    status, _, err = run(capsys, "sweep", path, "--is", "token", "--thresholds", "2.0,0.5_2.0", "--verl-version",
                         "0.7.1")  # fmt: skip
    assert status == 2 and "needs verl 0.8.0 or later; verl 0.7.1 does not have it." in err
    state = str(tmp_path / "s.json")
    args = ("sweep", path, "--is", "token", "--verl-version", "0.7.1", "--format", "json", "-q", "--no-recommend")
    direct = json.loads(run(capsys, *args, "--save-state", state)[1])
    merged = json.loads(run(capsys, "merge", state, "--format", "json")[1])
    assert merged["verl_version"] == "0.7.1" and merged["sweep"] == direct["sweep"]


def test_a_rules_file_sets_the_release_and_the_flag_overrides_it(
    capsys: pytest.CaptureFixture, dump: tuple, tmp_path: Path
) -> None:
    """[engine] verl_version in a rules file; --verl-version on top. The raw token ratios of this dump average
    above 2 (see test_compare_and_check_run_under_a_release), the truncated ones cannot."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[engine]\nverl_version = "0.7.1"\nrollout_is = "token"\n[max]\nrollout_is_mean = 2\n')
    path = str(dump[0])
    status, out, _ = run(capsys, "check", path, "--rules", str(rules), "--format", "json")
    assert status == 1 and json.loads(out)["config"]["verl_version"] == "0.7.1"
    status, out, _ = run(capsys, "check", path, "--rules", str(rules), "--verl-version", "0.9.1", "--format", "json")
    assert status == 0 and json.loads(out)["config"]["verl_version"] == "0.9.1"


def test_worker_processes_keep_the_release(capsys: pytest.CaptureFixture) -> None:
    """--workers sends the configuration, release included, to every part: the report equals one process's."""
    path = str(ROOT / "sample_data" / "outliers.parquet")
    args = ("analyze", path, "--is", "token", "--verl-version", "0.7.1", "-q", "--format", "json")
    one = json.loads(run(capsys, *args)[1])
    two = json.loads(run(capsys, *args, "--workers", "2")[1])
    assert two["config"]["verl_version"] == "0.7.1" and two["metrics"] == one["metrics"]
    assert two["steps"] == one["steps"]
