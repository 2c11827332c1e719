"""The dashboards' points as the trackers' own code reads them back (TensorBoard's event reader, MLflow's client),
to compare with what rcdiag meant to export."""

from __future__ import annotations

from pathlib import Path

from conftest import require


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard's own reader loads them."""
    accumulator = require("tensorboard.backend.event_processing.event_accumulator", "tracking")
    events = accumulator.EventAccumulator(str(directory), size_guidance={accumulator.SCALARS: 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_metrics(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """key -> [(step, value)] of one run, as MLflow's own client reads them."""
    client = require("mlflow.tracking", "tracking").MlflowClient(tracking_uri=uri)
    keys = client.get_run(run_id).data.metrics
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}
