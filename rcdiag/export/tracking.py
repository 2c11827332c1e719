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
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rcdiag.io.storage import Timeout
from rcdiag.runtime.errors import ConfigError, OutputError
from rcdiag.runtime.fields import INT64_MAX, INT64_MIN

if TYPE_CHECKING:
    from rcdiag.records.report import Report

INSTALL = "pip install 'rcdiag[tracking]'"
"""What installs both client libraries (pyproject.toml's ``tracking`` extra)."""
MLFLOW_BATCH = 1000
"""MLflow's limit on metrics per ``log_batch`` call."""
DEFAULT_EXPERIMENT = "rcdiag"
MLFLOW_REQUEST_TIMEOUT = Timeout(
    "RCDIAG_MLFLOW_REQUEST_TIMEOUT", 10.0, "MLflow: seconds one request to a tracking server may take"
)
MLFLOW_RETRY_LIMIT = Timeout(
    "RCDIAG_MLFLOW_RETRY_LIMIT", 10.0, "MLflow: seconds of back-off between retries of a failed request, in all"
)
MLFLOW_TIMEOUTS = (MLFLOW_REQUEST_TIMEOUT, MLFLOW_RETRY_LIMIT)
"""The bounds on a tracking server's requests (docs/dashboards.md), in the storage bounds' form
(``rcdiag.io.storage.Timeout``). MLflow's own defaults (120 s a request, 7 retries backing off 2, 4, ... 128 s)
let an unreachable server hold a run for over four minutes before its error."""


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
    files (``tensorboard_log/PROJECT/EXPERIMENT/rcdiag``) shows as one more run in the same charts.

    TensorBoard reads every event file of a directory as one run: a second export into a directory that holds
    event files already would put two points at each step of one chart. So a directory with event files gets a
    new run, ``DIRECTORY/run-N`` (the first N from 2 free of event files), said in a note; ``resume`` (a restarted
    ``rcdiag watch``, which logs only the steps it had not) continues the directory's latest run instead."""

    def __init__(self, directory: str | Path, *, resume: bool = False) -> None:
        require("tensorboard", "--tensorboard", "TensorBoard")
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.asked = Path(directory)
        self.directory = run_directory(self.asked, resume=resume)
        self._event, self._summary = Event, Summary
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.directory), filename_suffix=".rcdiag")
        except OSError as error:
            raise OutputError(self.directory, error.strerror or str(error)) from None
        if self.directory != self.asked:
            from rcdiag.runtime.notices import notify

            notify(
                f"note: {self.asked} holds TensorBoard event files already; this run's are in {self.directory} (one "
                "more run in TensorBoard, so no step has two points; give a new directory to name it yourself)"
            )

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


EVENT_FILES = "*tfevents*"
"""TensorBoard's rule for an event file: ``tfevents`` in its name."""
RUN_PREFIX = "run-"


def has_events(directory: Path) -> bool:
    """``directory`` holds TensorBoard event files itself (those of its subdirectories are other runs)."""
    try:
        return any(entry.is_file() for entry in directory.glob(EVENT_FILES))
    except OSError:
        return False


def run_directory(directory: Path, *, resume: bool = False) -> Path:
    """Where a new run's event file goes: ``directory`` itself when it holds no event file, else the first
    ``directory/run-N`` (N = 2, 3, ...) that holds none; with ``resume``, the latest run that holds some."""
    if not has_events(directory):
        return directory
    number, latest = 2, directory
    while True:
        candidate = directory / f"{RUN_PREFIX}{number}"
        if has_events(candidate):
            latest = candidate
        elif not candidate.exists() or candidate.is_dir():
            return latest if resume else candidate  # missing, or a directory without event files
        number += 1


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
        self._pending: list[Any] = []
        """Metrics logged and not yet sent (``flush``)."""
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
        """Kept until ``flush`` (or a full batch): a ``log_batch`` call costs about the same for one step's values
        as for a thousand (a sqlite store commits once per call), so a whole report goes in a few calls."""
        from mlflow.entities import Metric

        step = tracked_step(step, self.uri)
        now = int(time.time() * 1000)
        self._pending += [Metric(key, _number(value), now, step) for key, value in values.items()]
        if len(self._pending) >= MLFLOW_BATCH:
            self._send(whole_batches=True)

    def flush(self) -> None:
        """Every value logged so far, in the store once this returns (``rcdiag watch`` calls it after each
        step)."""
        self._send(whole_batches=False)

    def _send(self, *, whole_batches: bool) -> None:
        with _store_errors(self.uri):
            while len(self._pending) >= (MLFLOW_BATCH if whole_batches else 1):
                batch, self._pending = self._pending[:MLFLOW_BATCH], self._pending[MLFLOW_BATCH:]
                self._client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.flush()
        if self._owned:
            with _store_errors(self.uri):
                self._client.set_terminated(self.run_id)


def mlflow_http_bounds() -> dict[str, str]:
    """MLflow's own variables for ``MLFLOW_TIMEOUTS``: its request timeout, and as many retries as its back-off
    (``factor * 2**(n-1)`` seconds before the n-th retry but the first, plus up to ``jitter``; urllib3's rule) fits
    in the retry limit. A variable the user set already is left as it is: MLflow's own setting wins."""
    factor = _float_env("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 2.0)
    jitter = _float_env("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", 1.0)
    limit = MLFLOW_RETRY_LIMIT.seconds()
    retries = 0
    while retries < MAX_RETRIES and _backoff(retries + 1, factor, jitter) <= limit:
        retries += 1
    wanted = {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(MLFLOW_REQUEST_TIMEOUT.seconds()))),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
    }
    return {name: value for name, value in wanted.items() if not os.environ.get(name, "").strip()}


MAX_RETRIES = 10
"""The most retries ``mlflow_http_bounds`` asks for, however long the retry limit."""


def _backoff(retries: int, factor: float, jitter: float) -> float:
    """The longest total sleep of ``retries`` retries."""
    return sum(factor * 2 ** (n - 1) for n in range(2, retries + 1)) + retries * jitter


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


@contextlib.contextmanager
def _bounded_requests() -> Iterator[None]:
    """MLflow's request variables set to ``mlflow_http_bounds`` for the calls inside (MLflow reads them at each
    request), then put back: the process's environment is the user's outside rcdiag's own calls."""
    bounds = mlflow_http_bounds()
    saved = {name: os.environ.get(name) for name in bounds}
    os.environ.update(bounds)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _store_errors(uri: str) -> Iterator[None]:
    """An MLflow error (store refused, unreachable, bad run id) as one ``OutputError`` line naming the URI; every
    request inside bounded by ``MLFLOW_TIMEOUTS``."""
    with _bounded_requests():
        try:
            yield
        except (ConfigError, OutputError):
            raise
        except Exception as error:
            message = " ".join(str(getattr(error, "message", None) or error).split()) or type(error).__name__
            if uri.startswith(("http://", "https://")) and any(word in message for word in UNREACHABLE):
                message += f" (bounded by {' and '.join(t.env for t in MLFLOW_TIMEOUTS)}; docs/dashboards.md)"
            raise OutputError(uri, message) from None


UNREACHABLE = ("Max retries exceeded", "timed out", "Timeout")
"""Words of the requests library's errors for a server that did not answer in time or at all."""


SQLITE = "sqlite:///"


def check_store(uri: str) -> None:
    """A sqlite store's file is an output: refused as ``-o`` would refuse it (its directory missing, a directory,
    not writable) before anything is written; MLflow itself would create every missing directory of its path."""
    if not uri.startswith(SQLITE):
        return
    name = uri.removeprefix(SQLITE).partition("?")[0]
    if name and name != ":memory:":
        from rcdiag.io.outputs import check_destination

        check_destination(Path(name), "--mlflow")


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
            check_store(self.mlflow)
            for bound in MLFLOW_TIMEOUTS:
                bound.seconds()  # a bad value is one line before the dump is read

    def open(self, run_name: str | None = None, *, resume: bool = False) -> list[Tracker]:
        """The trackers asked for; ``run_name`` names a new MLflow run unless ``mlflow_run_name`` does; ``resume``:
        TensorBoard continues the directory's latest run (``TensorBoardTracker``)."""
        trackers: list[Tracker] = []
        try:
            if self.tensorboard is not None:
                trackers.append(TensorBoardTracker(self.tensorboard, resume=resume))
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
