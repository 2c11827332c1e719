"""``rcdiag sweep``: every row equals ``rcdiag analyze`` at that configuration and verl itself; invariant to
chunking and workers; state files merge; recommendations meet their target on dumps of known distribution."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, padded_chunk, random_batch, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verl_oracle import require_verl, verl_metrics

import rcdiag
from rcdiag.settings.correction import PRESETS
from rcdiag.sweep import sweep_chunks
from rcdiag.sweep.grid import DEFAULT_GRIDS, OPTIONS, build_grid, resolve

P = "rollout_corr/"


def _batch(seed: int, long: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty rows, fully masked rows (tokens present, mask 0), holes, large outliers; optionally long rows."""
    rng = np.random.default_rng(seed)
    rows, width = (24, 2000) if long else (48, 60)
    old, rollout, mask = random_batch(rng, rows=rows, width=width, noise=0.05, empty_rows=3, outliers=0.01)
    mask[5] = 0  # fully masked, with its tokens present in the dump
    rollout[7, :3] = old[7, :3] - 30.0  # log-ratios beyond verl's +-20 clamp
    return old, rollout, mask


def _write_padded(path: Path, old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, steps: np.ndarray) -> Path:
    """Full-width rows (fully masked rows keep their tokens), int8 masks, a step column, small row groups."""
    table = pa.table(
        {
            "old_log_prob": pa.array(old.tolist(), type=pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(rollout.tolist(), type=pa.list_(pa.float32())),
            "response_mask": pa.array(mask.astype(np.int8).tolist(), type=pa.list_(pa.int8())),
            "step": pa.array(steps.tolist(), type=pa.int64()),
        }
    )
    pq.write_table(table, path, row_group_size=8)
    return path


def _close(got: float | None, want: float | None, rel: float = 1e-9, abs_tol: float = 1e-12) -> bool:
    if got is None or want is None:
        return got is None and want is None
    return math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol)


def _sweep_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    code, out, err = run(capsys, "sweep", *args, "--format", "json", "-q")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(params=[False, True], ids=["short", "long"])
def stepped_dump(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    old, rollout, mask = _batch(11, long=request.param)
    steps = np.repeat([3, 4, 5], old.shape[0] // 3)
    return _write_padded(tmp_path / "d.parquet", old, rollout, mask, steps), old, rollout, mask


def test_every_row_equals_analyze_pooled_and_per_step(capsys: pytest.CaptureFixture, stepped_dump: tuple) -> None:
    path = stepped_dump[0]
    result = _sweep_json(capsys, str(path), "--no-recommend")
    assert {row["option"] for row in result["sweep"]} == set(OPTIONS)
    assert len(result["sweep"]) == sum(len(DEFAULT_GRIDS[o]) for o in OPTIONS)
    for row in result["sweep"]:
        config = resolve(row["option"], row["threshold"]).config(row["option"])
        report = rcdiag.analyze(path, config)
        expected = {k: v for k, v in report.metrics.items() if k.startswith(_prefixes(row["option"]))}
        assert list(row["metrics"]) == list(expected), row["option"]
        for key, want in expected.items():
            assert _close(row["metrics"][key], want), (row["option"], row["threshold"], key, row["metrics"][key], want)
        assert [s["step"] for s in row["steps"]] == [s.step for s in report.steps]
        for mine, theirs in zip(row["steps"], report.steps, strict=True):
            for key in expected:
                assert _close(mine["metrics"][key], theirs.metrics[key]), (row["option"], mine["step"], key)


def _prefixes(option: str) -> tuple[str, ...]:
    if option.startswith("is_"):
        return (P + "rollout_is_",)
    return (P + f"rollout_rs_{option}_", P + "rollout_rs_masked_fraction", P + "rollout_rs_seq_masked_fraction")


def test_every_row_equals_verl_per_step(capsys: pytest.CaptureFixture, stepped_dump: tuple) -> None:
    torch = require_verl()  # skips saying what to install; fails under CI=true
    from verl_cases import close_to_verl, spreads

    path, old, rollout, mask = stepped_dump
    per_step = old.shape[0] // 3
    long = old.shape[1] > 1000  # verl pads: check the long dump's first step only, to keep the suite quick
    result = _sweep_json(capsys, str(path), "--no-recommend")
    for row in result["sweep"]:
        option, spec = row["option"], row["threshold"]
        config = resolve(option, spec).config(option).to_dict()
        for index, step in enumerate(row["steps"][:1] if long else row["steps"]):
            rows = slice(per_step * index, per_step * (index + 1))
            arrays = [np.ascontiguousarray(a[rows]) for a in (old, rollout, mask)]
            try:
                expected = verl_metrics(*(torch.from_numpy(a) for a in arrays), **config)
            except ZeroDivisionError:
                assert step["metrics"][P + "rollout_is_eff_sample_size"] is None
                continue
            bounds = spreads(*arrays, config)
            for key, got in step["metrics"].items():
                want = expected[key]
                if not math.isfinite(want):
                    assert got is None, (option, spec, key)
                    continue
                assert got is not None and close_to_verl(got, want, key, bounds), (option, spec, key, got, want)


def test_icepop_crash_row_has_the_crash_finding_and_the_sweep_goes_on(capsys: pytest.CaptureFixture) -> None:
    healthy = str(ROOT / "sample_data" / "healthy.parquet")
    result = _sweep_json(capsys, healthy, "--is", "token", "--thresholds", "2.0,5.0_6.0,0.5_5.0", "--no-recommend")
    rows = {row["threshold"]: row for row in result["sweep"]}
    assert list(rows) == ["2.0", "5.0_6.0", "0.5_5.0"]
    assert rows["5.0_6.0"]["metrics"][P + "rollout_is_eff_sample_size"] is None  # every weight zeroed
    assert rows["5.0_6.0"]["metrics"][P + "rollout_is_oob_ratio"] == 1.0
    assert rows["0.5_5.0"]["metrics"][P + "rollout_is_eff_sample_size"] > 0.99
    codes = [(f["code"], f["message"].split(":")[0]) for f in result["findings"]]
    assert codes == [("verl_crash_ess_zero_division", "is_token at 5.0_6.0")]
    assert result["findings"][0]["steps"] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rs", "token_k1", "--thresholds", "2.0_0.5"), "must be lower <= upper"),
        (("--rs", "token_k2", "--thresholds", "0.1_0.2"), "single upper bound"),
        (("--is", "token", "--thresholds", "3_2"), "lower bound must be <= upper bound"),
        (("--rs", "token_k1,token_k2", "--thresholds", "0.1"), "exactly one"),
        (("--rs", "seq_max_k1"), "--rs must be one of token_k1, "),  # the flag, not the keyword (test_option_checks)
        (("--is", "row"), "--is must be one of token, sequence, got 'row'"),
    ],
)
def test_refused_thresholds_are_exit_2_with_one_line(capsys: pytest.CaptureFixture, args: tuple, message: str) -> None:
    healthy = str(ROOT / "sample_data" / "healthy.parquet")
    code, out, err = run(capsys, "sweep", healthy, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def _points(report: rcdiag.sweep.sweep_report.SweepReport) -> dict:
    return {(r.option, r.threshold): (r.metrics, r.steps) for r in report.rows}


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key, (metrics, steps) in a.items():
        other_metrics, other_steps = b[key]
        for name, value in metrics.items():
            assert _close(value, other_metrics[name], rel=1e-10), (key, name)
        assert [s for s, _ in steps] == [s for s, _ in other_steps]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cut=st.integers(1, 47), shuffle=st.booleans())
def test_rows_do_not_depend_on_chunking_or_row_order(seed: int, cut: int, shuffle: bool) -> None:
    old, rollout, mask = _batch(seed)
    steps = np.repeat([0, 1], 24)
    whole = sweep_chunks([padded_chunk(old, rollout, mask, steps)])
    order = np.random.default_rng(seed).permutation(48) if shuffle else np.arange(48)
    o, r, m, s = old[order], rollout[order], mask[order], steps[order]
    parts = [padded_chunk(o[:cut], r[:cut], m[:cut], s[:cut]), padded_chunk(o[cut:], r[cut:], m[cut:], s[cut:])]
    _same(_points(whole), _points(sweep_chunks(parts)))


def test_workers_chunk_size_and_merged_states_give_the_same_sweep(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    old, rollout, mask = _batch(3)
    steps = np.repeat([0, 1, 2], 16)
    path = _write_padded(tmp_path / "all.parquet", old, rollout, mask, steps)
    shards = [
        _write_padded(tmp_path / f"s{i}.parquet", old[i * 24 : (i + 1) * 24], rollout[i * 24 : (i + 1) * 24],
                      mask[i * 24 : (i + 1) * 24], steps[i * 24 : (i + 1) * 24])
        for i in range(2)
    ]  # fmt: skip
    flags = ("--rs", "token_k1,seq_mean_k3", "--is", "token,sequence")
    base = _sweep_json(capsys, str(path), *flags)
    other = _sweep_json(capsys, str(path), *flags, "--workers", "2", "--chunk-tokens", "100")
    for i, shard in enumerate(shards):
        _sweep_json(capsys, str(shard), *flags, "--save-state", str(tmp_path / f"s{i}.json"))
    code, out, err = run(capsys, "merge", str(tmp_path / "s0.json"), str(tmp_path / "s1.json"), "--format", "json")
    assert code == 0, err
    merged = json.loads(out)
    for result in (other, merged):
        for mine, theirs in zip(base["sweep"], result["sweep"], strict=True):
            assert (mine["option"], mine["threshold"]) == (theirs["option"], theirs["threshold"])
            for key, value in mine["metrics"].items():
                assert _close(value, theirs["metrics"][key], rel=1e-10), (mine["option"], key)
            assert [s["step"] for s in mine["steps"]] == [s["step"] for s in theirs["steps"]]
    assert other["recommendations"] == base["recommendations"] == merged["recommendations"]
    assert len(base["recommendations"]) == 4


def test_a_sweep_state_does_not_merge_with_an_analyze_state(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    healthy = str(ROOT / "sample_data" / "healthy.parquet")
    run(capsys, "sweep", healthy, "--rs", "token_k1", "--no-recommend", "-q", "--save-state", str(tmp_path / "a.json"))
    outliers = healthy.replace("healthy", "outliers")
    run(capsys, "analyze", outliers, "-q", "--save-state", str(tmp_path / "b.json"), "--format", "json")
    code, _, err = run(capsys, "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 2 and "is an analyze state" in err and "where a sweep state is expected" in err


# ---------------------------------------------------------------------------------------- recommendations


def _known_dump(tmp_path: Path, sigma: float, rows: int = 600, seed: int = 0) -> tuple[Path, np.ndarray]:
    """Log-ratios d ~ N(0, sigma) iid per token, response lengths uniform in [50, 350], no padding."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 351, rows)
    old = [(-np.abs(rng.normal(0, 1.0, n)) - 0.5).astype(np.float32) for n in lengths]
    rollout = [(o - rng.normal(0, sigma, n)).astype(np.float32) for o, n in zip(old, lengths, strict=True)]
    path = tmp_path / "known.parquet"
    table = pa.table(
        {
            "old_log_prob": pa.array([o.tolist() for o in old], type=pa.list_(pa.float32())),
            "rollout_log_prob": pa.array([r.tolist() for r in rollout], type=pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path)
    d = np.concatenate([o - r for o, r in zip(old, rollout, strict=True)])  # float32, as verl computes it
    return path, d


@pytest.mark.parametrize("target", [0.01, 0.05])
def test_recommendations_meet_their_target(capsys: pytest.CaptureFixture, tmp_path: Path, target: float) -> None:
    path, _ = _known_dump(tmp_path, sigma=0.05)
    rows = _dump_rows(path)
    result = _sweep_json(capsys, str(path), "--target-reject", str(target))
    recs = {r["option"]: r for r in result["recommendations"]}
    assert set(recs) == set(OPTIONS)
    n_rows = 600
    for option, rec in recs.items():
        code, out, err = run(capsys, "analyze", str(path), *_flags(option, rec["threshold"]), "--format", "json")
        assert code == 0, err
        metrics = json.loads(out)["metrics"]
        if option.startswith("is_"):
            share = metrics[P + "rollout_is_ratio_fraction_high"]
            token_level = option == "is_token"
        else:
            token_level = option.startswith("token_")
            share = metrics[P + f"rollout_rs_{option}_{'masked_fraction' if token_level else 'seq_masked_fraction'}"]
            assert rec["token_reject"] == metrics[P + f"rollout_rs_{option}_masked_fraction"]
            assert rec["seq_reject"] == metrics[P + f"rollout_rs_{option}_seq_masked_fraction"]
        assert share <= target, (option, rec, share)
        if token_level:  # not much less: within the 0.39% resolution of the token histogram
            assert share >= 0.9 * target, (option, rec, share)
            continue
        # a response share is an exact order statistic: exactly floor(target * rows) responses lie above it
        allowed = math.floor(target * n_rows + 1e-9)
        assert share * n_rows == allowed, (option, rec, share)
        statistic = _brute_row_statistic(rows, option)
        ranked = np.sort(statistic)[::-1]  # neighbours around the cut far apart: no ties or rounding to hide behind
        assert ranked[allowed - 1] > ranked[allowed] * (1 + 1e-4) and ranked[allowed] > ranked[allowed + 1] * (1 + 1e-4)
        # the bound is the (allowed + 1)-th largest value itself (rounded to float32), not a neighbour
        assert _threshold_on_statistic(option, rec["threshold"]) == pytest.approx(ranked[allowed], rel=1e-6), option


def _dump_rows(path: Path) -> list[np.ndarray]:
    """Each response's float32 log-ratios old - rollout, as verl computes them."""
    table = pq.read_table(path)
    old, rollout = table.column("old_log_prob").to_pylist(), table.column("rollout_log_prob").to_pylist()
    return [np.float32(o) - np.float32(r) for o, r in zip(old, rollout, strict=True)]


def _brute_row_statistic(rows: list[np.ndarray], option: str) -> np.ndarray:
    """verl's per-response statistic of a sequence option, in float64 from the float32 log-ratios (k1 and the
    sequence IS log-ratio by their absolute value and as they are)."""
    if option == "is_sequence":
        return np.array([float(np.sum(d, dtype=np.float64)) for d in rows])
    _, reduce, estimator = option.split("_")
    term = {
        "k1": lambda d: d,
        "k2": lambda d: d * d / 2.0,
        "k3": lambda d: np.expm1(d) - d,
    }[estimator]
    how = {"sum": np.sum, "mean": np.mean, "max": np.max}[reduce]
    values = np.array([float(how(term(d.astype(np.float64)))) for d in rows])
    return np.abs(values) if estimator == "k1" else values


def _threshold_on_statistic(option: str, spec: str) -> float:
    """The bound a recommended spec puts on the brute-force statistic (a k1 band [1/U, U]: |statistic| <= log U;
    sequence IS: log-ratio sum <= log U, log taken in float32 as verl takes it)."""
    if option == "is_sequence":
        return float(np.log(np.float32(float(spec))))
    if option.endswith("k1"):
        return float(np.float32(math.log(float(spec.split("_")[1]))))
    return float(spec)


def _flags(option: str, spec: str) -> tuple[str, ...]:
    if option.startswith("is_"):
        return ("--is", option.removeprefix("is_"), "--is-threshold", spec)
    return ("--rs", option, "--rs-threshold", spec)


def test_token_recommendations_are_the_order_statistic_within_half_a_percent(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    sigma, target = 0.05, 0.01
    path, d = _known_dump(tmp_path, sigma=sigma, seed=4)
    result = _sweep_json(capsys, str(path), "--rs", "token_k1,token_k2", "--is", "token", "--target-reject", "0.01")
    recs = {r["option"]: r for r in result["recommendations"]}
    allowed = math.floor(target * d.size)
    exact_k1 = np.sort(np.abs(d))[::-1][allowed]  # |log-ratio| with `allowed` values above it
    upper = float(recs["token_k1"]["threshold"].split("_")[1])
    assert abs(math.log(upper) - exact_k1) <= 0.005 * exact_k1
    assert abs(math.log(upper) - sigma * 2.5758) <= 0.05 * sigma * 2.5758  # the distribution's 99.5% |z|
    exact_k2 = np.sort(np.float32(0.5) * d * d)[::-1][allowed]
    assert abs(float(recs["token_k2"]["threshold"]) - exact_k2) <= 0.005 * exact_k2
    exact_ratio = np.sort(np.exp(d))[::-1][allowed]
    assert abs(float(recs["is_token"]["threshold"]) - exact_ratio) <= 0.005 * exact_ratio


def test_table_shows_curves_recommendations_yaml_and_presets(capsys: pytest.CaptureFixture) -> None:
    healthy = str(ROOT / "sample_data" / "healthy.parquet")
    code, out, err = run(capsys, "sweep", healthy, "--min-ess", "0.9")
    assert code == 0 and err == ""
    for text in (
        "token_k1: share rejected by threshold",
        "is_sequence: share beyond the bounds by threshold",
        "Recommended RS thresholds: closest to 0.01 rejected without exceeding it",
        "Recommended IS thresholds (TIS): closest to 0.01 of the weights truncated, not above it",
        "algorithm:\n  rollout_correction:\n    rollout_rs: seq_mean_k1\n    rollout_rs_threshold:",
        "verl presets on this dump",
        "decoupled_geo_rs_seq_tis",
    ):
        assert text in out, text
    assert "▁" in out and "█" in out


def test_presets_are_ranked_by_the_verdict_policy(capsys: pytest.CaptureFixture) -> None:
    """Correcting presets without a finding first (token IS alone first), no correction next, presets raising a
    finding (ESS below --min-ess or verl's 0.3, IS saturated, RS rejecting most tokens) last."""
    healthy = str(ROOT / "sample_data" / "healthy.parquet")
    result = _sweep_json(capsys, healthy, "--no-recommend", "--min-ess", "0.9")
    rows = {(r["option"], r["threshold"]): r["metrics"] for r in result["sweep"]}
    presets = result["presets"]
    assert {p["name"] for p in presets} == set(PRESETS)
    geo = next(p for p in presets if p["name"] == "decoupled_geo_rs_seq_tis")
    assert geo["token_reject"] == rows["seq_mean_k1", "0.999_1.001"][P + "rollout_rs_seq_mean_k1_masked_fraction"]
    assert geo["ess"] == rows["is_sequence", "2.0"][P + "rollout_is_eff_sample_size"]
    assert geo["is_truncated_share"] == rows["is_sequence", "2.0"][P + "rollout_is_ratio_fraction_high"]
    assert geo["ess"] < 0.9 and not geo["meets_min_ess"] and geo["tier"] == 2 and "min-ess" in geo["note"]
    tiers = [p["tier"] for p in presets]
    assert tiers == sorted(tiers)
    assert presets[0]["name"] == "decoupled_token_is"
    no_correction = [p["name"] for p in presets if p["tier"] == 1]
    assert set(no_correction) == {"disabled", "bypass_ppo_clip"}
    assert all(p["meets_min_ess"] for p in presets if p["tier"] < 2)


def test_saturated_sequence_is_never_ranks_first(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """issue 24: decoupled_seq_is ranked first on a dump where every sequence weight is truncated."""
    from dumps24 import long_biased

    path = long_biased(tmp_path / "long.parquet")
    presets = _sweep_json(capsys, str(path), "--no-recommend")["presets"]
    seq = next(p for p in presets if p["name"] == "decoupled_seq_is")
    assert seq["is_truncated_share"] >= 0.9 and seq["tier"] == 2 and "is_saturated" in seq["note"]
    assert presets[0]["name"] not in ("decoupled_seq_is", "disabled", "bypass_ppo_clip")
    assert presets[0]["tier"] == 0


def test_default_grids_cover_verls_typical_ranges_and_preset_thresholds() -> None:
    grid = build_grid()
    token = [t.is_spec.upper for t in grid.thresholds("is_token") if t.is_spec and t.is_spec.lower is None]
    assert min(token) == 1.5 and max(token) == 5.0
    seq = [t.is_spec.upper for t in grid.thresholds("is_sequence") if t.is_spec and t.is_spec.lower is None]
    assert min(seq) == 2.0 and max(seq) == 10.0
    k1 = [t.spec for t in grid.thresholds("seq_mean_k1")]
    assert k1[0] == "0.5_2.0" and k1[-1] == "0.999_1.001"
    k3 = [t.rs_option.upper for t in grid.thresholds("seq_mean_k3") if t.rs_option]
    assert min(k3) == 1e-4 and max(k3) == 10.0 and 0.01 in k3


def test_torch_backend_rows_equal_analyze_on_torch() -> None:
    pytest.importorskip("torch")
    old, rollout, mask = _batch(21)
    chunk = padded_chunk(old, rollout, mask, np.repeat([0, 1], 24))
    report = sweep_chunks([chunk], build_grid(["token", "sequence"], ["token_k1", "seq_max_k3"]), device="torch-cpu")
    for row in report.rows:
        config = resolve(row.option, row.threshold).config(row.option)
        expected = rcdiag.analyze_chunks([chunk], config, device="torch-cpu").metrics
        for key, value in row.metrics.items():
            assert _close(value, expected[key]), (row.option, row.threshold, key)


def test_output_file_and_the_wrote_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    healthy = str(ROOT / "sample_data" / "healthy.parquet")
    target = tmp_path / "sweep.json"
    code, out, err = run(capsys, "sweep", healthy, "--rs", "seq_mean_k1", "--format", "json", "-o", str(target))
    assert code == 0 and out == ""
    assert err == f"rcdiag: wrote {target} (0 error(s), 0 warning(s) in findings)\n"
    written = json.loads(target.read_text())
    assert [row["threshold"] for row in written["sweep"]] == list(DEFAULT_GRIDS["seq_mean_k1"])
    assert written["recommendations"][0]["option"] == "seq_mean_k1"


def test_the_worked_example_in_docs_is_what_the_sweep_gives(capsys: pytest.CaptureFixture) -> None:
    root = ROOT
    page = (root / "docs" / "sweep.md").read_text()
    healthy = str(root / "sample_data" / "healthy.parquet")
    result = _sweep_json(capsys, healthy, "--rs", "seq_mean_k1,token_k3", "--is", "sequence", "--min-ess", "0.8")
    for rec in result["recommendations"]:
        assert f"│ {rec['option']}" in page and rec["threshold"] in page, rec
    geo = {r["threshold"]: r for r in result["sweep"] if r["option"] == "seq_mean_k1"}["0.999_1.001"]
    assert f"{geo['metrics'][P + 'rollout_rs_seq_mean_k1_masked_fraction']:.6g}" in page
    spec = next(r["threshold"] for r in result["recommendations"] if r["option"] == "seq_mean_k1")
    code, out, _ = run(capsys, "analyze", healthy, "--rs", "seq_mean_k1", "--rs-threshold", spec, "--format", "json")
    assert code == 0 and json.loads(out)["metrics"][P + "rollout_rs_seq_mean_k1_seq_masked_fraction"] <= 0.01


def test_the_worked_example_in_docs_holds_brute_force_values() -> None:
    """The page's numbers (a snapshot of rcdiag's output, above) recounted from the file by brute force."""
    root = ROOT
    page = (root / "docs" / "sweep.md").read_text()
    data = pq.read_table(root / "sample_data" / "healthy.parquet").to_pydict()
    rows = [
        (np.float32(o) - np.float32(r))[np.asarray(m, bool)]
        for o, r, m in zip(data["old_log_prob"], data["rollout_log_prob"], data["response_mask"], strict=True)
    ]
    tokens = sum(d.size for d in rows)
    valid = [d for d in rows if d.size]

    def shown(threshold: str) -> tuple[float, float]:
        cells = re.search(rf"│ {re.escape(threshold)} +│ +([\d.e-]+) │ +([\d.e-]+) │", page)
        assert cells is not None, threshold
        return float(cells[1]), float(cells[2])

    # seq_mean_k1 at Geo-RS's 0.999_1.001: a response is rejected when its mean -log-ratio leaves the band
    lo, hi = np.float32(math.log(0.999)), np.float32(math.log(1.001))
    out = [d for d in valid if not lo <= np.mean(-d.astype(np.float64)) <= hi]
    assert shown("0.999_1.001") == (
        float(f"{sum(d.size for d in out) / tokens:.6g}"),
        float(f"{len(out) / len(valid):.6g}"),
    )
    # token_k3 at 0.001: tokens whose e^d - 1 - d (float32, as verl) exceeds it; responses holding one
    k3 = [np.expm1(d) - d for d in valid]
    above = np.float32(0.001)
    token_share, row_share = shown("0.001")
    assert token_share == pytest.approx(sum(int((k > above).sum()) for k in k3) / tokens, rel=1e-4)
    assert row_share == pytest.approx(sum(bool((k > above).any()) for k in k3) / len(valid), rel=1e-4)
    # sequence TIS at the recommended 2.1387258: floor(1% of all 384 rows) = 3 rows above log U
    log_u = float(np.log(np.float32(2.1387258)))
    assert "│ is_sequence │ 2.1387258 " in page and "0.0078125" in page and 3 / 384 == 0.0078125
    assert sum(float(np.sum(d, dtype=np.float64)) > log_u for d in rows) == math.floor(0.01 * len(rows)) == 3


def test_a_step_without_valid_tokens_gives_one_empty_batch_finding() -> None:
    old, rollout, mask = _batch(5)
    mask[:16] = 0  # step 0: every response empty or fully masked
    report = sweep_chunks([padded_chunk(old, rollout, mask, np.repeat([0, 1, 2], 16))])
    assert [(f.code, f.steps) for f in report.findings] == [("verl_crash_empty_batch", (0,))]
    for row in report.rows:
        assert all(v is None for v in row.steps[0][1].values()), row.option
        assert all(v is not None for v in row.steps[1][1].values()), row.option
    assert len(report.recommendations) == len(OPTIONS)


def test_values_exactly_on_a_threshold_are_kept_as_verl_keeps_them() -> None:
    """Planted log-ratios exactly on every kind of bound (k1 both sides, k2/k3 upper, TIS U, IcePop L and U):
    inclusive keeps and strict fractions, counted by hand."""
    d = np.array([-0.125, 0.25, -0.5, 0.5, 0.0625, -0.1875, 0.75, 0.5, -0.125, -0.25], dtype=np.float32)
    old = np.full((1, d.size), -1.0, dtype=np.float32)
    rollout = old - d[None, :]
    assert (old - rollout == d).all()  # the float32 log-ratios are exactly the planted ones
    chunk = padded_chunk(old, rollout, np.ones_like(old, dtype=np.int64))
    k3 = np.float32(math.expm1(0.5) - 0.5)
    specs = {
        "token_k1": f"{math.exp(-0.25)!r}_{math.exp(0.125)!r}",  # keeps -0.25 <= -d <= 0.125
        "token_k2": "0.125",  # keeps d^2/2 <= 0.125, i.e. |d| <= 0.5
        "token_k3": repr(float(k3)),  # keeps e^d - 1 - d <= its value at d = 0.5
        "is_token": f"{float(np.exp(np.float32(-0.25)))!r}_{float(np.exp(np.float32(0.5)))!r}",
    }
    expected_rejected = {
        "token_k1": int(np.count_nonzero((-d > 0.125) | (-d < -0.25))),
        "token_k2": int(np.count_nonzero(np.abs(d) > 0.5)),
        "token_k3": int(np.count_nonzero(d > 0.5)) + int(np.count_nonzero(d < -0.5)),
        "is_token": int(np.count_nonzero((d > 0.5) | (d < -0.25))),  # IcePop: outside [L, U] is zeroed
    }
    for option, spec in specs.items():
        is_level = [option.removeprefix("is_")] if option.startswith("is_") else None
        grid = build_grid(is_level, None if is_level else [option], [spec])
        row = sweep_chunks([chunk], grid, target_reject=None).rows[0]
        expected = rcdiag.analyze_chunks([chunk], resolve(option, spec).config(option)).metrics
        for key, value in row.metrics.items():
            assert _close(value, expected[key]), (option, key)
        if option.startswith("is_"):
            rejected = row.metrics[P + "rollout_is_oob_ratio"] * d.size
        else:
            rejected = row.metrics[P + f"rollout_rs_{option}_masked_fraction"] * d.size
        assert round(rejected) == expected_rejected[option], option


@pytest.fixture(scope="module")
def grouped_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    old, rollout, mask = _batch(17)
    return _write_padded(tmp_path_factory.mktemp("grouped") / "d.parquet", old, rollout, mask, np.repeat([0, 1], 24))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(2, 4), chunk=st.integers(30, 3000))
def test_workers_and_chunk_size_change_no_row_and_no_recommendation(
    grouped_dump: Path, workers: int, chunk: int
) -> None:
    grid = build_grid(["token"], ["token_k3", "seq_sum_k1"])
    one = rcdiag.sweep.sweep(grouped_dump, grid)
    many = rcdiag.sweep.sweep(grouped_dump, grid, workers=workers, chunk_tokens=chunk)
    _same(_points(one), _points(many))
    assert one.recommendations == many.recommendations


def test_an_inverted_k1_band_rejects_each_token_once_as_analyze_and_verl_do(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """verl <= 0.8.0 accepts a k1 band with lo > hi: it keeps nothing, and its clamp (torch's, min(max(x, lo), hi))
    gives hi everywhere. A token may lie both above hi and below lo; it is still rejected once."""
    old, rollout, mask = _batch(23)
    path = _write_padded(tmp_path / "d.parquet", old, rollout, mask, np.zeros(old.shape[0], dtype=np.int64))
    spec = "1.02_0.98"  # lo = log(1.02) > hi = log(0.98)
    row = _sweep_json(capsys, str(path), "--rs", "token_k1", "--thresholds", spec, "--verl-version", "0.8.0")
    code, out, err = run(
        capsys,
        "analyze",
        str(path),
        "--rs",
        "token_k1",
        "--rs-threshold",
        spec,
        "--verl-version",
        "0.8.0",
        "--format",
        "json",
        "-q",
    )
    assert code == 0, err
    analyzed = json.loads(out)["metrics"]
    got = row["sweep"][0]["metrics"]
    for key, value in got.items():
        assert _close(value, analyzed[key]), (key, value, analyzed[key])
    # brute force: every valid token is rejected, once; the clamp leaves hi everywhere
    k1 = (rollout - old).astype(np.float64)[mask.astype(bool)]
    lo, hi = np.float32(math.log(1.02)), np.float32(math.log(0.98))
    assert np.count_nonzero((k1 > hi) & (k1 < lo)) > 0  # tokens on both sides of the inverted band exist
    assert got[P + "rollout_rs_token_k1_masked_fraction"] == 1.0
    assert got[P + "rollout_rs_masked_fraction"] == 1.0
    assert got[P + "rollout_rs_token_k1_std"] == 0.0
    assert _close(got[P + "rollout_rs_token_k1_fraction_high"], np.count_nonzero(k1 > hi) / k1.size)
    assert _close(got[P + "rollout_rs_token_k1_fraction_low"], np.count_nonzero(k1 < lo) / k1.size)
    torch = require_verl()
    expected = verl_metrics(
        *(torch.from_numpy(a) for a in (old, rollout, mask)),
        version="0.8.0",
        rollout_rs="token_k1",
        rollout_rs_threshold=spec,
    )
    for key in (P + "rollout_rs_token_k1_masked_fraction", P + "rollout_rs_token_k1_std"):
        assert _close(got[key], float(expected[key]), rel=1e-6, abs_tol=1e-9), key


@pytest.mark.parametrize(
    ("target", "changed"),
    [
        ("rcdiag.kernels.sweep_encoding.SHIFT", 14),  # the histogram's buckets
        (
            "rcdiag.sweep.option_sweeps.SequenceRSSweep.STATES",
            {"v_hi": "sums", "masked_rows": "sums"},
        ),  # declared states
    ],
)
def test_a_sweep_state_of_another_layout_is_refused(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, changed: object
) -> None:
    """The sweep's state is versioned by the one layout hash, which covers the constants its histogram and cells
    depend on: a changed one makes an old sweep state refuse to merge (exit 2, one line), never merge silently."""
    old, rollout, mask = _batch(5)
    path = _write_padded(tmp_path / "d.parquet", old, rollout, mask, np.zeros(old.shape[0], dtype=np.int64))
    state = tmp_path / "s.json"
    code, _, err = run(capsys, "sweep", str(path), "--rs", "seq_sum_k1", "--save-state", str(state), "-q")
    assert code == 0, err
    assert run(capsys, "merge", str(state), "-q")[0] == 0
    saved = json.loads(state.read_text())["layout"]
    monkeypatch.setattr(target, changed)
    code, _, err = run(capsys, "merge", str(state), "-q")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "s.json: was written by rcdiag" in err and "whose states have another layout" in err
    assert f"layout {saved};" in err and "re-run 'rcdiag sweep ... --save-state'" in err
