"""One set of run options and one output path for every command: each flag is declared once, every command that
reads a dump takes all of them, and the CLI refuses what it would otherwise ignore or misread (issues 8 and 15)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from conftest import ROOT, SAMPLES, run

from rcdiag.cli import app
from rcdiag.cli.flags import READ_FLAGS

HEALTHY = str(SAMPLES / "healthy.parquet")
T06 = str(SAMPLES / "healthy_t06.parquet")
MISSING = "no-such-dump.parquet"  # a configuration error must come before the dump is opened


def _options(command: str) -> set[str]:
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {flag for param in click_command.params for flag in (*param.opts, *param.secondary_opts)}


@pytest.mark.parametrize("command", ["analyze", "compare", "check"])
def test_every_dump_reading_command_takes_every_read_flag(command: str) -> None:
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    assert {flag.name for flag in READ_FLAGS.flags} <= {param.name for param in click_command.params}
    assert {"--quiet", "-q", "--old-col", "--mask-col", "--on-bad-row", "--device", "--workers"} <= _options(command)


@pytest.mark.parametrize(
    "args",
    [
        ("compare", HEALTHY, HEALTHY, "-q", "--format", "json"),
        ("check", HEALTHY, "--max", "kl=1", "-q", "--format", "json"),
    ],
)
def test_quiet_is_accepted_by_compare_and_check(capsys: pytest.CaptureFixture, args: tuple[str, ...]) -> None:
    code, out, err = run(capsys, *args)
    assert code == 0 and err == "" and json.loads(out)


def test_merge_takes_quiet(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    assert run(capsys, "analyze", HEALTHY, "--save-state", str(state), "-q")[0] == 0
    code, out, err = run(capsys, "merge", str(state), "-q", "--format", "json")
    assert code == 0 and err == "" and json.loads(out)["input"]["rows"] == 384


# ----------------------------------------------------------------------------- flags that would be ignored


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--is-threshold", "0.5:2"), "--is-threshold 0.5:2 has no effect while IS is off: add --is token"),
        (("--rs-threshold", "abc"), "--rs-threshold abc has no effect while RS is off: add --rs OPTIONS"),
        (("--batch-normalize",), "--batch-normalize has no effect while IS is off"),
        (("--preset", "decoupled_geo_rs", "--is-threshold", "3"), "--is-threshold 3 has no effect while IS is off"),
        (("--preset", "decoupled_token_is", "--rs", "none", "--rs-threshold", "2"), "has no effect while RS is off"),
    ],
)
@pytest.mark.parametrize("command", ["analyze", "compare", "check"])
def test_a_threshold_without_its_option_is_a_configuration_error(
    capsys: pytest.CaptureFixture, command: str, args: tuple[str, ...], message: str
) -> None:
    paths = (MISSING, MISSING) if command == "compare" else (MISSING,)
    extra = ("--max", "kl=1") if command == "check" else ()
    code, out, err = run(capsys, command, *paths, *args, *extra)
    assert (code, out) == (2, "") and err.startswith("rcdiag: error: ") and message in err
    assert "not found" not in err and err.count("\n") == 1


def test_a_threshold_with_its_option_still_runs(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "analyze", HEALTHY, "--preset", "decoupled_geo_rs", "--is", "token",
                       "--is-threshold", "3", "--format", "json")  # fmt: skip
    assert code == 0 and json.loads(out)["config"]["rollout_is_threshold"] == "3"
    assert run(capsys, "analyze", HEALTHY, "--no-batch-normalize", "-q")[0] == 0  # turning off what is off


@pytest.mark.parametrize(
    ("spec", "options"),
    [("0.5,2.0", "token_k1"), ("[0.5, 2.0]", "token_k1"), ("[0.5, 2.0]", "token_k1,seq_mean_k1")],
)
def test_a_k1_band_written_as_a_list_says_how_a_band_is_written(
    capsys: pytest.CaptureFixture, spec: str, options: str
) -> None:
    code, _, err = run(capsys, "analyze", MISSING, "--rs", options, "--rs-threshold", spec)
    assert code == 2 and "A k1 band is written lower_upper with an underscore: '0.5_2.0'" in err
    assert "keeps the ratio in [0.5, 2]" in err and err.count("\n") == 1


def test_two_thresholds_for_two_options_are_not_a_band(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "analyze", HEALTHY, "--rs", "token_k1,seq_mean_k3", "--rs-threshold", "2.0,0.5",
                       "--format", "json")  # fmt: skip
    assert code == 0 and json.loads(out)["config"]["rollout_rs_threshold"] == "2.0,0.5"


@pytest.mark.parametrize("flag", ["--max-increase", "--max-decrease"])
def test_a_relative_bound_needs_its_unit(capsys: pytest.CaptureFixture, flag: str) -> None:
    code, out, err = run(capsys, "check", MISSING, "--baseline", MISSING, flag, "kl=50")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err == (
        f"rcdiag: error: {flag} kl must be a share of |baseline| ('50%') or an amount in the metric's own units "
        "('abs:50'), got '50'\n"
    )


def test_relative_bounds_with_units(capsys: pytest.CaptureFixture) -> None:
    """kl of the forgotten-temperature dump is far above the healthy baseline's (both computed by the engine, so
    only the units are under test here): +1e9 absolute holds, +50% and +abs:0.01 do not."""
    forgot = str(SAMPLES / "train_forgot_temperature.parquet")
    code, out, _ = run(capsys, "check", forgot, "--baseline", T06, "--steps", "mean", "--format", "json",
                       "--max-increase", "kl=abs:1e9", "--max-increase", "kl=50%", "--max-increase", "kl=abs:0.01")  # fmt: skip
    data = json.loads(out)
    assert code == 1 and [r["status"] for r in data["results"]] == ["passed", "failed", "failed"]
    base = data["results"][0]["baseline"]
    assert [r["limit"] for r in data["results"]] == pytest.approx([base + 1e9, base * 1.5, base + 0.01])


# ----------------------------------------------------------------------------- output paths


def test_an_empty_output_path_names_its_flag_before_any_file_is_written(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's CI command with $GITHUB_STEP_SUMMARY unset: `--markdown ""`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    code, out, err = run(capsys, "check", HEALTHY, "--is", "token", "--pack", "verl", "--junit", "rcdiag.xml",
                         "--markdown", "")  # fmt: skip
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "--markdown was given an empty file name (an unset variable such as $GITHUB_STEP_SUMMARY?)" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "flag"),
    [("analyze", "--output"), ("analyze", "-o"), ("analyze", "--save-state"), ("check", "--junit"),
     ("check", "--markdown"), ("compare", "--output"), ("merge", "--output")],
)  # fmt: skip
def test_every_output_path_is_checked_before_reading(
    capsys: pytest.CaptureFixture, tmp_path: Path, command: str, flag: str
) -> None:
    paths = {"compare": (MISSING, MISSING), "merge": (MISSING,)}.get(command, (MISSING,))
    extra = ("--max", "kl=1") if command == "check" else ()
    named = "--output" if flag == "-o" else flag
    for value, message in (("", f"{named} was given an empty file name"), (str(tmp_path), "is a directory"),
                           (str(tmp_path / "nowhere" / "x"), "does not exist")):  # fmt: skip
        code, _, err = run(capsys, command, *paths, *extra, flag, value)
        assert code == 2 and message in err and "not found" not in err, err


def test_a_closed_pipe_exits_0_quietly() -> None:
    """`rcdiag analyze X | head -1`: the reader is gone before rcdiag writes."""
    for args in (["analyze", HEALTHY], ["compare", HEALTHY, T06], ["analyze", HEALTHY, "--format", "json"]):
        process = subprocess.Popen(
            [sys.executable, "-m", "rcdiag", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
        )
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        err = process.stderr.read()
        assert (process.wait(), err) == (0, b""), args


# ----------------------------------------------------------------------------- formats


def test_a_format_a_command_cannot_render_is_refused(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rcdiag.render import registry

    json_format = registry.FORMATS["json"]
    only_reports = registry.Format(json_format.description, {"report": json_format.renderers["report"]})
    monkeypatch.setitem(registry.FORMATS, "json", only_reports)
    code, out, err = run(capsys, "check", MISSING, "--max", "kl=1", "--format", "json")
    assert (code, out) == (
        2,
        "",
    ) and err == "rcdiag: error: rcdiag check cannot write --format json; it writes table.\n"
    code, out, err = run(capsys, "compare", MISSING, MISSING, "--format", "json")
    assert code == 2 and "rcdiag compare cannot write --format json" in err
    assert run(capsys, "analyze", HEALTHY, "--format", "json")[0] == 0


def test_every_command_writes_its_result_to_a_file_with_one_wrote_line(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    state = tmp_path / "s.json"
    run(capsys, "analyze", HEALTHY, "--save-state", str(state), "-o", str(tmp_path / "a.txt"))
    commands = {
        "analyze": ("analyze", HEALTHY),
        "compare": ("compare", HEALTHY, T06),
        "check": ("check", HEALTHY, "--max", "kl=1"),
        "merge": ("merge", str(state)),
    }
    for name, args in commands.items():
        for fmt in ("table", "json"):
            target = tmp_path / f"{name}.{fmt}"
            code, out, err = run(capsys, *args, "--format", fmt, "-o", str(target))
            assert code == 0 and out == "" and err.startswith(f"rcdiag: wrote {target} (") and err.count("\n") == 1
            text = target.read_text()
            if fmt == "json":
                assert json.loads(text)["schema_version"] == 1
            else:
                assert text.startswith("rcdiag ") and "\x1b[" not in text


# ----------------------------------------------------------------------------- compare


def test_compare_refuses_a_disagreeing_temperature_silently_no_more(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "compare", T06, T06, "--temperature-b", "1.0", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["temperature"]["b"]["temperature"] == 1.0
    assert data["temperature"]["b"]["recorded_temperature"] == 0.6
    found = [f for f in data["findings"] if f["code"] == "temperature_option_overrides_metadata"]
    assert len(found) == 1 and found[0]["side"] == "b" and found[0]["severity"] == "warning"
    assert (found[0]["value"], found[0]["threshold"]) == (1.0, 0.6)
    assert (
        "--temperature-b 1 disagrees with the temperature the dump records (0.6); the analysis uses 1"
        in (found[0]["message"])
    )
    code, out, _ = run(capsys, "compare", T06, T06, "--temperature-b", "0.6", "--format", "json")
    assert "temperature_option_overrides_metadata" not in {f["code"] for f in json.loads(out)["findings"]}
    code, out, _ = run(capsys, "compare", T06, T06, "--temperature-a", "1.0")
    assert code == 0 and "temperature_option_overrides_metadata" in out


def test_compare_takes_per_side_column_names(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    table = pq.read_table(HEALTHY)
    renamed = table.rename_columns(
        [{"old_log_prob": "logp_train", "rollout_log_prob": "logp_infer"}.get(n, n) for n in table.column_names]
    )
    b = tmp_path / "renamed.parquet"
    pq.write_table(renamed, b)
    code, _, err = run(capsys, "compare", HEALTHY, str(b))
    assert code == 2 and str(b) in err
    code, out, _ = run(capsys, "compare", HEALTHY, str(b), "--old-col-b", "logp_train", "--rollout-col-b",
                       "logp_infer", "--format", "json")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["b"]["input"]["columns"]["old_log_prob"] == "logp_train"
    assert data["a"]["input"]["columns"]["old_log_prob"] == "old_log_prob"
    assert all(d["difference"] == 0 for d in data["metrics"] if d["difference"] is not None)
    code, out, _ = run(capsys, "compare", str(b), HEALTHY, "--old-col", "logp_train", "--rollout-col", "logp_infer",
                       "--old-col-b", "old_log_prob", "--rollout-col-b", "rollout_log_prob", "--format", "json")  # fmt: skip
    assert code == 0 and json.loads(out)["a"]["input"]["columns"]["rollout_log_prob"] == "logp_infer"


def test_compare_reports_with_equal_configurations_spelled_differently() -> None:
    """The library's compare_reports, as merge judges states: threshold 2.0 and "2" are one configuration."""
    from rcdiag import CorrectionConfig, analyze
    from rcdiag.compare import compare_reports
    from rcdiag.runtime.errors import ConfigError

    a = analyze(HEALTHY, CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0))
    b = analyze(HEALTHY, CorrectionConfig(rollout_is="token", rollout_is_threshold="2"))
    assert compare_reports(a, b).metrics
    c = analyze(HEALTHY, CorrectionConfig(rollout_is="token", rollout_is_threshold=3.0))
    with pytest.raises(ConfigError, match="different engine configurations"):
        compare_reports(a, c)


def test_library_errors_name_no_cli_flag() -> None:
    from rcdiag import analyze
    from rcdiag.compare import compare
    from rcdiag.runtime.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        analyze(HEALTHY, device="tpu")
    assert "--" not in str(info.value) and "torch-cpu" in str(info.value)
    with pytest.raises(ConfigError, match=r"^temperature_a must be a positive number, got -1"):
        compare(HEALTHY, HEALTHY, temperature_a=-1)


def test_library_device_errors_name_no_cli_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from rcdiag import analyze
    from rcdiag.runtime.errors import ConfigError

    monkeypatch.setitem(sys.modules, "torch", None)  # PyTorch not installed
    with pytest.raises(ConfigError) as info:
        analyze(HEALTHY, device="cuda")
    assert str(info.value) == "device 'cuda' needs PyTorch, which is not installed (pip install 'rcdiag[gpu]')."


# ----------------------------------------------------------------------------- small


def test_the_config_line_states_bypass_mode(capsys: pytest.CaptureFixture) -> None:
    lines = {
        name: next(line for line in run(capsys, "analyze", HEALTHY, "--preset", name)[1].splitlines()
                   if line.startswith("config:"))
        for name in ("decoupled_token_is", "bypass_ppo_clip", "bypass_pg_is")
    }  # fmt: skip
    release = ", as verl 0.9.1 logs it"
    assert lines["decoupled_token_is"].endswith("bypass_mode=false (decoupled)" + release)
    assert lines["bypass_ppo_clip"].endswith("bypass_mode=true loss_type=ppo_clip" + release)
    assert lines["bypass_pg_is"].endswith("bypass_mode=true loss_type=reinforce" + release)


def test_one_step_is_singular(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    table = pq.read_table(HEALTHY)
    steps = table.column("step").to_pylist()
    one = tmp_path / "one_step.parquet"
    pq.write_table(table.filter([s == steps[0] for s in steps]), one)
    out = run(capsys, "analyze", str(one))[1]
    assert " · 1 step · " in out and "1 steps" not in out
    out = run(capsys, "check", str(one), "--max", "kl=1")[1]
    assert " · 1 step" in out and "1 steps" not in out and "holds for the one step" in out
    out = run(capsys, "compare", str(one), str(one))[1]
    assert "1 steps" not in out


def test_check_labels_the_value_nearest_the_limit(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "check", HEALTHY, "--max", "kl=1", "--format", "json")
    result = json.loads(out)["results"][0]
    kls = [s["metrics"]["rollout_corr/kl"] for s in json.loads(run(capsys, "analyze", HEALTHY, "--format",
                                                                      "json")[1])["steps"]]  # fmt: skip
    assert code == 0 and result["value"] == max(kls)  # nearest the upper limit
    assert result["message"].startswith("holds for all 6 steps; nearest the limit: ")
    out = run(capsys, "check", HEALTHY, "--max", "kl=1")[1]
    assert "worst value" in out and "at step" in out and "nearest the limit where a rule holds" in out


def test_the_cli_loads_no_numpy_pyarrow_or_matplotlib_before_a_command_runs() -> None:
    code = "import sys, rcdiag.cli; print(sorted(m for m in ('numpy', 'pyarrow', 'rich', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
