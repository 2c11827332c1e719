"""``compare``: the metric diff, the temperature analysis (kl ~ Var(eps)/(2 T^2)), each verdict, and the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES, run
from generator_model import expected
from severities import checked

import rcdiag
from rcdiag.compare import COMPARE_FINDING_CODES, compare, compare_reports
from rcdiag.io import synthetic
from rcdiag.runtime.errors import ConfigError, InputError

P = "rollout_corr/"
ROWS = 128


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small synthetic dumps (128 responses): the generator's engine noise is 0.03 on the logit scale."""
    root = tmp_path_factory.mktemp("compare")
    specs = {
        "healthy": ("healthy", 10),
        "healthy_t06": ("healthy_t06", 0),
        "forgot": ("train_forgot_temperature", 0),
        "topk": ("topk_offset", 0),
        "noisy": (synthetic.with_overrides("healthy", noise=0.15), 0),
    }
    out = {}
    for name, (scenario, seed) in specs.items():
        out[name] = root / f"{name}.parquet"
        synthetic.write(synthetic.generate(scenario, rows=ROWS, seed=seed), out[name])
    bare = root / "forgot_no_metadata.parquet"
    pq.write_table(pq.read_table(out["forgot"]).replace_schema_metadata(None), bare)
    out["forgot_bare"] = bare
    return out


def codes(comparison: rcdiag.compare.Comparison) -> dict[str, str | None]:
    return {f.code: f.side for f in checked(comparison.findings)}


def test_metric_rows_are_b_minus_a_and_b_over_a(dumps: dict[str, Path]) -> None:
    c = compare(dumps["healthy_t06"], dumps["healthy"], rcdiag.CorrectionConfig(rollout_is="token"))
    a = rcdiag.analyze(dumps["healthy_t06"], rcdiag.CorrectionConfig(rollout_is="token"))
    b = rcdiag.analyze(dumps["healthy"], rcdiag.CorrectionConfig(rollout_is="token"))
    expected_keys = [*a.metrics, *a.extras]
    assert [m.key for m in c.metrics] == expected_keys and P + "rollout_is_mean" in expected_keys
    for row in c.metrics:
        va, vb = (a.metrics | a.extras)[row.key], (b.metrics | b.extras)[row.key]
        assert (row.a, row.b) == (va, vb)
        if va is None or vb is None:  # a statistic one dump cannot give (too few tokens of a kind): no difference
            assert (row.difference, row.ratio) == (None, None), row.key
            continue
        assert row.difference == pytest.approx(vb - va, rel=1e-12, abs=1e-15)
        assert row.ratio == (pytest.approx(vb / va, rel=1e-12) if va != 0 else None)


def test_temperature_analysis_numbers(dumps: dict[str, Path]) -> None:
    c = compare(dumps["healthy_t06"], dumps["healthy"])
    t = c.temperature
    kl_a = rcdiag.analyze(dumps["healthy_t06"]).metrics[P + "kl"]
    kl_b = rcdiag.analyze(dumps["healthy"]).metrics[P + "kl"]
    assert (t.a.temperature, t.a.source, t.b.temperature, t.b.source) == (0.6, "metadata", 1.0, "metadata")
    assert t.a.kl == kl_a and t.b.kl == kl_b
    assert t.a.kl_t2 == pytest.approx(kl_a * 0.36, rel=1e-12)
    assert t.a.noise == pytest.approx(0.6 * math.sqrt(2 * kl_a), rel=1e-12)
    assert t.b.noise == pytest.approx(math.sqrt(2 * kl_b), rel=1e-12)
    assert t.ideal_kl_ratio == pytest.approx((1.0 / 0.6) ** 2) == pytest.approx(2.7778, abs=1e-4)
    assert t.kl_ratio == pytest.approx(kl_a / kl_b, rel=1e-12)
    assert t.noise_ratio == pytest.approx(t.b.noise / t.a.noise, rel=1e-12)
    # The estimate recovers the generator's logit noise (0.03) at both temperatures, so they are comparable.
    assert 0.015 < t.a.noise < 0.045 and 0.015 < t.b.noise < 0.045
    se = t.a.kl_std_error
    assert t.a.noise_low == pytest.approx(0.6 * math.sqrt(2 * max(kl_a - 2 * se, 0)), rel=1e-12)
    assert t.a.noise_high == pytest.approx(0.6 * math.sqrt(2 * (kl_a + 2 * se)), rel=1e-12)
    # At low temperature the measured kl ratio stays below the ideal 2.78x (sharper distribution).
    assert 1.0 < t.kl_ratio < t.ideal_kl_ratio
    text = " ".join(t.explanation)
    assert "2.78x" in text and "sharper" in text and "T*sqrt(2 kl)" in text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_pair_at_06_and_10_is_explained_without_alarm(tmp_path: Path, seed: int) -> None:
    a, b = tmp_path / "t06.parquet", tmp_path / "t10.parquet"
    synthetic.write(synthetic.generate("healthy_t06", rows=ROWS, seed=seed), a)
    synthetic.write(synthetic.generate("healthy", rows=ROWS, seed=seed + 10), b)
    c = compare(a, b)
    assert not any("temperature" in f.code for f in c.findings)
    assert list(codes(c)) == ["noise_consistent"]
    finding = c.findings[0]
    assert finding.severity == "info" and finding.side is None
    assert 1 / 3 < c.temperature.noise_ratio < 3
    assert "comes from the temperatures (0.6 vs 1" in finding.message


@pytest.mark.parametrize(("a", "b", "side"), [("healthy", "forgot", "b"), ("forgot", "healthy", "a")])
def test_forgotten_temperature_is_flagged_on_its_side(dumps: dict[str, Path], a: str, b: str, side: str) -> None:
    c = compare(dumps[a], dumps[b])
    found = codes(c)
    assert found["temperature_kl_high"] == side
    assert found["temperature_noise_mismatch"] == side
    assert found["temperature_recorded_mismatch"] == side
    assert all(f.side == side for f in c.findings if "temperature" in f.code)
    assert "noise_consistent" not in found
    forgot = c.temperature.a if side == "a" else c.temperature.b
    # where the generator's parameters (rollout at T=0.6, trainer at T=1) put it: of order 0.1, as the seeds say
    tokens = int(pc.sum(pc.list_flatten(pq.read_table(dumps["forgot"]).column("response_mask"))).as_py())
    assert expected("train_forgot_temperature")["kl"].holds(forgot.kl, tokens)
    assert forgot.k3_kl == pytest.approx(forgot.kl, rel=0.2)  # kl and k3 agree: a re-tempered distribution
    factor = c.temperature.noise_ratio if side == "b" else 1 / c.temperature.noise_ratio
    assert factor > 8
    high = next(f for f in c.findings if f.code == "temperature_kl_high")
    assert high.value == forgot.kl and high.threshold == 0.1 and "T=0.6" in high.message


def test_temperature_verdict_from_numbers_alone(dumps: dict[str, Path]) -> None:
    """Without metadata, --temperature-b gives the temperature; no recorded mismatch to lean on."""
    c = compare(dumps["healthy_t06"], dumps["forgot_bare"], temperature_b=0.6)
    found = codes(c)
    assert found == {"temperature_kl_high": "b", "temperature_noise_mismatch": "b"}
    assert c.temperature.b.source == "option" and c.temperature.a.source == "metadata"
    # an option overrides the metadata
    c = compare(dumps["healthy_t06"], dumps["healthy"], temperature_a=1.0)
    assert c.temperature.a.temperature == 1.0 and c.temperature.a.source == "option"


def test_one_unknown_temperature_skips_the_analysis(dumps: dict[str, Path]) -> None:
    c = compare(dumps["forgot_bare"], dumps["healthy"])
    assert [(f.code, f.side) for f in c.findings] == [("temperature_unknown", "a")]
    assert c.temperature.noise_ratio is None and c.temperature.ideal_kl_ratio is None
    assert "unknown" in c.temperature.explanation[0]


def test_no_temperature_on_either_side_assumes_equal_ones(dumps: dict[str, Path]) -> None:
    """Neither side records one: equal temperatures are assumed, said so, and the noise verdicts run."""
    c = compare(dumps["forgot_bare"], dumps["forgot_bare"])
    assert [(f.code, f.side) for f in c.findings] == [("temperature_unknown", None), ("noise_consistent", None)]
    assert c.temperature.a.source == c.temperature.b.source == "assumed"
    assert c.temperature.ideal_kl_ratio == 1.0 and c.temperature.noise_ratio == pytest.approx(1.0)
    assert c.temperature.explanation[0].startswith("Neither dump records its sampling temperature")
    assert c.findings[0].message.startswith("neither dump records its sampling temperature")


def test_noisier_engine_at_t1_is_not_blamed_on_temperature(dumps: dict[str, Path]) -> None:
    c = compare(dumps["healthy"], dumps["noisy"])
    assert codes(c) == {"engine_noise_differs": "b"}
    assert 3 < c.temperature.noise_ratio < 8  # 0.15 vs 0.03 in the generator
    assert "At T=1 the temperature cannot be the cause" in c.findings[0].message


def test_systematic_shift_on_one_side(dumps: dict[str, Path]) -> None:
    c = compare(dumps["healthy"], dumps["topk"])
    assert codes(c) == {"systematic_shift": "b"}  # its noise estimate does not hold, so no noise verdict
    t = c.temperature.b
    assert t.kl > 3 * t.k3_kl
    assert "kl_k3_disagree" in {f.code for f in c.b.findings}


def _with_kl(report: rcdiag.Report, kl: float, se: float, temperature: str) -> rcdiag.Report:
    metrics = report.metrics | {P + "kl": kl, P + "k3_kl": kl}
    extras = report.extras | {"rcdiag/kl_std_error": se}
    facts = dataclasses.replace(report.input, metadata={"temperature": temperature})
    return dataclasses.replace(report, metrics=metrics, extras=extras, input=facts, findings=())


def test_noise_verdict_boundaries(dumps: dict[str, Path]) -> None:
    """Exact numbers through compare_reports: 3x on T*sqrt(2 kl) is the line; bands matter near 0."""
    base = rcdiag.analyze(dumps["healthy"])
    quiet = _with_kl(base, 1e-4, 1e-5, "1.0")
    # noise sqrt(2e-4)=0.01414; 2.9x and 3.1x of it at T=1
    just_under = _with_kl(base, 1e-4 * 2.9**2, 1e-5, "1.0")
    just_over = _with_kl(base, 1e-4 * 3.1**2, 1e-5, "1.0")
    assert list(codes(compare_reports(quiet, just_under))) == ["noise_consistent"]
    assert codes(compare_reports(quiet, just_over)) == {"engine_noise_differs": "b"}
    # the same ratio with the noisier side at T=0.6 points at its temperature handling
    at_06 = _with_kl(base, 1e-4 * 3.1**2 / 0.36, 1e-5, "0.6")
    c = compare_reports(quiet, at_06)
    assert c.temperature.noise_ratio == pytest.approx(3.1, rel=1e-9)
    assert codes(c) == {"temperature_noise_mismatch": "b"}
    # a quiet side within 2 standard errors of 0 whose band reaches the other side: no verdict
    rough = _with_kl(base, 1e-4, 2e-4, "1.0")
    c = compare_reports(rough, just_over)
    assert codes(c) == {"noise_inconclusive": "b"}
    # bitwise-equal engines on one side: the other side differs, but that is not temperature
    exact = _with_kl(base, 0.0, 0.0, "1.0")
    c = compare_reports(exact, at_06)
    assert codes(c) == {"engine_noise_differs": "b"} and "no measurable noise" in c.findings[0].message


def test_swapping_sides_mirrors_everything(dumps: dict[str, Path]) -> None:
    ab = compare(dumps["healthy"], dumps["forgot"])
    ba = compare(dumps["forgot"], dumps["healthy"])
    for x, y in zip(ab.metrics, ba.metrics, strict=True):
        assert x.key == y.key and x.a == y.b
        assert (x.difference is None and y.difference is None) or x.difference == pytest.approx(-y.difference)
    assert ab.temperature.noise_ratio == pytest.approx(1 / ba.temperature.noise_ratio, rel=1e-12)
    flip = {"a": "b", "b": "a", None: None}
    assert {(f.code, flip[f.side]) for f in ab.findings} == {(f.code, f.side) for f in ba.findings}


def test_step_pairing_and_trend(tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    synthetic.write(synthetic.generate("healthy", rows=96, steps=6, seed=1), a)
    synthetic.write(synthetic.generate("healthy_t06", rows=64, steps=4, seed=2), b)
    c = compare(a, b)
    assert [p.step for p in c.steps] == [0, 1, 2, 3]
    assert c.unpaired_steps == {"a": (4, 5), "b": ()}
    ra, rb = rcdiag.analyze(a), rcdiag.analyze(b)
    diffs = [rb.steps[i].metrics[P + "kl"] - ra.steps[i].metrics[P + "kl"] for i in range(4)]
    for pair, want in zip(c.steps, diffs, strict=True):
        assert pair.get(P + "kl").difference == pytest.approx(want, rel=1e-12)
    assert c.trend[P + "kl"] == pytest.approx(np.polyfit([0, 1, 2, 3], diffs, 1)[0], rel=1e-9)


def test_bad_inputs_raise(dumps: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="temperature_a must be a positive number"):
        compare(dumps["healthy"], dumps["healthy"], temperature_a=0.0)
    bad = tmp_path / "bad_meta.parquet"
    pq.write_table(pq.read_table(dumps["healthy"]).replace_schema_metadata({"temperature": "warm"}), bad)
    with pytest.raises(InputError, match=r"bad_meta.parquet: metadata 'temperature' is 'warm'.*--temperature-b"):
        compare(dumps["healthy"], bad)
    c = compare(dumps["healthy"], bad, temperature_b=1.0)  # the option makes the metadata irrelevant
    assert (c.temperature.b.temperature, c.temperature.b.source) == (1.0, "option")
    a = rcdiag.analyze(dumps["healthy"])
    b = rcdiag.analyze(dumps["healthy"], rcdiag.CorrectionConfig(rollout_is="token"))
    with pytest.raises(ConfigError, match="different engine configurations"):
        compare_reports(a, b)


def test_every_code_is_documented() -> None:
    doc = (SAMPLES.parent / "docs" / "compare.md").read_text()
    for code in COMPARE_FINDING_CODES:
        assert f"`{code}`" in doc, code


# ------------------------------------------------------------------------------------------------------- CLI


def test_cli_table(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(
        capsys, "compare", str(SAMPLES / "healthy.parquet"), str(SAMPLES / "train_forgot_temperature.parquet")
    )
    assert code == 0 and err == ""  # findings do not change the exit code
    for text in (
        "Metrics side by side",
        "b / a",
        "Temperature: kl ~ Var(eps)/(2 T^2)",
        "noise T*sqrt(2 kl)",
        "Per step (steps in both dumps)",
        "trend of b - a",
        "WARNING [temperature_kl_high] side b: kl = 0.156 at T=0.6",
        "[temperature_noise_mismatch]",
        "analyze on side b: mismatch_not_noise, kl_high, chi2_token_high",
    ):
        assert text in out, text


def test_cli_json_and_engine_flags(capsys: pytest.CaptureFixture, tmp_path: Path, dumps: dict[str, Path]) -> None:
    target = tmp_path / "c.json"
    code, out, err = run(
        capsys, "compare", str(dumps["healthy_t06"]), str(dumps["healthy"]), "--is", "token",
        "--temperature-b", "1.0", "--format", "json", "-o", str(target),
    )  # fmt: skip
    assert code == 0 and out == "" and f"wrote {target}" in err
    data = json.loads(target.read_text())
    assert data["kind"] == "comparison" and data["schema_version"] == 1
    assert data["a"]["metrics"][P + "rollout_is_mean"] > 0 and data["b"]["config"]["rollout_is"] == "token"
    row = next(m for m in data["metrics"] if m["key"] == P + "kl")
    assert row["difference"] == pytest.approx(row["b"] - row["a"])
    assert data["temperature"]["a"]["temperature"] == 0.6 and data["temperature"]["b"]["source"] == "option"
    assert data["temperature"]["ideal_kl_ratio"] == pytest.approx(2.7778, abs=1e-4)
    assert [f["code"] for f in data["findings"]] == ["noise_consistent"]
    assert set(data["findings"][0]) == {"code", "severity", "message", "side", "metric", "value", "threshold"}
    assert len(data["steps"]) == 6 and data["unpaired_steps"] == {"a": [], "b": []}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--temperature-a", "0"), "error: --temperature-a must be a positive number, got 0"),
        (("--temperature-b", "nan"), "error: --temperature-b must be a positive number"),
        (("--temperature-a", "hot"), "error: --temperature-a must be a positive number, got 'hot'"),
        (("--is", "token", "--is-threshold", "5_2"), "lower bound must be <= upper bound"),
    ],
)
def test_cli_errors_exit_2(capsys: pytest.CaptureFixture, args: tuple[str, ...], expected: str) -> None:
    healthy = str(SAMPLES / "healthy.parquet")
    code, _, err = run(capsys, "compare", healthy, healthy, *args)
    assert code == 2 and expected in err and err.count("\n") == 1
    code, _, err = run(capsys, "compare", healthy, "missing.parquet")
    assert code == 2 and err == "rcdiag: error: missing.parquet: file not found\n"
