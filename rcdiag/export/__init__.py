"""Exports of a report's per-step values into the tools users already watch (``tracking``: TensorBoard, MLflow)."""
