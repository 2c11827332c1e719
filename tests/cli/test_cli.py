"""``rcdiag`` end to end: output, formats, exit codes, and one clear line for every user error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, run, write_dump

from rcdiag.metrics.debug import DEBUG_KEYS

P = "rollout_corr/"
HEALTHY = str(SAMPLES / "healthy.parquet")


def test_quick_start_prints_tables_and_checklist(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "analyze", HEALTHY, "--rs", "token_k1", "--rs-threshold", "0.5_2.0", "--details")
    assert code == 0 and err == ""
    for text in (
        "Off-policy diagnostics",
        "rollout_corr/kl",
        "RS token_k1: keeps ratio pi_train/pi_rollout in [0.5, 2]",
        "rollout_corr/rollout_rs_token_k1_masked_fraction",
        "Rejection sampling, all options combined",
        "Per step",
        "Findings checklist",
        "rcdiag/kl_std_error",
        "E[ratio^2] - 1 per token",
    ):
        assert text in out, text


def test_json_output_has_verl_keys_findings_config_input_steps(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(
        capsys,
        "analyze",
        str(SAMPLES / "topk_offset.parquet"),
        "--preset",
        "decoupled_token_is",
        "--format",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["schema_version"] == 1
    verl_keys = [k for k in data["metrics"] if k.startswith(P)]
    assert len(verl_keys) == 27 and list(data["metrics"]) == [*DEBUG_KEYS, *verl_keys]  # decoupled: training/* first
    assert data["config"]["rollout_is"] == "token" and data["config"]["rollout_is_threshold"] == 2.0
    assert data["input"]["rows"] == 384 and data["input"]["steps"] == 6 and data["input"]["skipped_rows"] == 0
    assert len(data["steps"]) == 6 and set(data["steps"][0]["metrics"]) == set(data["metrics"])
    codes = {f["code"] for f in data["findings"]}
    # 2% of the mass missing: not noise; the default detectors see the offset and the truncation the sample plants
    assert codes == {"kl_high", "kl_k3_disagree", "mismatch_not_noise", "logprob_offset", "sampling_truncation"}
    finding = next(f for f in data["findings"] if f["code"] == "kl_high")
    assert set(finding) >= {"code", "severity", "message", "metric", "value", "threshold", "steps"}
    assert finding["metric"] == P + "kl" and finding["threshold"] == 0.1 and finding["steps"] == [0, 1, 2, 3, 4, 5]


def test_flags_override_a_preset(capsys: pytest.CaptureFixture) -> None:
    args = ("analyze", HEALTHY, "--preset", "decoupled_geo_rs_token_tis", "--is", "sequence", "--is-threshold", "0.5_5.0",
            "--rs-threshold", "0.99_1.01", "--batch-normalize", "--format", "json")  # fmt: skip
    data = json.loads(run(capsys, *args)[1])
    assert data["config"] == {
        "rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0", "rollout_is_batch_normalize": True,
        "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.99_1.01", "bypass_mode": False, "loss_type": "ppo_clip",
        "verl_version": "0.9.1",
    }  # fmt: skip
    assert P + "rollout_is_oob_ratio" in data["metrics"] and P + "rollout_is_batch_norm_factor" in data["metrics"]
    data = json.loads(
        run(
            capsys,
            "analyze",
            HEALTHY,
            "--preset",
            "decoupled_k3_rs_token_tis",
            "--is",
            "none",
            "--rs",
            "none",
            "--format",
            "json",
        )[1]
    )
    assert len(data["metrics"]) == 5 + 13  # verl's training/* debug metrics and the off-policy ones


def test_output_file(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    code, out, err = run(capsys, "analyze", HEALTHY, "--format", "json", "--output", str(target))
    assert code == 0 and out == ""
    assert f"wrote {target}" in err
    assert json.loads(target.read_text())["metrics"][P + "kl"] > 0
    text = tmp_path / "report.txt"
    run(capsys, "analyze", HEALTHY, "--details", "-o", str(text))
    assert "Findings checklist" in text.read_text() and "\x1b[" not in text.read_text()


def test_chunk_tokens_does_not_change_the_report(capsys: pytest.CaptureFixture) -> None:
    a = json.loads(run(capsys, "analyze", HEALTHY, "--is", "token", "--format", "json")[1])
    b = json.loads(run(capsys, "analyze", HEALTHY, "--is", "token", "--format", "json", "--chunk-tokens", "777")[1])
    for key, value in a["metrics"].items():
        assert b["metrics"][key] == pytest.approx(value, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("analyze", "missing.parquet"), "rcdiag: error: missing.parquet: file not found"),
        (
            ("analyze", HEALTHY, "--is", "geometric"),
            "rcdiag: error: --is must be one of token, sequence, none, got 'geometric'",
        ),
        (("analyze", HEALTHY, "--bogus"), "rcdiag: error: No such option: --bogus"),
        (
            ("analyze", HEALTHY, "--rs", "token_k1"),
            "rcdiag: error: --rs-threshold must be explicitly provided when --rs is enabled",
        ),
        (
            ("analyze", HEALTHY, "--rs", "seq_max_k1", "--rs-threshold", "2"),
            "rcdiag: error: Invalid --rs option: seq_max_k1.",
        ),
        (
            ("analyze", HEALTHY, "--rs", "token_k1", "--rs-threshold", "0"),
            "verl v0.9.0 crashes here with ZeroDivisionError",
        ),
        (
            ("analyze", HEALTHY, "--is", "token", "--is-threshold", "5_2"),
            "--is-threshold lower bound must be <= upper bound.",
        ),
        (
            ("analyze", HEALTHY, "--preset", "decoupled_k1_rs"),
            "rcdiag: error: Unknown preset 'decoupled_k1_rs'",
        ),
        (("analyze", HEALTHY, "--device", "tpu"), "rcdiag: error: Unknown device 'tpu'"),
        (
            ("analyze", HEALTHY, "--chunk-tokens", "0"),
            "rcdiag: error: --chunk-tokens must be a number of tokens from 1 to 1,099,511,627,776, got 0",
        ),
    ],
)
def test_usage_and_input_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture, args: tuple, expected: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("rcdiag: error: ") and expected in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_values_in_the_dump_exit_2(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = write_dump(
        tmp_path / "bad.parquet",
        {"old_log_prob": [[-1.0], [float("nan")]], "rollout_log_prob": [[-1.0], [-1.0]]},
    )
    code, _, err = run(capsys, "analyze", str(path))
    assert code == 2
    assert (
        err
        == f"rcdiag: error: {path}, row 1, column 'old_log_prob': holds NaN at valid position 0 of the response; 1 row(s) of the dump are bad (nan 1); fix the dump, or pass --on-bad-row skip to leave those rows out\n"
    )


def test_internal_error_exit_3(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import rcdiag.api

    def boom(*args: object, **kwargs: object) -> None:
        raise KeyError("unexpected")

    monkeypatch.setattr(rcdiag.api, "analyze", boom)
    code, _, err = run(capsys, "analyze", HEALTHY)
    assert code == 3
    assert err.startswith("rcdiag: internal error: KeyError") and "please report it" in err and err.count("\n") == 1


def test_presets_command_lists_all_nineteen(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "presets")
    assert code == 0
    from rcdiag.settings.correction import PRESETS

    for name in PRESETS:
        assert name in out


def test_version_help_and_no_args(capsys: pytest.CaptureFixture) -> None:
    from rcdiag import __version__

    assert run(capsys, "--version")[:2] == (0, f"rcdiag {__version__}\n")
    code, out, _ = run(capsys, "analyze", "--help")
    assert code == 0 and "--rs-threshold" in out and "Exit codes" in out
    code, out, _ = run(capsys)
    assert code == 0 and "analyze" in out
    code, out, err = run(capsys, "analyze")  # a missing PATH is a usage error (tests/cli/test_new_user_cli.py)
    assert (code, out, err) == (2, "", "rcdiag: error: Missing argument 'PATH'. (see 'rcdiag analyze --help')\n")


def test_module_and_console_script_entry_points(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "rcdiag", "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.startswith("rcdiag ")
    result = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(tmp_path / "none.parquet")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_library_import_does_not_load_the_cli_stack() -> None:
    code = "import rcdiag, sys; rcdiag.analyze; rcdiag.CorrectionConfig; print(sorted(m for m in ('typer', 'rich', 'torch') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_cuda_without_a_gpu_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code, _, err = run(capsys, "analyze", HEALTHY, "--device", "cuda")
    assert code == 2 and "no CUDA device is available" in err
    code, out, _ = run(capsys, "analyze", HEALTHY, "--device", "auto", "--format", "json")
    assert code == 0 and json.loads(out)["device"] == "cpu"
