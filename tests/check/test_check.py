"""``check``: rule parsing, step modes, baselines, packs, TOML, exit codes 0/1/2/3, and every CI output."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import SAMPLES, run
from hypothesis import given, settings
from hypothesis import strategies as st
from verl_oracle import require_verl, verl_metrics

import rcdiag
from rcdiag.check import Rule, check, evaluate_rules, load_rules, metric_names, pack, parse_assignment
from rcdiag.metrics.extras import EXTRA_KEYS
from rcdiag.metrics.signatures import SIGNATURE_KEYS
from rcdiag.records.report import StepReport
from rcdiag.render.check_formats import github_annotations, render_junit, render_markdown
from rcdiag.runtime.errors import ConfigError, InputError

FINITE_TEXT = "a finite number (a percentage or 'abs:' only for max_increase/max_decrease)"
"""What a bound of an absolute rule kind takes (``rcdiag.check.rules.parse_bound``)."""
FINITE = re.escape(FINITE_TEXT)

P = "rollout_corr/"
HEALTHY = str(SAMPLES / "healthy.parquet")
FORGOT = str(SAMPLES / "train_forgot_temperature.parquet")


@pytest.fixture(scope="module")
def healthy() -> rcdiag.Report:
    return rcdiag.analyze(HEALTHY)


def step_values(report: rcdiag.Report, key: str) -> list[float]:
    return [(s.metrics | s.extras)[key] for s in report.steps]


@pytest.fixture(autouse=True)
def _outside_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GitHub Actions and no pyproject.toml unless a test sets them."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------------------------------------------- parsing


def test_parse_assignment() -> None:
    rule = parse_assignment("kl=2e-3", "max", option="--max")
    assert (rule.metric, rule.kind, rule.bound, rule.relative, rule.steps, rule.source) == (
        "kl", "max", 0.002, False, "every", "--max")  # fmt: skip
    rule = parse_assignment(" kl = 50% ", "max_increase", option="--max-increase")
    assert (rule.metric, rule.bound, rule.relative) == ("kl", 0.5, True)
    assert rule.describe("rollout_corr/kl") == "rollout_corr/kl <= baseline + 50%"
    for text, kind, message in [
        ("kl", "max", "--max expects NAME=VALUE"),
        ("kl=", "max", "--max expects NAME=VALUE"),
        ("kl=abc", "max", f"^--max kl must be {FINITE}, got 'abc'$"),
        ("kl=5%", "max", f"^--max kl must be {FINITE}, got '5%'$"),
        ("kl=-5%", "max_increase", r"^--max kl must be an allowed increase/decrease >= 0, got '-5%'$"),
        ("kl=nan", "max", f"^--max kl must be {FINITE}, got 'nan'$"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_assignment(text, kind, option="--max")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^the bound of the rule on 'kl' must be a finite number, got inf$"):
        Rule("kl", "max", math.inf)
    with pytest.raises(ConfigError, match=r"^the max_abs bound of the rule on 'kl' must be a number >= 0, got -1$"):
        Rule("kl", "max_abs", -1)
    assert Rule("kl", "max_abs", 0.0).bound == 0.0
    with pytest.raises(ConfigError, match="tolerate applies to steps='every' only"):
        Rule("kl", "max", 1.0, steps="last", tolerate=0.1)
    with pytest.raises(ConfigError, match=r"tolerate must be a fraction in \[0, 1\)"):
        Rule("kl", "max", 1.0, tolerate=1.0)


def test_metric_names_follow_the_configuration() -> None:
    plain = metric_names(rcdiag.CorrectionConfig().resolve())
    debug, verl = 5, 13
    assert len(plain) == debug + verl + len(EXTRA_KEYS) + len(SIGNATURE_KEYS)
    assert P + "kl" in plain and "rcdiag/token_mult_prob_error" in plain
    assert "training/rollout_probs_diff_max" in plain  # decoupled mode (the default): verl's debug metrics
    with_is = metric_names(rcdiag.CorrectionConfig(rollout_is="token").resolve())
    assert P + "rollout_is_eff_sample_size" in with_is and P + "rollout_is_eff_sample_size" not in plain
    # verl's own keys, in verl's order, then rcdiag's extras (docs/metrics.md)
    torch = require_verl()
    old, rollout, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.1, -2.0]]), torch.ones(1, 2)
    extras = ["rcdiag/abs_log_ratio_mean", "rcdiag/abs_log_ratio_max", "rcdiag/token_mult_prob_error",
              "rcdiag/kl_std_error", "rcdiag/kl_std_error_dof", "rcdiag/clamped_token_fraction",
              *SIGNATURE_KEYS]  # fmt: skip
    for config in (
        {},
        {"rollout_is": "token"},
        {"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "0.5_2,2"},
    ):
        verl = verl_metrics(old, rollout, mask, **config)
        assert metric_names(rcdiag.CorrectionConfig(**config).resolve()) == [*verl, *extras], config


# --------------------------------------------------------------------------------------------- evaluation


def test_every_step_quotes_the_worst_step(healthy: rcdiag.Report) -> None:
    kl = step_values(healthy, P + "kl")
    worst = max(range(6), key=lambda i: kl[i])
    (result,) = evaluate_rules(healthy, [Rule("kl", "max", 2e-3)])
    assert result.status == "passed" and result.key == P + "kl"
    assert result.value == kl[worst] and result.step == worst and result.limit == 2e-3 and result.checked_steps == 6
    bound = sorted(kl)[2]  # three steps above it
    (result,) = evaluate_rules(healthy, [Rule("rollout_corr/kl", "max", bound)])
    failing = tuple(i for i in range(6) if kl[i] > bound)
    assert len(failing) == 3 and result.status == "failed" and result.failing_steps == failing
    assert result.step == worst and f"fails at 3 of 6 step(s) ({', '.join(map(str, failing))})" in result.message
    assert f"at step {worst}" in result.message


def test_step_modes_and_tolerance(healthy: rcdiag.Report) -> None:
    kl = step_values(healthy, P + "kl")
    bound = sorted(kl)[-2]  # exactly one step above it
    last, mean = kl[-1], sum(kl) / 6
    results = evaluate_rules(
        healthy,
        [
            Rule("kl", "max", bound),
            Rule("kl", "max", bound, tolerate=0.2),  # floor(0.2 * 6) = 1 step may fail
            Rule("kl", "max", bound, tolerate=0.1),  # floor(0.6) = 0
            Rule("kl", "max", last, steps="last"),
            Rule("kl", "max", last * 0.999, steps="last"),
            Rule("kl", "max", mean, steps="mean"),
            Rule("kl", "max", mean * 0.999, steps="mean"),
        ],
    )
    assert [r.status for r in results] == ["failed", "passed", "failed", "passed", "failed", "passed", "failed"]
    assert "within the tolerated 20%" in results[1].message and "more than the tolerated 10%" in results[2].message
    assert results[3].value == last and results[3].step == 5 and results[3].checked_steps == 1
    assert results[5].value == pytest.approx(mean, rel=1e-12) and results[5].step is None


def test_min_and_max_abs(healthy: rcdiag.Report) -> None:
    ppl = step_values(healthy, P + "training_ppl")
    diff = step_values(healthy, P + "log_ppl_diff_min")  # negative values
    results = evaluate_rules(
        healthy,
        [
            Rule("training_ppl", "min", min(ppl)),
            Rule("training_ppl", "min", min(ppl) + 1e-6),
            Rule("log_ppl_diff_min", "max_abs", max(abs(v) for v in diff)),
            Rule("log_ppl_diff_min", "max_abs", max(abs(v) for v in diff) * 0.99),
        ],
    )
    assert [r.status for r in results] == ["passed", "failed", "passed", "failed"]
    assert results[1].value == min(ppl)


def test_a_dump_without_steps_is_one_batch(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "nosteps.parquet"
    pq.write_table(pq.read_table(HEALTHY).drop(["step"]), path)
    result = check(path, [Rule("kl", "max", 1.0)])
    (r,) = result.results
    assert r.step is None and r.checked_steps == 1 and r.failing_steps == ()
    assert r.value == result.report.metrics[P + "kl"] and "holds for the dump" in r.message


def test_null_values_fail(healthy: rcdiag.Report) -> None:
    steps = list(healthy.steps)
    steps[2] = dataclasses.replace(steps[2], metrics=steps[2].metrics | {P + "kl": None})
    report = dataclasses.replace(healthy, steps=tuple(steps))
    every, mean = evaluate_rules(report, [Rule("kl", "max", 1.0), Rule("kl", "max", 1.0, steps="mean")])
    assert every.status == "failed" and every.failing_steps == (2,) and "null (not finite)" in every.message
    assert mean.status == "failed" and "no mean" in mean.message


def _report_with_steps(base: rcdiag.Report, values: list[float]) -> rcdiag.Report:
    steps = tuple(StepReport(i, 1, 1, {P + "kl": v}, {}) for i, v in enumerate(values))
    return dataclasses.replace(base, steps=steps, metrics={P + "kl": values[0]}, extras={})


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=12),
    bound=st.floats(-1, 1, allow_nan=False),
    tolerate=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9]),
)
def test_rule_semantics_match_a_direct_computation(
    healthy: rcdiag.Report, values: list[float], bound: float, tolerate: float
) -> None:
    report = _report_with_steps(healthy, values)
    rules = [
        Rule("kl", "max", bound, tolerate=tolerate),
        Rule("kl", "min", bound),
        Rule("kl", "max_abs", abs(bound)),
        Rule("kl", "max", bound, steps="last"),
        Rule("kl", "max", bound, steps="mean"),
    ]
    got = [r.status == "passed" for r in evaluate_rules(report, rules)]
    over = sum(v > bound for v in values)
    want = [
        over <= math.floor(tolerate * len(values) + 1e-9),
        min(values) >= bound,
        max(abs(v) for v in values) <= abs(bound),
        values[-1] <= bound,
        sum(values) / len(values) <= bound,
    ]
    assert got == want


# ----------------------------------------------------------------------------------------------- baselines


def test_relative_rules_against_a_baseline(healthy: rcdiag.Report) -> None:
    forgot = check(FORGOT, [Rule("kl", "max_increase", 0.5, relative=True)], baseline=HEALTHY)
    (r,) = forgot.results
    base = max(step_values(healthy, P + "kl"))  # every-step mode: each step against the baseline's worst step
    assert r.baseline == base and r.limit == pytest.approx(base * 1.5, rel=1e-12)
    assert r.status == "failed" and r.failing_steps == (0, 1, 2, 3, 4, 5)
    # a run checked against itself passes in every mode, even with no increase allowed
    rules = [Rule("kl", "max_increase", 0.0, steps=mode) for mode in ("every", "last", "mean")]
    same = check(HEALTHY, [*rules, Rule("kl", "max_decrease", 0.0)], baseline=HEALTHY)
    assert [r.status for r in same.results] == ["passed"] * 4
    assert same.results[2].baseline == pytest.approx(sum(step_values(healthy, P + "kl")) / 6, rel=1e-12)
    assert same.results[3].baseline == min(step_values(healthy, P + "kl"))
    absolute = check(FORGOT, [Rule("kl", "max_increase", 0.2)], baseline=HEALTHY).results[0]
    assert absolute.limit == pytest.approx(base + 0.2, rel=1e-12) and absolute.status == "passed"
    config = rcdiag.CorrectionConfig(rollout_is="token")
    ess = check(FORGOT, [Rule("rollout_is_eff_sample_size", "max_decrease", 0.05, steps="last")], config,
                baseline=HEALTHY)  # fmt: skip
    (r,) = ess.results
    want = rcdiag.analyze(HEALTHY, config).steps[-1].metrics[P + "rollout_is_eff_sample_size"] - 0.05
    assert r.limit == pytest.approx(want, rel=1e-12) and r.status == "failed"


def test_rules_are_validated_before_reading() -> None:
    with pytest.raises(ConfigError) as info:
        check("does-not-matter.parquet", [Rule("rollout_is_mean", "min", 0.5)])
    message = str(info.value)
    assert "'rollout_is_mean' is not computed for this configuration (IS metrics need --is" in message
    assert "Available: training/rollout_probs_diff_valid, training/rollout_probs_diff_max," in message
    assert ", training_ppl, training_log_ppl, kl, k3_kl," in message and "rcdiag/kl_std_error" in message
    with pytest.raises(ConfigError, match="'kll' is not a metric rcdiag computes"):
        check("x.parquet", [Rule("kll", "max", 1.0)])
    with pytest.raises(ConfigError, match="give --baseline"):
        check("x.parquet", [Rule("kl", "max_increase", 1.0)])
    with pytest.raises(ConfigError, match="no rules to check"):
        check("x.parquet", [])


# --------------------------------------------------------------------------------------------------- packs


def test_packs() -> None:
    assert sorted((r.metric, r.kind, r.bound) for r in pack("verl")) == sorted([
        ("rollout_is_mean", "min", 0.5), ("rollout_is_mean", "max", 2.0),
        ("rollout_is_eff_sample_size", "min", 0.3), ("rollout_is_std", "max", 1.0),
        ("kl", "max_abs", 0.1), ("chi2_token", "max", 1.0),
    ])  # fmt: skip
    assert sorted((r.metric, r.bound) for r in pack("nemo-rl")) == [
        ("k3_kl", 1e-3),
        ("rcdiag/token_mult_prob_error", 1.05),
    ]
    result = check(HEALTHY, pack("verl"))  # no IS: the IS rules are skipped, not errors
    statuses = {(r.rule.metric, r.rule.kind): r.status for r in result.results}
    assert result.passed and statuses[("kl", "max_abs")] == statuses[("chi2_token", "max")] == "passed"
    assert [s for k, s in statuses.items() if k[0].startswith("rollout_is_")] == ["skipped"] * 4
    assert all(
        r.status == "passed" for r in check(HEALTHY, pack("verl"), rcdiag.CorrectionConfig(rollout_is="token")).results
    )
    forgot = check(FORGOT, [*pack("nemo-rl"), *pack("miles-dense"), *pack("miles-moe")])
    statuses = {(r.key, r.rule.source): (r.status, r.value) for r in forgot.results}
    assert statuses[("rcdiag/token_mult_prob_error", "pack nemo-rl")][0] == "failed"
    assert statuses[("rcdiag/token_mult_prob_error", "pack nemo-rl")][1] > 1.5
    assert statuses[(P + "k3_kl", "pack miles-moe")][0] == "failed"  # k3 ~0.15 > 0.1 even for MoE
    assert all(r.status == "passed" for r in check(HEALTHY, [*pack("nemo-rl"), *pack("miles-dense")]).results)
    with pytest.raises(ConfigError, match="unknown rule pack 'trl'"):
        pack("trl")


# ---------------------------------------------------------------------------------------------------- TOML


RULES_TOML = """
packs = ["miles-dense"]
steps = "every"
baseline = "base.parquet"

[engine]
preset = "decoupled_token_is"
rollout_is_threshold = 3.0

[max]
kl = 2e-3
"rcdiag/token_mult_prob_error" = 1.05

[min]
rollout_is_eff_sample_size = 0.5

[max_increase]
kl = "50%"

[[rule]]
metric = "chi2_token"
max = 0.1
steps = "mean"
"""


def test_rules_file_top_level_and_pyproject_table(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES_TOML)
    loaded = load_rules(path)
    assert loaded is not None and loaded.baseline == tmp_path / "base.parquet"
    assert [(r.metric, r.kind, r.bound, r.relative, r.steps, r.source) for r in loaded.rules] == [
        ("k3_kl", "max", 1e-3, False, "every", "pack miles-dense"),
        ("kl", "max", 2e-3, False, "every", "rules.toml"),
        ("rcdiag/token_mult_prob_error", "max", 1.05, False, "every", "rules.toml"),
        ("rollout_is_eff_sample_size", "min", 0.5, False, "every", "rules.toml"),
        ("kl", "max_increase", 0.5, True, "every", "rules.toml"),
        ("chi2_token", "max", 0.1, False, "mean", "rules.toml"),
    ]
    assert loaded.config() == rcdiag.preset("decoupled_token_is").replace(rollout_is_threshold=3.0)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'x'\n\n" + RULES_TOML.replace("[engine]", "[tool.rcdiag.check.engine]")
                         .replace("[max]", "[tool.rcdiag.check.max]").replace("[min]", "[tool.rcdiag.check.min]")
                         .replace("[max_increase]", "[tool.rcdiag.check.max_increase]")
                         .replace("[[rule]]", "[[tool.rcdiag.check.rule]]")
                         .replace('packs = ["miles-dense"]\nsteps = "every"\nbaseline = "base.parquet"',
                                  '[tool.rcdiag.check]\npacks = ["miles-dense"]\nsteps = "every"\nbaseline = "base.parquet"'))  # fmt: skip
    again = load_rules(pyproject)
    assert again is not None and again.rules == tuple(
        dataclasses.replace(r, source="pyproject.toml") if r.source == "rules.toml" else r for r in loaded.rules
    )
    (tmp_path / "plain.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(InputError, match=r"pyproject.toml: has no \[tool.rcdiag.check\] table"):
        load_rules(tmp_path / "other" / "pyproject.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max = {kl = 1", "not valid TOML"),
        ("maxx = {kl = 1.0}", "unknown key(s) maxx"),
        ("[max]\nkl = true", "[max] kl in {path} must be " + FINITE_TEXT + ", got True"),
        ("[[rule]]\nmetric = 'kl'\nmax_increase = 5", "[[rule]] #1 max_increase in {path} must be a share of"),
        ("steps = 'first'\n[max]\nkl = 1.0", "steps in {path} must be one of every, last, mean, got 'first'"),
        ("tolerate = 'x'\n[max]\nkl = 1.0", "tolerate in {path} must be a fraction in [0, 1), got 'x'"),
        ("[[rule]]\nmetric = 'kl'", "sets no bound"),
        ("[[rule]]\nmetric = 'kl'\nmax = 1.0\nstep = 'last'", "unknown key(s) step"),
        ("[engine]\nrollout_iss = 'token'", "[engine] takes"),
        ("packs = ['trl']", "unknown rule pack 'trl'"),
    ],
)
def test_bad_rules_files_exit_2(capsys: pytest.CaptureFixture, tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, _, err = run(capsys, "check", HEALTHY, "--rules", str(path))
    # a key's bad value names the key, then its file (rcdiag.runtime.option_checks); other errors start with the file
    where = "rcdiag: error: " if "{path}" in message else f"rcdiag: error: {path}"
    message = message.format(path=path)
    assert code == 2 and err.startswith(where) and str(path) in err and message in err and err.count("\n") == 1, err


def test_pyproject_in_the_current_directory(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.rcdiag.check]\npacks = ['miles-dense']\n[tool.rcdiag.check.max]\nkl = 1e-4\n"
    )
    code, out, err = run(capsys, "check", HEALTHY)
    assert code == 1 and "using [tool.rcdiag.check] from pyproject.toml" in err
    assert "rollout_corr/kl <= 0.0001" in out and "rollout_corr/k3_kl <= 0.001" in out
    code, out, err = run(capsys, "check", HEALTHY, "--no-pyproject", "--max", "kl=1")
    assert code == 0 and "0.0001" not in out and err == ""


def test_rules_file_engine_and_baseline_through_the_cli(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    import shutil

    shutil.copy(HEALTHY, tmp_path / "base.parquet")
    (tmp_path / "rules.toml").write_text(RULES_TOML)
    code, out, _ = run(capsys, "check", FORGOT, "--rules", "rules.toml", "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["config"]["rollout_is"] == "token" and data["config"]["rollout_is_threshold"] == 3.0
    assert data["baseline"]["path"] == "base.parquet"  # relative to the rules file (here: the cwd)
    # a flag on top of the file's engine table
    code, out, _ = run(capsys, "check", HEALTHY, "--rules", "rules.toml", "--is-threshold", "2.0", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["config"]["rollout_is_threshold"] == "2.0" and data["passed"] is True


# ------------------------------------------------------------------------------------------ CLI exit codes


def test_exit_0_and_the_checklist(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "check", HEALTHY, "--max", "kl=2e-3", "--min", "training_ppl=1", "--pack", "verl")
    assert code == 0 and err == ""
    for text in ("Checklist", "✓", "rollout_corr/kl <= 0.002", "every step", "pack verl", "not computed",
                 "PASSED: 4 of 8 rules hold, 4 skipped"):  # fmt: skip
        assert text in out, text


def test_exit_1_names_the_step(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "check", HEALTHY, "--max", "kl=3e-4", "--max", "k3_kl=1")
    assert code == 1
    assert "✗" in out and "FAILED: 1 of 2 rules failed" in out and "fails at 4 of 6 step(s) (2, 3, 4, 5)" in out


def test_process_exit_code_is_exactly_1(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "rcdiag", "check", FORGOT, "--max", "kl=2e-3", "--no-pyproject"]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 1 and "FAILED: 1 of 1 rules failed" in result.stdout and result.stderr == ""
    ok = subprocess.run([*command[:-3], "--max", "kl=1"], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert ok.returncode == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--min", "rollout_is_eff_sample_size=0.8"), "is not computed for this configuration (IS metrics need --is"),
        (("--max", "kll=1"), "Available: training/rollout_probs_diff_valid, "),
        (("--max", "kl"), "--max expects NAME=VALUE"),
        (("--max-increase", "kl=50%"), "give --baseline"),
        (("--max", "kl=1", "--steps", "first"), "--steps must be one of every, last, mean, got 'first'"),
        (("--max", "kl=1", "--steps", "last", "--tolerate", "0.1"), "tolerate applies to steps='every' only"),
        (("--pack", "trl"), "unknown rule pack 'trl'"),
        ((), "no rules to check"),
        (("--max", "kl=1", "--rules", "missing.toml"), "missing.toml: file not found"),
        (("--max", "kl=1", "--baseline", "missing.parquet"), "missing.parquet: file not found"),
    ],
)
def test_exit_2(capsys: pytest.CaptureFixture, args: tuple[str, ...], expected: str) -> None:
    code, out, err = run(capsys, "check", HEALTHY, *args)
    assert code == 2 and out == "" and expected in err and err.count("\n") == 1, err


def test_exit_3_on_an_internal_error(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import rcdiag.api.checking

    def boom(*args: object, **kwargs: object) -> None:
        raise KeyError("unexpected")

    monkeypatch.setattr(rcdiag.api.checking, "analyze", boom)
    code, _, err = run(capsys, "check", HEALTHY, "--max", "kl=1")
    assert code == 3 and err.startswith("rcdiag: internal error: KeyError")


# ----------------------------------------------------------------------------------------------- CI outputs


def test_json_output(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "check", FORGOT, "--max", "kl=2e-3", "--max", "k3_kl=1", "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["kind"] == "check" and data["passed"] is False
    assert data["counts"] == {"passed": 1, "failed": 1, "skipped": 0}
    first = data["results"][0]
    assert first["status"] == "failed" and first["metric"] == P + "kl" and first["limit"] == 2e-3
    assert first["failing_steps"] == [0, 1, 2, 3, 4, 5] and first["rule"]["source"] == "--max"
    assert first["label"] == "rollout_corr/kl <= 0.002 (every step)" and first["value"] > 0.15


def test_junit_file_parses_with_one_testcase_per_rule(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    target = tmp_path / "rcdiag.xml"
    code, _, _ = run(capsys, "check", FORGOT, "--pack", "verl", "--max", "k3_kl=1", "--junit", str(target))
    assert code == 1
    root = ET.parse(target).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 7 and suite.get("tests") == "7" == root.get("tests")
    failures = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert suite.get("failures") == str(len(failures)) == "2" and suite.get("skipped") == str(len(skipped)) == "4"
    assert suite.get("errors") == "0"
    names = [c.get("name") for c in failures]
    assert names == ["|rollout_corr/kl| <= 0.1 (every step)", "rollout_corr/chi2_token <= 1 (every step)"]
    failure = failures[0].find("failure")
    assert failure is not None and failure.get("type") == "rcdiag.RuleFailed"
    assert "fails at 6 of 6 step(s)" in failure.get("message", "") and "limit: 0.1" in (failure.text or "")
    assert failures[0].get("classname") == "rcdiag.check.pack verl"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["dump"] == FORGOT and props["steps"] == "6"


def test_junit_file_reads_with_a_junit_parser(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """What CI systems do with the file: junitparser (the library Jenkins-style tooling uses) reads it."""
    junitparser = pytest.importorskip("junitparser")
    target = tmp_path / "rcdiag.xml"
    assert run(capsys, "check", FORGOT, "--pack", "verl", "--max", "k3_kl=1", "--junit", str(target))[0] == 1
    (suite,) = list(junitparser.JUnitXml.fromfile(str(target)))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (7, 2, 0, 4)
    outcome = {case.name: [type(r).__name__ for r in case.result] for case in suite}
    assert outcome["|rollout_corr/kl| <= 0.1 (every step)"] == ["Failure"]
    assert outcome["rollout_corr/k3_kl <= 1 (every step)"] == []


def test_markdown_summary(capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.md"
    code, _, _ = run(capsys, "check", FORGOT, "--max", "kl=2e-3", "--max-abs", "kl=1", "--markdown", str(target))
    text = target.read_text()
    assert code == 1
    assert text.startswith("### ❌ rcdiag check failed: 1 of 2 rules failed\n")
    assert "| ❌ | `rollout_corr/kl <= 0.002` (every step) | 0.161366 | 0.002 | 0 | --max |" in text
    assert "| ✅ | `\\|rollout_corr/kl\\| <= 1` (every step) |" in text  # pipes escaped inside cells
    run(capsys, "check", FORGOT, "--max", "kl=2e-3", "--markdown", str(target))
    assert target.read_text().count("### ") == 1  # an ordinary file is overwritten
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    run(capsys, "check", HEALTHY, "--max", "kl=2e-3", "--markdown", str(target))
    text = target.read_text()
    assert text.count("### ") == 2 and "### ✅ rcdiag check passed: 1 of 1 rules hold" in text  # appended


def test_github_annotations(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run(capsys, "check", FORGOT, "--max", "kl=2e-3")
    assert code == 1 and "::error" not in out + err
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    code, out, _ = run(capsys, "check", FORGOT, "--max", "kl=2e-3", "--max", "k3_kl=1")
    lines = [line for line in out.splitlines() if line.startswith("::")]
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith("::error title=rcdiag check%3A rollout_corr/kl <= 0.002::")
    assert f"{FORGOT}: rollout_corr/kl <= 0.002 (every step): fails at 6 of 6 step(s)" in lines[0]
    code, out, err = run(capsys, "check", FORGOT, "--max", "kl=2e-3", "--format", "json")
    assert json.loads(out)["passed"] is False and err.startswith("::error title=")  # stdout stays JSON


def test_annotation_escaping(healthy: rcdiag.Report) -> None:
    from rcdiag.check import CheckResult, RuleResult

    rule = Rule("kl", "max", 1.0, source="a,b")
    result = RuleResult(rule, P + "kl", "failed", 2.0, 1.0, 3, (3,), 6, None, "100% off\nline two")
    lines = github_annotations(CheckResult(healthy, None, (result,)))
    assert lines == [
        f"::error title=rcdiag check%3A rollout_corr/kl <= 1::{HEALTHY}: rollout_corr/kl <= 1 (every step): 100%25 off%0Aline two"
    ]
    xml = render_junit(CheckResult(healthy, None, (result,)))
    assert ET.fromstring(xml.split("?>", 1)[1]).find("testsuite/testcase/failure") is not None
    assert "line two" in render_markdown(CheckResult(healthy, None, (result,)))
