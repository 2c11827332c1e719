"""compare's significance tests (issue 35 item 3): is B's mismatch different from A's, by how much, how sure.

Values against brute force (the per-response sums and token means from the Parquet files with numpy; the cluster
standard error's normal interval for the bootstrap's width; Student-t tables for the Welch p-values); a planted
2.5x noise difference on a real-model dump found through the CLI; the false-alarm rate on pairs of real-model
dumps of one setting at different seeds pinned at the stated level.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, run
from shape_dumps import dump

import rcdiag
from rcdiag.compare.paired import LEVEL, holm, responses_test, steps_test, student_t_quantile, student_t_two_sided
from rcdiag.sections.units import METRIC_COLUMNS, UnitsSection

SEEDS = range(6)
"""bf16 rollouts of one model at six seeds: one setting, different samples."""


def _table(path: Path) -> pa.Table:
    return pq.read_table(sorted(Path(path).glob("*.parquet")) if Path(path).is_dir() else path)


def _brute(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each metric's (tokens, sums) per response, straight from the files (every token valid: no mask)."""
    table = _table(path)
    old = table.column("old_log_prob").combine_chunks()
    rollout = table.column("rollout_log_prob").combine_chunks()
    lengths = np.diff(old.offsets.to_numpy())
    o = old.flatten().to_numpy().astype(np.float64)
    r = rollout.flatten().to_numpy().astype(np.float64)
    d = (old.flatten().to_numpy() - rollout.flatten().to_numpy()).astype(np.float64)
    row = np.repeat(np.arange(lengths.size), lengths)
    terms = {
        "rollout_corr/kl": r - o,
        "rollout_corr/k3_kl": np.exp(d) - 1 - d,
        "rollout_corr/chi2_token": np.exp(2 * np.clip(d, -20, 20)) - 1,
        "rcdiag/abs_log_ratio_mean": np.abs(d),
    }
    tokens = lengths.astype(np.float64)
    return {key: (tokens, np.bincount(row, weights=t, minlength=lengths.size)) for key, t in terms.items()}


def _units(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    report = rcdiag.analyze(path, sections=[UnitsSection()])
    record = report.sections["units"]
    return {key: record.column(key) for key in METRIC_COLUMNS}


def _one_step(source: Path, target: Path, scale: float = 1.0) -> Path:
    """``source``'s rows as one step, the log-ratio of every token multiplied by ``scale`` (rollout side)."""
    table = _table(source)
    old = table.column("old_log_prob").combine_chunks()
    rollout = table.column("rollout_log_prob").combine_chunks()
    o, r = old.flatten().to_numpy(), rollout.flatten().to_numpy()
    moved = (o - (o - r) * np.float32(scale)).astype(np.float32)
    moved = np.minimum(moved, 0).astype(np.float32)  # still log-probabilities
    rows = pa.ListArray.from_arrays(pa.array(old.offsets.to_numpy()), pa.array(moved, pa.float32()))
    pq.write_table(pa.table({"old_log_prob": old, "rollout_log_prob": rows}), target)
    return target


# ----------------------------------------------------------------------------------- values, brute force


def test_the_units_are_the_report_metrics_per_response(tmp_path: Path) -> None:
    path = _one_step(dump("bf16", 0), tmp_path / "a.parquet")
    units, brute = _units(path), _brute(path)
    report = rcdiag.analyze(path)
    for key in METRIC_COLUMNS:
        tokens, sums = units[key]
        np.testing.assert_array_equal(tokens, brute[key][0])
        np.testing.assert_allclose(sums, brute[key][1], rtol=1e-9, atol=1e-12)
        value = report.metrics.get(key, report.extras.get(key))
        assert value is not None
        assert sums.sum() / tokens.sum() == pytest.approx(value, rel=1e-9)


def test_the_bootstrap_interval_matches_the_cluster_standard_error(tmp_path: Path) -> None:
    a, b = (_brute(_one_step(dump("bf16", s), tmp_path / f"{s}.parquet")) for s in (0, 1))
    for key in METRIC_COLUMNS:
        test = responses_test(key, a[key], b[key])
        (ta, sa), (tb, sb) = a[key], b[key]
        ma, mb = sa.sum() / ta.sum(), sb.sum() / tb.sum()
        assert test.difference == pytest.approx(mb - ma, rel=1e-12)
        var = sum(
            np.sum((s - m * t) ** 2) / t.sum() ** 2 * t.size / (t.size - 1) for t, s, m in ((ta, sa, ma), (tb, sb, mb))
        )
        width = 2 * 1.959964 * math.sqrt(var)
        assert test.ci_low is not None and test.ci_high is not None
        assert 0.75 < (test.ci_high - test.ci_low) / width < 1.33, key
        assert test.ci_low <= test.difference <= test.ci_high
        assert (test.n_a, test.n_b, test.units, test.method) == (ta.size, tb.size, "responses", "bootstrap")


def test_student_t_against_published_tables() -> None:
    for t, df in ((12.706, 1), (4.303, 2), (2.228, 10), (2.042, 30)):  # two-sided 5% critical values
        assert student_t_two_sided(t, df) == pytest.approx(0.05, abs=2e-4)
        assert student_t_quantile(0.975, df) == pytest.approx(t, rel=2e-4)
    assert student_t_two_sided(3.169, 10) == pytest.approx(0.01, abs=1e-4)


def _t_tail(t: float, df: float) -> float:
    """P(|T| >= t), integrating Student's density numerically (not the incomplete beta the library uses)."""
    import mpmath

    c = mpmath.gamma((df + 1) / 2) / (mpmath.sqrt(df * mpmath.pi) * mpmath.gamma(df / 2))
    return float(2 * mpmath.quad(lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2), [t, mpmath.inf]))


def test_welch_on_steps_against_a_hand_computation() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [3.0, 5.0, 4.0, 6.0, 7.0]
    test = steps_test("rollout_corr/kl", a, b)
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 5
    t = (5.0 - 2.5) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 4)
    assert test.difference == pytest.approx(2.5)
    assert df == pytest.approx(0.840278 / 0.120370, rel=1e-4)  # by hand: (5/12 + 1/2)^2 / ((5/12)^2/3 + (1/2)^2/4)
    assert t == pytest.approx(2.5 / math.sqrt(11 / 12), rel=1e-9)
    assert test.p_value == pytest.approx(_t_tail(t, df), rel=1e-6)
    assert 0.02 < test.p_value < 0.05  # t tables at 7 df: 2.365 (5%) < t < 2.998 (2%)
    assert test.significant and test.units == "steps" and (test.n_a, test.n_b) == (4, 5)


def test_holm_adjusts_step_down() -> None:
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])


# ----------------------------------------------------------------------------------- power and false alarms


def test_compare_finds_a_planted_2_5x_noise_difference(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = _one_step(dump("bf16", 1), tmp_path / "a.parquet")
    b = _one_step(dump("bf16", 2), tmp_path / "b.parquet", scale=math.sqrt(2.5))  # k3 ~ d^2/2: 2.5x
    code, out, _ = run(capsys, "compare", a, b, "--format", "json")
    assert code == 0
    tests = json.loads(out)["tests"]
    k3 = tests["rollout_corr/k3_kl"]
    assert k3["units"] == "responses" and k3["significant"] and k3["ci_low"] > 0
    assert k3["b"] / k3["a"] == pytest.approx(2.5, rel=0.25)
    code, out, _ = run(capsys, "compare", a, b)
    assert "B's k3_kl is higher than A's by" in out


def test_the_false_alarm_rate_between_seeds_is_at_the_level(tmp_path: Path) -> None:
    """Pairs of bf16 dumps at different seeds (one setting): responses as units, and steps as units (4 steps each).
    Measured: 0 of 60 response tests and 2 of 60 step tests significant at 5% (the stated level)."""
    units = {seed: _units(dump("bf16", seed)) for seed in SEEDS}
    steps = {seed: rcdiag.analyze(dump("bf16", seed)).steps for seed in SEEDS}
    by_responses = by_steps = total = 0
    for i, j in itertools.combinations(SEEDS, 2):
        for key in METRIC_COLUMNS:
            total += 1
            by_responses += responses_test(key, units[i][key], units[j][key]).significant
            values = [[s.metrics.get(key, s.extras.get(key)) for s in steps[k]] for k in (i, j)]
            by_steps += steps_test(key, *values).significant
    assert total == 60
    assert by_responses / total <= LEVEL + 0.05
    assert by_steps / total <= LEVEL + 0.05


def test_the_bootstrap_is_calibrated_on_random_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Disjoint random sets of 400 responses from six bf16 seeds, 100 times: measured 5 and 9 of 100 significant for
    kl and k3_kl (1,000 resamples; the 2,000 of a run give the same within the binomial spread), 6, 4, 6 and 3.5%
    for kl, k3_kl, chi2_token and mean |log-ratio| over 200 splits: at the 5% level, neither conservative nor
    liberal beyond the binomial spread."""
    from rcdiag.compare import paired

    monkeypatch.setattr(paired, "RESAMPLES", 1000)
    units = {seed: _units(dump("bf16", seed)) for seed in SEEDS}
    rng = np.random.default_rng(1)
    for key in ("rollout_corr/kl", "rollout_corr/k3_kl"):
        tokens = np.concatenate([units[s][key][0] for s in SEEDS])
        sums = np.concatenate([units[s][key][1] for s in SEEDS])
        hits = 0
        for _ in range(100):
            order = rng.permutation(tokens.size)
            a, b = order[:400], order[400:800]
            hits += responses_test(key, (tokens[a], sums[a]), (tokens[b], sums[b])).significant
        assert 1 <= hits <= 10, (key, hits)


def test_several_dumps_against_one_baseline_holm_adjusted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A (bf16 seed 1) as the baseline; B one setting at another seed; C its log-ratio scaled by sqrt 2.5: only C
    differs, and every p-value is Holm's over the two comparisons."""
    a = _one_step(dump("bf16", 1), tmp_path / "a.parquet")
    b = _one_step(dump("bf16", 3), tmp_path / "b.parquet")
    c = _one_step(dump("bf16", 2), tmp_path / "c.parquet", scale=math.sqrt(2.5))
    code, out, _ = run(capsys, "compare", b, a, c, "--baseline", a, "--format", "json")
    assert code == 0
    result = json.loads(out)
    assert (result["kind"], result["baseline"], result["correction"]) == ("comparisons", str(a), "holm")
    assert [entry["path"] for entry in result["comparisons"]] == [str(b), str(c)]
    for key in METRIC_COLUMNS:
        raw = [responses_test(key, _brute(a)[key], _brute(other)[key]).p_value for other in (b, c)]
        tests = [entry["tests"][key] for entry in result["comparisons"]]
        assert [t["p_value"] for t in tests] == pytest.approx(raw)
        assert [t["adjusted_p_value"] for t in tests] == pytest.approx(holm(raw))
        assert [t["significant"] for t in tests] == [p < LEVEL for p in holm(raw)]
    ks = [entry["tests"]["rollout_corr/k3_kl"]["significant"] for entry in result["comparisons"]]
    assert ks == [False, True]
    code, out, _ = run(capsys, "compare", a, b, c)
    assert code == 0 and "C's k3_kl is higher than A's by" in out and "Holm-adjusted" in out
    code, _, err = run(capsys, "compare", a, b, "--baseline", tmp_path / "other.parquet")
    assert code == 2 and "--baseline" in err
    html = tmp_path / "many.html"
    code, _, _ = run(capsys, "compare", a, b, c, "--html", html)
    assert code == 0 and "Each dump against A" in html.read_text()


def test_the_units_merge_across_workers_and_round_trip_a_state(tmp_path: Path) -> None:
    from rcdiag.sections.units import ResponseUnits

    path = dump("bf16", 0)
    one = rcdiag.analyze(path, sections=[UnitsSection()], workers=1).sections["units"].table
    parts = rcdiag.analyze(path, sections=[UnitsSection()], workers=2).sections["units"].table
    np.testing.assert_array_equal(one, parts)
    state = ResponseUnits()
    state.blocks, state.rows_read = [one], one.shape[0]
    back = ResponseUnits.from_state_dict(json.loads(json.dumps(state.state_dict())))
    np.testing.assert_array_equal(back.table(), one)
    assert back.rows_read == one.shape[0]


def test_the_worked_example_in_compare_md_is_what_compare_gives(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """docs/compare.md's bf16 / fp8 KV cache / 4-bit study: every number of its table, as printed (3 significant
    digits), from the comparison rerun on the same real-model dumps."""
    from shape_dumps import defect_dump

    text = (ROOT / "docs" / "compare.md").read_text()
    table = text.split("<!-- compare-study")[1].split("<!-- /compare-study -->")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[3:] if line]
    paths = [dump("bf16", 1), dump("bf16", 2), defect_dump("kv_fp8", 1), dump("int4", 1)]
    code, out, _ = run(capsys, "compare", *paths, "--format", "json")
    assert code == 0
    result = json.loads(out)
    assert len(rows) == 4 and len(result["comparisons"]) == 3
    key = "rollout_corr/k3_kl"
    first = result["comparisons"][0]["tests"][key]
    assert rows[0][1] == f"{first['a']:.3g}" and rows[0][5] == "healthy"
    for row, comparison in zip(rows[1:], result["comparisons"], strict=True):
        test = comparison["tests"][key]
        shown = [
            f"{test['b']:.3g}",
            f"{test['difference']:.3g}",
            f"[{test['ci_low']:.3g}, {test['ci_high']:.3g}]",
            f"{test['adjusted_p_value']:.3g}",
            comparison["b"]["verdict"]["status"],
        ]
        assert row[1:] == shown, row[0]
        assert test["units"] == "steps" and test["significant"] == (row[0] != "bf16, seed 2")
