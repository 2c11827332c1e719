"""``analyze --tensorboard`` and ``--mlflow``: every step's values, read back with TensorBoard's own reader and
MLflow's own client, equal the report's (``Report.steps``; step 0 for a dump without steps)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, SAMPLES, one_line_error, require, run, write_dump
from tracking_readers import mlflow_metrics, tensorboard_scalars

from rcdiag.export.tracking import MlflowTracker, TensorBoardTracker, TrackingOptions, export_report, step_values
from rcdiag.records.report import Report

SAMPLE = SAMPLES / "step_trend.parquet"


def expected(report: dict[str, Any], *, float32: bool = False) -> dict[str, list[tuple[int, float]]]:
    """key -> [(step, value)] from a JSON report's steps (NaN for a non-finite value, ``null``)."""
    steps = report["steps"] or [{"step": 0, "metrics": report["metrics"], "extras": report["extras"]}]
    out: dict[str, list[tuple[int, float]]] = {}
    for step in steps:
        for key, value in {**step["metrics"], **step["extras"]}.items():
            number = math.nan if value is None else value
            out.setdefault(key, []).append((step["step"], float(np.float32(number)) if float32 else number))
    return out


def same(got: dict[str, list[tuple[int, float]]], want: dict[str, list[tuple[int, float]]]) -> None:
    """Same keys, steps and values (NaN equals NaN), exactly."""
    assert sorted(got) == sorted(want)
    for key, points in want.items():
        assert [s for s, _ in got[key]] == [s for s, _ in points], key
        for (_, a), (_, b) in zip(got[key], points, strict=True):
            assert a == b or (math.isnan(a) and math.isnan(b)), (key, a, b)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite MLflow store for the module (creating its tables takes seconds)."""
    require("mlflow", "tracking")
    require("sqlalchemy", "tracking")
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_analyze_exports_every_step_to_tensorboard_and_mlflow(tmp_path: Path, store: str) -> None:
    """The real process: both trackers in one run, read back with each project's own reader."""
    board = tmp_path / "tb" / "rcdiag"
    result = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLE), "--tensorboard", str(board), "--mlflow", store,
         "--mlflow-experiment", "rc-tests", "--format", "json", "-o", str(tmp_path / "r.json")],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["steps"]) == 6
    lines = result.stderr.splitlines()
    assert lines[0] == f"rcdiag: logged 6 step(s) to TensorBoard {board}"
    assert lines[1].startswith(f"rcdiag: logged 6 step(s) to MLflow {store} (run ")
    assert "INFO" not in result.stderr
    keys = {*report["steps"][0]["metrics"], *report["steps"][0]["extras"]}
    assert "rollout_corr/kl" in keys and "rcdiag/abs_log_ratio_mean" in keys

    # TensorBoard keeps a scalar as float32, as verl's own SummaryWriter.add_scalar does
    same(tensorboard_scalars(board), expected(report, float32=True))

    run_id = lines[1].rsplit("(run ", 1)[1].rstrip(")")
    client = require("mlflow.tracking", "tracking").MlflowClient(tracking_uri=store)
    info = client.get_run(run_id).info
    assert info.run_name == SAMPLE.name and info.status == "FINISHED"
    assert client.get_experiment(info.experiment_id).name == "rc-tests"
    same(mlflow_metrics(store, run_id), expected(report))


def test_a_dump_without_steps_is_step_0_with_the_pooled_values(
    capsys: pytest.CaptureFixture, tmp_path: Path, store: str
) -> None:
    dump = write_dump(
        tmp_path / "flat.parquet",
        {"old_log_prob": [[-0.5, -1.0, -0.2], [-0.3, -2.0]], "rollout_log_prob": [[-0.6, -0.9, -0.2], [-0.35, -1.5]],
         "response_mask": [[1, 1, 1], [1, 1]]},
    )  # fmt: skip
    code, _, err = run(capsys, "analyze", str(dump), "--tensorboard", str(tmp_path / "tb"), "--mlflow", store,
                       "--mlflow-run-name", "flat", "--format", "json", "-o", str(tmp_path / "r.json"))  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps"] == []
    want = expected(report)
    assert {steps[0][0] for steps in want.values()} == {0}
    same(tensorboard_scalars(tmp_path / "tb"), expected(report, float32=True))
    run_id = err.splitlines()[1].rsplit("(run ", 1)[1].rstrip(")")
    same(mlflow_metrics(store, run_id), want)


def test_an_existing_run_gets_the_values_and_is_left_running(
    capsys: pytest.CaptureFixture, tmp_path: Path, store: str
) -> None:
    """--mlflow-run-id: beside a trainer's own run (as verl attaches to MLFLOW_RUN_ID)."""
    client = require("mlflow.tracking", "tracking").MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("trainer")
    trainer_run = client.create_run(experiment, run_name="verl").info.run_id
    client.log_metric(trainer_run, "actor/entropy", 0.5, step=1)
    code, _, err = run(capsys, "analyze", str(SAMPLE), "--mlflow", store, "--mlflow-run-id", trainer_run,
                       "--format", "json", "-o", str(tmp_path / "r.json"))  # fmt: skip
    assert code == 0, err
    assert f"(run {trainer_run})" in err
    report = json.loads((tmp_path / "r.json").read_text())
    got = mlflow_metrics(store, trainer_run)
    assert got.pop("actor/entropy") == [(1, 0.5)]
    same(got, expected(report))
    assert client.get_run(trainer_run).info.status == "RUNNING"


def test_the_tracker_interface_logs_steps_one_at_a_time_and_nan_for_none(tmp_path: Path, store: str) -> None:
    """What ``rcdiag watch`` calls per step: a non-finite value (``None``) is NaN in both trackers, never left
    out."""
    values = [(3, {"rollout_corr/kl": 0.25, "rcdiag/x": None}), (4, {"rollout_corr/kl": 1e-7, "rcdiag/x": 2.0})]
    board = TensorBoardTracker(tmp_path / "tb")
    flow = MlflowTracker(store, experiment="interface", run_name="steps")
    for step, row in values:
        board.log_step(step, row)
        flow.log_step(step, row)
    board.close()
    flow.close()
    want = {"rollout_corr/kl": [(3, 0.25), (4, 1e-7)], "rcdiag/x": [(3, math.nan), (4, 2.0)]}
    same(mlflow_metrics(store, flow.run_id), want)
    same(tensorboard_scalars(tmp_path / "tb"),
         {k: [(s, float(np.float32(v))) for s, v in p] for k, p in want.items()})  # fmt: skip


def test_step_values_are_the_report_steps(tmp_path: Path) -> None:
    import rcdiag

    report: Report = rcdiag.analyze(str(SAMPLE))
    rows = list(step_values(report))
    assert [s for s, _ in rows] == [s.step for s in report.steps]
    assert all(v == {**s.metrics, **s.extras} for (_, v), s in zip(rows, report.steps, strict=True))
    trackers = export_report(report, TrackingOptions(tensorboard=str(tmp_path / "tb")))
    assert [type(t) for t in trackers] == [TensorBoardTracker]
    assert sorted(tensorboard_scalars(tmp_path / "tb")) == sorted({**report.metrics, **report.extras})


@pytest.mark.parametrize(("module", "flag", "what"), [("tensorboard", "--tensorboard", "TensorBoard"),
                                                      ("mlflow", "--mlflow", "MLflow")])  # fmt: skip
def test_without_the_library_one_line_names_the_extra(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str, flag: str, what: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError, as when not installed
    err = one_line_error(capsys, "analyze", str(SAMPLE), flag, str(tmp_path / "x"))
    assert err == f"rcdiag: error: {flag} needs {what}, which is not installed: pip install 'rcdiag[tracking]'\n"
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mlflow-run-name", "a"], "--mlflow-run-name says which MLflow run to log to; it needs --mlflow URI"),
        (["--mlflow", "sqlite:///m.db", "--mlflow-run-name", "a", "--mlflow-run-id", "b"],
         "--mlflow-run-id logs into an existing run; leave --mlflow-run-name out"),
        (["--tensorboard", ""], "--tensorboard was given '': give a directory"),
    ],
)  # fmt: skip
def test_flags_that_do_not_fit_are_one_line(capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    assert one_line_error(capsys, "analyze", str(SAMPLE), *args) == f"rcdiag: error: {message}\n"


def test_a_store_mlflow_refuses_is_one_line_naming_the_uri(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """MLflow's file store refuses unless MLFLOW_ALLOW_FILE_STORE=true: its reason, on one line, exit 2."""
    require("mlflow", "tracking")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    err = one_line_error(capsys, "analyze", str(SAMPLE), "--mlflow", uri)
    assert err.startswith(f"rcdiag: error: cannot write {uri}: ") and "MLFLOW_ALLOW_FILE_STORE=true" in err


def test_an_event_directory_inside_the_dump_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """The event file would become a file of the dump the next analysis reads."""
    require("tensorboard", "tracking")
    dump = tmp_path / "dump"
    dump.mkdir()
    write_dump(dump / "part.parquet", {"old_log_prob": [[-0.5]], "rollout_log_prob": [[-0.4]]})
    err = one_line_error(capsys, "analyze", str(dump), "--tensorboard", str(dump / "tb"))
    assert err.startswith(f"rcdiag: error: --tensorboard {dump / 'tb'} is inside the input directory {dump}")
    assert not (dump / "tb").exists()


def _stepped_directory(directory: Path, steps: int) -> Path:
    """A run's dump directory as DumpWriter leaves it: one file per step."""
    from rcdiag.io import synthetic
    from rcdiag.io.dump_writer import DumpWriter

    table = synthetic.generate("healthy", rows=8 * steps, steps=steps, seed=7, median_length=20, max_length=40)
    writer = DumpWriter(directory)
    for step in range(steps):
        rows = [i for i, s in enumerate(table.column("step").to_pylist()) if s == step]
        part = table.take(rows)
        writer.write(
            step=step,
            old_log_prob=[np.asarray(v, np.float32) for v in part.column("old_log_prob").to_pylist()],
            rollout_log_prob=[np.asarray(v, np.float32) for v in part.column("rollout_log_prob").to_pylist()],
            response_mask=[np.asarray(v, np.int8) for v in part.column("response_mask").to_pylist()],
        )
    return directory


def test_watch_logs_each_step_to_tensorboard_and_mlflow_as_analyze_reports_it(tmp_path: Path, store: str) -> None:
    """The same flags on `rcdiag watch`: every step once, with the values `analyze` gives on the finished run."""
    dump = _stepped_directory(tmp_path / "run", 4)
    board = tmp_path / "tb"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    watched = subprocess.run(
        [sys.executable, "-m", "rcdiag", "watch", str(dump), "--once", "--settle", "0", "--format", "json",
         "--state", str(tmp_path / "watch.json"), "--tensorboard", str(board), "--mlflow", store,
         "--mlflow-run-name", "watched"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert watched.returncode == 0, watched.stderr
    analyzed = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(dump), "--format", "json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    report = json.loads(analyzed.stdout)
    assert [s["step"] for s in report["steps"]] == [0, 1, 2, 3]
    same(tensorboard_scalars(board), expected(report, float32=True))
    client = require("mlflow.tracking", "tracking").MlflowClient(tracking_uri=store)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], filter_string="attributes.run_name = 'watched'"
    )
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    same(mlflow_metrics(store, runs[0].info.run_id), expected(report))


def test_watch_refuses_an_event_directory_inside_the_watched_one(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    require("tensorboard", "tracking")
    dump = _stepped_directory(tmp_path / "run", 1)
    err = one_line_error(capsys, "watch", str(dump), "--once", "--tensorboard", str(dump / "tb"))
    assert err.startswith(f"rcdiag: error: --tensorboard {dump / 'tb'} is inside the input directory {dump}")
    assert not (dump / "tb").exists()
