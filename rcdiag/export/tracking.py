"""Per-step values into the trackers verl itself logs to: TensorBoard event files and MLflow runs.

The key names are verl's (``rollout_corr/kl``) and rcdiag's own (``rcdiag/abs_log_ratio_mean``), so a chart of
verl's run and rcdiag's export of it overlay. Each tracker is written with its project's own client library
(TensorBoard's event writer, ``MlflowClient``), installed with the ``tracking`` extra. ``Tracker`` is the small
interface a caller that produces steps one at a time (``rcdiag watch``) uses: ``log_step`` per step, ``close``
at the end. A value that is not finite (``None`` in a report) is logged as NaN: the step shows a gap in the
chart instead of silently lacking the key.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rcdiag.errors import ConfigError, OutputError
from rcdiag.fields import INT64_MAX, INT64_MIN

if TYPE_CHECKING:
    from rcdiag.report import Report

INSTALL = "pip install 'rcdiag[tracking]'"
"""What installs both client libraries (pyproject.toml's ``tracking`` extra)."""
MLFLOW_BATCH = 1000
"""MLflow's limit on metrics per ``log_batch`` call."""
DEFAULT_EXPERIMENT = "rcdiag"


class Tracker(Protocol):
    """Where per-step values go. ``values`` maps verl's and rcdiag's key names to a float, ``None`` if not
    finite."""

    def log_step(self, step: int, values: Mapping[str, float | None]) -> None: ...

    def flush(self) -> None:
        """Make what was logged visible now (``rcdiag watch`` calls it after each step)."""

    def close(self) -> None: ...


def require(module: str, flag: str, what: str) -> Any:
    """Import a tracker's client library, or a ``ConfigError`` naming the flag and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{flag} needs {what}, which is not installed: {INSTALL}") from None


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def tracked_step(step: int, target: object) -> int:
    """``step`` as the trackers store it: TensorBoard's event and MLflow's metric keep an int64 step, so a step
    beyond it (a uint64 step of 2**63 or more) is refused naming the target, never wrapped to a negative one."""
    if not INT64_MIN <= step <= INT64_MAX:
        raise OutputError(
            target,
            f"step {step} is beyond int64, the type of a tracker's step (TensorBoard, MLflow), so it cannot be "
            "logged exactly; renumber the steps, or leave out --tensorboard/--mlflow",
        )
    return step


class TensorBoardTracker:
    """Scalars in a TensorBoard event file in ``directory`` (created if missing), as verl's own tracker writes
    them (``add_scalar``: a float32 ``simple_value`` per key and step). A directory beside the run's own event
    files (``tensorboard_log/PROJECT/EXPERIMENT/rcdiag``) shows as one more run in the same charts."""

    def __init__(self, directory: str | Path) -> None:
        require("tensorboard", "--tensorboard", "TensorBoard")
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.directory = Path(directory)
        self._event, self._summary = Event, Summary
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.directory), filename_suffix=".rcdiag")
        except OSError as error:
            raise OutputError(self.directory, error.strerror or str(error)) from None

    def log_step(self, step: int, values: Mapping[str, float | None]) -> None:
        scalars = [self._summary.Value(tag=key, simple_value=_number(value)) for key, value in values.items()]
        step = tracked_step(step, self.directory)
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=scalars)))

    def flush(self) -> None:
        try:
            self._writer.flush()
        except OSError as error:
            raise OutputError(self.directory, error.strerror or str(error)) from None

    def close(self) -> None:
        try:
            self._writer.close()
        except OSError as error:
            raise OutputError(self.directory, error.strerror or str(error)) from None


class MlflowTracker:
    """Metrics of one MLflow run in the tracking store at ``uri`` (``sqlite:///mlflow.db``, ``http://host:5000``,
    ``databricks``...): a new run named ``run_name`` in ``experiment`` (created if missing), or, with ``run_id``,
    an existing run (verl's own, as verl attaches to ``MLFLOW_RUN_ID``), which is left running."""

    def __init__(
        self, uri: str, *, experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None, run_id: str | None = None
    ) -> None:
        require("mlflow", "--mlflow", "MLflow")
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self._owned = run_id is None
        with _store_errors(uri):
            self._client = MlflowClient(tracking_uri=uri)
            if run_id is not None:
                self.run_id = self._client.get_run(run_id).info.run_id
                return
            found = self._client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self._client.create_experiment(experiment)
            run = self._client.create_run(experiment_id, run_name=run_name, tags={"rcdiag.export": "rcdiag"})
            self.run_id = run.info.run_id

    def log_step(self, step: int, values: Mapping[str, float | None]) -> None:
        from mlflow.entities import Metric

        step = tracked_step(step, self.uri)
        now = int(time.time() * 1000)
        metrics = [Metric(key, _number(value), now, step) for key, value in values.items()]
        with _store_errors(self.uri):
            for start in range(0, len(metrics), MLFLOW_BATCH):
                self._client.log_batch(self.run_id, metrics=metrics[start : start + MLFLOW_BATCH])

    def flush(self) -> None:
        """Nothing to do: ``log_batch`` returns once the store has the values."""

    def close(self) -> None:
        if self._owned:
            with _store_errors(self.uri):
                self._client.set_terminated(self.run_id)


@contextlib.contextmanager
def _store_errors(uri: str) -> Iterator[None]:
    """An MLflow error (store refused, unreachable, bad run id) as one ``OutputError`` line naming the URI."""
    try:
        yield
    except (ConfigError, OutputError):
        raise
    except Exception as error:
        message = " ".join(str(getattr(error, "message", None) or error).split()) or type(error).__name__
        raise OutputError(uri, message) from None


@dataclass(frozen=True)
class TrackingOptions:
    """Where to export per-step values (``--tensorboard``, ``--mlflow`` and its run options)."""

    tensorboard: str | None = None
    mlflow: str | None = None
    mlflow_experiment: str = DEFAULT_EXPERIMENT
    mlflow_run_name: str | None = None
    mlflow_run_id: str | None = None

    def check(self) -> None:
        """Before any file is read: each asked-for client library is installed (else ``ConfigError``)."""
        if self.tensorboard is not None:
            require("tensorboard", "--tensorboard", "TensorBoard")
        if self.mlflow is not None:
            require("mlflow", "--mlflow", "MLflow")

    def open(self, run_name: str | None = None) -> list[Tracker]:
        """The trackers asked for; ``run_name`` names a new MLflow run unless ``mlflow_run_name`` does."""
        trackers: list[Tracker] = []
        try:
            if self.tensorboard is not None:
                trackers.append(TensorBoardTracker(self.tensorboard))
            if self.mlflow is not None:
                trackers.append(
                    MlflowTracker(
                        self.mlflow,
                        experiment=self.mlflow_experiment,
                        run_name=self.mlflow_run_name or run_name,
                        run_id=self.mlflow_run_id,
                    )
                )
        except BaseException:
            close_all(trackers, quietly=True)
            raise
        return trackers


def close_all(trackers: list[Tracker], *, quietly: bool = False) -> None:
    """Close every tracker; ``quietly`` (already failing): an error closing one does not hide the first."""
    for tracker in trackers:
        if quietly:
            with contextlib.suppress(Exception):
                tracker.close()
        else:
            tracker.close()


def step_values(report: Report) -> Iterator[tuple[int, dict[str, float | None]]]:
    """Each step's ``rollout_corr/*`` metrics and ``rcdiag/*`` extras, in step order; a dump without steps is
    one step, 0, holding the pooled values."""
    if not report.steps:
        yield 0, {**report.metrics, **report.extras}
        return
    for step in report.steps:
        yield step.step, {**step.metrics, **step.extras}


def export_report(report: Report, options: TrackingOptions, *, run_name: str | None = None) -> list[Tracker]:
    """Log every step of ``report`` to each tracker of ``options`` and close them; returns the trackers. Every
    step is checked to fit a tracker's before any tracker is opened: a refused export leaves nothing behind."""
    for step, _ in step_values(report):
        tracked_step(step, options.tensorboard or options.mlflow)
    trackers = options.open(run_name)
    try:
        for step, values in step_values(report):
            for tracker in trackers:
                tracker.log_step(step, values)
    except BaseException:
        close_all(trackers, quietly=True)
        raise
    close_all(trackers)
    return trackers
