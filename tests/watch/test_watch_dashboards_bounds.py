"""Issues 32 and 36: a watch says when a file it read is replaced or deleted; the crossing forecast does not read a
level jump as a trend; the dashboards are bounded (an unreachable MLflow server fails in seconds, a sqlite store in
a missing directory is refused creating nothing, a report goes to MLflow in a few batches, a second TensorBoard
export into one directory is a new run); ``--workers N`` beyond what helps is said. Real processes where the
behaviour is the command line's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, SAMPLES, require, write_dump
from hostile import run_capped
from tracking_readers import tensorboard_scalars

from rcdiag.watch.forecast import MIN_POINTS, Forecast, NoTrend, forecast_crossing, trend

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SAMPLE = SAMPLES / "step_trend.parquet"


def step_file(path: Path, step: int, delta: float, rows: int = 4) -> Path:
    """One step's dump: ``rows`` responses of 8 tokens, every token's log-ratio ``delta`` (so each metric is flat
    within the step and exactly known across steps)."""
    return write_dump(
        path,
        {"old_log_prob": [[-1.0] * 8] * rows, "rollout_log_prob": [[-1.0 - delta] * 8] * rows, "step": [step] * rows},
    )


def watch_once(run: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rcdiag", "watch", str(run), "--state", str(state), "--once", "--settle", "0",
               "--format", "json", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def analyze_json(*args: str | Path) -> dict[str, Any]:
    done = run_capped("analyze", *args, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------- 1. files read, then changed


def test_a_file_replaced_rewritten_or_deleted_after_it_was_read_is_said_once(tmp_path: Path) -> None:
    """Three files read; then one rewritten in place, one replaced by rename (another inode), one deleted: the
    next poll says each once (a `file` warning alert naming what changed), keeps the rows it read (the state's
    numbers are the first analysis's), and a later poll says nothing again."""
    run, state = tmp_path / "run", tmp_path / "watch.json"
    run.mkdir()
    for step in range(3):
        step_file(run / f"s{step}.parquet", step, 0.01 * (step + 1))
    before = analyze_json(run)
    first = watch_once(run, state)
    assert first.returncode == 0, first.stderr
    assert [e["step"] for e in lines(first.stdout) if e["kind"] == "step"] == [0, 1, 2]
    assert not [a for e in lines(first.stdout) for a in e["alerts"] if a["kind"] == "file"]

    step_file(run / "s0.parquet", 0, 0.5, rows=6)  # rewritten in place: the same inode, another size
    step_file(tmp_path / "new.parquet", 1, 0.5, rows=6)
    os.replace(tmp_path / "new.parquet", run / "s1.parquet")  # a new inode under the name
    (run / "s2.parquet").unlink()
    second = watch_once(run, state)
    assert second.returncode == 0, second.stderr
    events = lines(second.stdout)
    assert [e["kind"] for e in events] == ["report"]  # nothing new to read: the report carries the alerts
    alerts = {a["key"]: a for a in events[0]["alerts"]}
    assert sorted(alerts) == ["file:s0.parquet", "file:s1.parquet", "file:s2.parquet"]
    assert {a["kind"] for a in alerts.values()} == {"file"} and {a["severity"] for a in alerts.values()} == {"warning"}
    size0 = (run / "s0.parquet").stat().st_size
    assert alerts["file:s0.parquet"]["message"].startswith(f"s0.parquet in {run} changed (")
    assert "another file under its name" not in alerts["file:s0.parquet"]["message"]
    assert f" -> {size0:,} bytes" in alerts["file:s0.parquet"]["message"]
    assert "another file under its name" in alerts["file:s1.parquet"]["message"]
    assert "keeps the rows of the version it read" in alerts["file:s1.parquet"]["message"]
    assert alerts["file:s2.parquet"]["message"] == (
        f"s2.parquet in {run} was deleted after the watch read it: its rows stay counted here, and `rcdiag "
        "analyze` of the directory no longer counts them"
    )
    assert alerts["file:s2.parquet"]["detail"]["now"] is None
    assert alerts["file:s1.parquet"]["detail"]["read"]["size"] != alerts["file:s1.parquet"]["detail"]["now"]["size"]

    merged = subprocess.run([sys.executable, "-m", "rcdiag", "merge", str(state), "--format", "json"],
                            capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    kept = json.loads(merged.stdout)
    assert [(s["step"], s["rows"], s["metrics"]) for s in kept["steps"]] == [
        (s["step"], s["rows"], s["metrics"]) for s in before["steps"]
    ]  # the version read stays counted; analyze of the directory now differs:
    assert [(s["step"], s["rows"]) for s in analyze_json(run)["steps"]] == [(0, 6), (1, 6)]

    third = watch_once(run, state, "--format", "table")
    assert third.returncode == 0, third.stderr
    assert third.stdout == "" and third.stderr == ""  # said once: the keys are in the state


# ------------------------------------------------------------------------------------------ 4. the forecast's trend

JUMP = [3.3e-4] * 5 + [0.021] * 10
"""k3_kl flat at 3.3e-4, then flat at 0.021 from step 5."""


def test_a_level_jump_is_not_a_trend() -> None:
    for last in range(5, len(JUMP)):
        steps, values = list(range(last + 1)), JUMP[: last + 1]
        assert forecast_crossing("rollout_corr/k3_kl", steps, values, 0.1) is None, last
    said = trend("rollout_corr/k3_kl", list(range(9)), JUMP[:9], 0.1)
    assert isinstance(said, NoTrend) and (said.since, said.points) == (5, 4)
    assert (said.before, said.after) == (pytest.approx(3.3e-4), pytest.approx(0.021))
    assert said.message == (
        "k3_kl changed level at step 5 (0.00033 -> 0.021): no trend towards 0.1 since (4 step(s), 5 needed to fit "
        "one), so no crossing is forecast"
    )
    later = trend("rollout_corr/k3_kl", list(range(12)), JUMP[:12], 0.1)
    assert isinstance(later, NoTrend) and later.points == 7 and "(7 step(s))" in later.message
    # a noisy jump too, and a jump followed by a real climb forecasts from the climb alone
    rng = np.random.default_rng(5)
    noisy = [1e-3 + rng.normal(0, 1e-4) for _ in range(5)] + [2e-2 + rng.normal(0, 1e-4) for _ in range(7)]
    assert isinstance(trend("kl", list(range(12)), noisy, 0.1), NoTrend)
    climb = [1e-3] * 4 + [2e-2 + 2e-3 * k + 1e-5 * (-1) ** k for k in range(6)]
    made = trend("kl", list(range(10)), climb, 0.05)
    assert isinstance(made, Forecast) and made.points == 6
    slope, intercept = np.polyfit(np.arange(4, 10), np.log(climb[4:]), 1)  # the climb's log-scale line alone
    assert made.scale == "log" and made.expected == pytest.approx((math.log(0.05) - intercept) / slope, rel=1e-9)


def test_a_linear_climb_is_never_read_as_a_level_change() -> None:
    """Noisy and noise-free lines and a bending curve: the level test never fires, the line is fitted as before."""
    rng = np.random.default_rng(11)
    for noise in (1e-4, 4e-4, 1e-3):
        for _ in range(2000):
            steps = np.arange(20, 30)
            values = 1e-2 * (steps / 60.0) + rng.normal(0, noise, steps.size)
            assert not isinstance(trend("kl", steps.tolist(), values.tolist(), 1e-2), NoTrend)
    exact = [1e-3 * (1 + k) for k in range(MIN_POINTS + 3)]
    assert isinstance(trend("kl", list(range(len(exact))), exact, 0.1), Forecast)
    bending = [1e-3 * (1 + 0.3 * k) ** 2 for k in range(12)]
    made = trend("kl", list(range(12)), bending, 0.1)
    assert isinstance(made, Forecast) and made.points == 10


def _k3_delta(k3: float) -> float:
    """The per-token log-ratio whose k3 term (``r - 1 - log r``, ``r = exp(delta)``) is ``k3``, by bisection."""
    low, high = 0.0, 2.0
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if math.expm1(mid) - mid < k3 else (low, mid)
    return (low + high) / 2


def test_watch_after_a_level_jump_forecasts_nothing_and_says_why(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for step in range(12):
        step_file(run / f"step-{step:02d}.parquet", step, 0.0257 if step < 5 else 0.2)
    done = watch_once(run, tmp_path / "watch.json", "--max", "k3_kl=0.1")
    assert done.returncode == 0, done.stderr
    steps = [e for e in lines(done.stdout) if e["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(12))
    assert all(s["forecasts"] == [] for s in steps)
    assert not [a for e in lines(done.stdout) for a in e["alerts"] if a["kind"] == "forecast"]
    assert steps[5]["metrics"]["rollout_corr/k3_kl"] > 50 * steps[4]["metrics"]["rollout_corr/k3_kl"]
    said = steps[-1]["no_trend"]
    assert len(said) == 1 and (said[0]["since"], said[0]["points"], said[0]["limit"]) == (5, 7, 0.1)
    assert said[0]["message"].startswith("k3_kl changed level at step 5 (")


def test_watch_on_a_linear_climb_still_forecasts_the_crossing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for step in range(12):
        step_file(run / f"step-{step:02d}.parquet", step, _k3_delta(1e-3 + 2e-3 * step))
    done = watch_once(run, tmp_path / "watch.json", "--max", "k3_kl=0.05")
    assert done.returncode == 0, done.stderr
    steps = [e for e in lines(done.stdout) if e["kind"] == "step"]
    assert steps[-1]["metrics"]["rollout_corr/k3_kl"] == pytest.approx(1e-3 + 2e-3 * 11, rel=1e-3)
    assert all(s["no_trend"] == [] for s in steps)
    forecast = steps[-1]["forecasts"]
    planted = np.arange(2, 12)  # the last 10 steps, fitted on the log scale (k3_kl above 0, an upper bound)
    slope, intercept = np.polyfit(planted, np.log(1e-3 + 2e-3 * planted), 1)
    assert len(forecast) == 1 and forecast[0]["scale"] == "log"
    assert forecast[0]["expected"] == pytest.approx((math.log(0.05) - intercept) / slope, rel=1e-2)  # early: 15
    alerts = [a for e in lines(done.stdout) for a in e["alerts"] if a["kind"] == "forecast"]
    assert [a["key"] for a in alerts] == ["forecast:rollout_corr/k3_kl:above:0.05"]


# ------------------------------------------------------------------------------------------------- 2. MLflow bounds


def test_an_unreachable_mlflow_server_fails_within_the_bounds_in_one_line(tmp_path: Path) -> None:
    """Nothing listens on port 1: MLflow's own retries took some 250 s; within rcdiag's bounds it is seconds."""
    require("mlflow", "tracking")
    started = time.monotonic()
    done = run_capped("analyze", SAMPLE, "--mlflow", "http://127.0.0.1:1", cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("rcdiag: error: cannot write http://127.0.0.1:1: ")
    assert done.stderr.endswith(
        "(bounded by RCDIAG_MLFLOW_REQUEST_TIMEOUT and RCDIAG_MLFLOW_RETRY_LIMIT; docs/dashboards.md)\n"
    )
    assert took < 60, took  # the retry limit (10 s of back-off) and the start-up, on a loaded machine


def test_the_mlflow_bounds_are_mlflows_own_variables_and_a_bad_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rcdiag.export.tracking import mlflow_http_bounds

    for name in (
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER",
        "RCDIAG_MLFLOW_RETRY_LIMIT",
        "RCDIAG_MLFLOW_REQUEST_TIMEOUT",
    ):
        monkeypatch.delenv(name, raising=False)  # fmt: skip
    # back-off 2 * 2**(n-1) s before the n-th retry but the first, + up to 1 s jitter each: 2 retries fit in 10 s
    assert mlflow_http_bounds() == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
    monkeypatch.setenv("RCDIAG_MLFLOW_RETRY_LIMIT", "60")
    assert mlflow_http_bounds()["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "4"  # 4 + 8 + 16 + 4 = 32 <= 60 < 69
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")  # the user's own MLflow setting wins
    assert mlflow_http_bounds() == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    monkeypatch.setenv("RCDIAG_MLFLOW_REQUEST_TIMEOUT", "soon")
    require("mlflow", "tracking")
    done = run_capped("analyze", SAMPLE, "--mlflow", "http://127.0.0.1:1", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "rcdiag: error: the environment variable RCDIAG_MLFLOW_REQUEST_TIMEOUT must be a positive number of seconds, "
        "got 'soon'\n"
    )


@pytest.mark.parametrize("command", ["analyze", "watch"])
def test_a_sqlite_store_in_a_missing_directory_is_refused_creating_nothing(tmp_path: Path, command: str) -> None:
    require("mlflow", "tracking")
    store = tmp_path / "no" / "dir" / "x.db"
    target = SAMPLE if command == "analyze" else tmp_path / "run"
    extra = ["--once", "--state", str(tmp_path / "w.json")] if command == "watch" else []
    done = run_capped(command, target, *extra, "--mlflow", f"sqlite:///{store}", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"rcdiag: error: --mlflow {store}: the directory {store.parent} does not exist.\n"
    assert not (tmp_path / "no").exists() and not (tmp_path / "w.json").exists()
    relative = run_capped("analyze", SAMPLE, "--mlflow", "sqlite:///nodir/x.db", cwd=tmp_path)
    assert relative.returncode == 2
    assert relative.stderr == "rcdiag: error: --mlflow nodir/x.db: the directory nodir does not exist.\n"
    assert not (tmp_path / "nodir").exists()


def test_a_report_goes_to_mlflow_in_whole_batches_not_a_call_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 steps of 19 values each: 4 ``log_batch`` calls (1,000 metrics each at most), not 200; every value is in
    the run as MLflow's own client reads it back."""
    require("mlflow", "tracking")
    require("sqlalchemy", "tracking")
    from mlflow.tracking import MlflowClient

    import rcdiag
    from rcdiag.export.tracking import MLFLOW_BATCH, TrackingOptions, export_report
    from rcdiag.io import synthetic

    dump = tmp_path / "steps.parquet"
    synthetic.write(
        synthetic.generate("healthy", rows=8 * 200, steps=200, seed=7, median_length=20, max_length=40), dump
    )

    report = rcdiag.analyze(dump)
    values = sum(len(s.metrics) + len(s.extras) for s in report.steps)
    calls: list[int] = []
    original = MlflowClient.log_batch

    def counted(self: Any, run_id: str, metrics: Any = (), **kwargs: Any) -> Any:
        calls.append(len(metrics))
        return original(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", counted)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tracker,) = export_report(report, TrackingOptions(mlflow=store), run_name="batched")
    assert calls == [MLFLOW_BATCH] * (values // MLFLOW_BATCH) + (
        [values % MLFLOW_BATCH] if values % MLFLOW_BATCH else []
    )
    client = MlflowClient(tracking_uri=store)
    history = client.get_metric_history(tracker.run_id, "rollout_corr/kl")  # type: ignore[attr-defined]
    assert sorted((m.step, m.value) for m in history) == [(s.step, s.metrics["rollout_corr/kl"]) for s in report.steps]


# ------------------------------------------------------------------------------------------- 3. TensorBoard's runs


def test_a_second_export_into_one_tensorboard_directory_is_a_new_run(tmp_path: Path) -> None:
    """Two analyses into `tb`: the second goes to `tb/run-2` (said in a note), so TensorBoard's reader finds each
    step once in each run; a third goes to `tb/run-3`."""
    require("tensorboard", "tracking")
    board = tmp_path / "tb"
    report = analyze_json(SAMPLE)
    steps = [s["step"] for s in report["steps"]]
    first = run_capped("analyze", SAMPLE, "--tensorboard", board, "-q")
    assert first.returncode == 0 and first.stderr == f"rcdiag: logged {len(steps)} step(s) to TensorBoard {board}\n"
    second = run_capped("analyze", SAMPLE, "--tensorboard", board, "-q")
    assert second.returncode == 0, second.stderr
    assert second.stderr.splitlines() == [
        f"rcdiag: logged {len(steps)} step(s) to TensorBoard {board / 'run-2'}",
        f"rcdiag: note: {board} holds TensorBoard event files already; this run's are in {board / 'run-2'} (one more "
        "run in TensorBoard, so no step has two points; give a new directory to name it yourself)",
    ]
    for directory in (board, board / "run-2"):
        scalars = tensorboard_scalars(directory)
        assert [s for s, _ in scalars["rollout_corr/kl"]] == steps, directory  # each step once
    assert run_capped("analyze", SAMPLE, "--tensorboard", board, "-q").returncode == 0
    assert sorted(p.name for p in board.iterdir() if p.is_dir()) == ["run-2", "run-3"]
    accumulator = require("tensorboard.backend.event_processing.plugin_event_multiplexer", "tracking")
    runs = accumulator.EventMultiplexer().AddRunsFromDirectory(str(board))
    runs.Reload()
    assert sorted(runs.Runs()) == [".", "run-2", "run-3"]


def test_a_restarted_watch_continues_its_tensorboard_run(tmp_path: Path) -> None:
    require("tensorboard", "tracking")
    run, state, board = tmp_path / "run", tmp_path / "watch.json", tmp_path / "tb"
    run.mkdir()
    for step in range(2):
        step_file(run / f"step-{step}.parquet", step, 0.01)
    assert watch_once(run, state, "--tensorboard", str(board)).returncode == 0
    step_file(run / "step-2.parquet", 2, 0.02)
    again = watch_once(run, state, "--tensorboard", str(board))
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert [p.name for p in board.iterdir() if p.is_dir()] == []
    assert [s for s, _ in tensorboard_scalars(board)["rollout_corr/kl"]] == [0, 1, 2]
    fresh = watch_once(run, tmp_path / "other.json", "--tensorboard", str(board))  # another watch: its own run
    assert fresh.returncode == 0 and f"this run's are in {board / 'run-2'}" in fresh.stderr
    assert [s for s, _ in tensorboard_scalars(board / "run-2")["rollout_corr/kl"]] == [0, 1, 2]


# ------------------------------------------------------------------------------------------------------ 5. workers


def test_workers_beyond_what_helps_are_said_once_and_still_started(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for step in range(4):
        step_file(run / f"s{step}.parquet", step, 0.01 * (step + 1))
    one = run_capped("analyze", run, "--format", "json", "--workers", "1")
    two = run_capped("analyze", run, "--format", "json", "--workers", "2")
    assert (one.returncode, one.stderr) == (0, "")
    assert two.returncode == 0 and two.stdout == one.stdout
    said = two.stderr.splitlines()
    assert len(said) == 1 and said[0].startswith("rcdiag: note: --workers 2 starts 2 processes, more than help: ")
    assert said[0].endswith("`--workers auto` would use 1, which is likely faster (docs/scale-out.md)")
    assert "less than 512 MiB to pay for its start" in said[0]


def test_the_workers_note_follows_the_auto_rule(tmp_path: Path) -> None:
    from rcdiag.engine.parallel import MIN_BYTES_PER_WORKER, auto_workers, too_many_workers
    from rcdiag.io import open_dump

    run = tmp_path / "run"
    run.mkdir()
    for step in range(4):
        step_file(run / f"s{step}.parquet", step, 0.01)
    parts = open_dump(str(run)).partitions(4)
    assert len(parts) == 4
    many = too_many_workers(parts, 4, cpus=64)  # cores to spare: only the dump's size speaks
    assert many is not None and "core(s)" not in many and "would use 1" in many
    few = too_many_workers(parts, 4, cpus=2)
    assert few is not None and "2 core(s) here keep 1 process(es) busy" in few
    assert auto_workers(4 * MIN_BYTES_PER_WORKER, 4, 8) == 4  # where auto itself would start them all: no note
    assert too_many_workers(parts[:1], 1, cpus=2) is None
