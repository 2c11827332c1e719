"""``--tensorboard`` and ``--mlflow``: the dashboard flags (one flag group, ``TRACKING_FLAGS``) and the export
after a report is built. The values and the trackers are ``rcdiag.export.tracking``'s."""

from __future__ import annotations

import logging
import sys
from pathlib import PurePath
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rcdiag.cli.params import Flag, FlagGroup
from rcdiag.export.tracking import DEFAULT_EXPERIMENT, MlflowTracker, TensorBoardTracker, TrackingOptions
from rcdiag.io.outputs import writes
from rcdiag.runtime.errors import ConfigError

if TYPE_CHECKING:
    from rcdiag.records.report import Report

PANEL = "Dashboards (TensorBoard, MLflow: verl's tracker backends)"


def _option(flag: str, metavar: str, help_text: str) -> Any:
    return Annotated[
        str | None, typer.Option(flag, metavar=metavar, help=help_text, rich_help_panel=PANEL, show_default=False)
    ]


TRACKING_FLAGS = FlagGroup(
    "tracking",
    (
        Flag("tensorboard", _option("--tensorboard", "DIR", "Also write every step's `rollout_corr/*` and `rcdiag/*` "
             "values as TensorBoard scalars into DIR (created if missing; a dump without steps is step 0). Needs "
             "pip install \"rcdiag[tracking]\".")),
        Flag("mlflow", _option("--mlflow", "URI", "Also log them to the MLflow tracking store at URI "
             "(`sqlite:///mlflow.db`, `http://host:5000`). Needs pip install \"rcdiag[tracking]\".")),
        Flag("mlflow_experiment", _option("--mlflow-experiment", "NAME", "The MLflow experiment of the new run "
             f"(created if missing). Default: {DEFAULT_EXPERIMENT}.")),
        Flag("mlflow_run_name", _option("--mlflow-run-name", "NAME", "The new MLflow run's name. Default: the "
             "dump's file or directory name.")),
        Flag("mlflow_run_id", _option("--mlflow-run-id", "ID", "Log into this existing MLflow run (e.g. verl's own) "
             "instead of a new one.")),
    ),
    lambda values: tracking_options(**values),
)  # fmt: skip
"""The dashboard flags -> ``TrackingOptions`` (``None`` when neither tracker is asked for)."""


def tracking_options(
    tensorboard: str | None,
    mlflow: str | None,
    mlflow_experiment: str | None,
    mlflow_run_name: str | None,
    mlflow_run_id: str | None,
) -> TrackingOptions | None:
    """Checked before the dump is read: the flags fit together and each client library is installed."""
    run_flags = {"--mlflow-experiment": mlflow_experiment, "--mlflow-run-name": mlflow_run_name,
                 "--mlflow-run-id": mlflow_run_id}  # fmt: skip
    given = [flag for flag, value in run_flags.items() if value is not None]
    if mlflow is None and given:
        raise ConfigError(f"{given[0]} says which MLflow run to log to; it needs --mlflow URI")
    if mlflow_run_id is not None and len(given) > 1:
        raise ConfigError(f"--mlflow-run-id logs into an existing run; leave {given[0]} out")
    for flag, value in (("--tensorboard", tensorboard), ("--mlflow", mlflow)):
        if value is not None and (not value.strip() or value.startswith("-")):
            raise ConfigError(f"{flag} was given '{value}': give a {'directory' if flag == '--tensorboard' else 'URI'}")
    if tensorboard is None and mlflow is None:
        return None
    writes(tensorboard, "--tensorboard")  # refused over (or inside) an input: rcdiag.io.outputs.Ledger
    options = TrackingOptions(tensorboard, mlflow, mlflow_experiment or DEFAULT_EXPERIMENT, mlflow_run_name,
                              mlflow_run_id)  # fmt: skip
    options.check()
    return options


def export(report: Report, options: TrackingOptions, path: str) -> None:
    """Log ``report``'s steps to the trackers and say on stderr where they went."""
    from rcdiag.export.tracking import export_report, step_values

    for name in ("mlflow", "alembic"):  # their INFO lines (creating a store's tables) are not rcdiag's output
        logging.getLogger(name).setLevel(logging.WARNING)
    trackers = export_report(report, options, run_name=PurePath(path.rstrip("/")).name or path)
    steps = sum(1 for _ in step_values(report))
    for tracker in trackers:
        if isinstance(tracker, TensorBoardTracker):
            where = f"TensorBoard {tracker.directory}"
        elif isinstance(tracker, MlflowTracker):
            where = f"MLflow {tracker.uri} (run {tracker.run_id})"
        else:
            where = type(tracker).__name__
        print(f"rcdiag: logged {steps} step(s) to {where}", file=sys.stderr)
