"""The sweep's accumulators of one batch (one training step), and of a whole dump (one batch per step).

``SweepState`` is an ``EngineState`` whose batches are ``SweepBatch`` es, so the engine's streaming, step grouping,
state files, workers and merging all carry over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rcdiag.catalogue.metrics import PREFIX
from rcdiag.config import CorrectionConfig
from rcdiag.engine import EngineState, StepKey
from rcdiag.metrics.base import MetricValue, VerlCrash, verl_float
from rcdiag.metrics.batch import empty_batch_crash, prefixed_crash
from rcdiag.metrics.block import Block
from rcdiag.sweep.grid import SweepGrid
from rcdiag.sweep.options import OptionSweep, option_sweep

SWEEP_STATE_VERSION = 1
"""Bumped whenever the sweep's own state (cells, per-threshold parts) changes shape."""


@dataclass(frozen=True)
class PointResult:
    """One option at one threshold on one batch: verl's metrics for that single option, and any crash."""

    metrics: dict[str, MetricValue]
    crashes: tuple[VerlCrash, ...]


class SweepBatch:
    """Every option of the grid over one batch."""

    def __init__(self, grid: SweepGrid) -> None:
        self.grid = grid
        self.sweeps: list[OptionSweep] = [option_sweep(option, thresholds) for option, thresholds in grid.options]
        self.rows = 0
        self.valid_tokens = 0
        self.empty_rows = 0

    def update(self, block: Block) -> None:
        self.rows += block.n_rows
        self.valid_tokens += block.n_tokens
        self.empty_rows += block.n_rows - block.n_valid_rows
        for sweep in self.sweeps:
            sweep.update(block)

    def merge(self, other: SweepBatch) -> SweepBatch:
        if self.grid.specs() != other.grid.specs():
            raise ValueError("cannot merge sweeps over different grids")
        for mine, theirs in zip(self.sweeps, other.sweeps, strict=True):
            mine.merge(theirs)
        self.rows += other.rows
        self.valid_tokens += other.valid_tokens
        self.empty_rows += other.empty_rows
        return self

    def compute(self) -> dict[tuple[str, str], PointResult]:
        """(option, threshold spec) -> the point's result, in grid order."""
        out: dict[tuple[str, str], PointResult] = {}
        for sweep in self.sweeps:
            for index, threshold in enumerate(sweep.thresholds):
                values, crashes = sweep.compute(index, self.rows)
                if self.valid_tokens == 0:
                    crashes = [empty_batch_crash()]
                out[sweep.option, threshold.spec] = PointResult(
                    {PREFIX + key: _finite(value) for key, value in values.items()},
                    tuple(prefixed_crash(crash) for crash in crashes),
                )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "valid_tokens": self.valid_tokens,
            "empty_rows": self.empty_rows,
            "options": [sweep.state_dict() for sweep in self.sweeps],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for sweep, saved in zip(self.sweeps, state["options"], strict=True):
            sweep.load_state_dict(saved)
        self.rows = int(state["rows"])
        self.valid_tokens = int(state["valid_tokens"])
        self.empty_rows = int(state["empty_rows"])


@dataclass
class SweepState(EngineState):
    """An engine state whose batches are sweeps over ``grid``."""

    grid: SweepGrid = field(default_factory=lambda: SweepGrid(()))
    cpu_block_tokens: ClassVar[int] = 1 << 19
    """Larger blocks than analyze's: each block runs ~130 accumulators' per-row work, whose Python overhead
    a 512k-token block spreads thinner."""

    def batch(self, step: StepKey) -> SweepBatch:  # type: ignore[override]
        batch = self.batches.get(step)
        if batch is None:
            batch = self.batches[step] = SweepBatch(self.grid)  # type: ignore[assignment]
        return batch  # type: ignore[return-value]

    def pooled(self) -> SweepBatch:  # type: ignore[override]
        pooled = SweepBatch(self.grid)
        for batch in self.batches.values():
            pooled.merge(batch)  # type: ignore[arg-type]
        return pooled

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "grid": self.grid.specs(), "sweep_version": SWEEP_STATE_VERSION}

    @classmethod
    def from_state_dict(cls, resolved: Any, state: dict[str, Any]) -> SweepState:
        if state.get("sweep_version") != SWEEP_STATE_VERSION:
            raise ValueError(
                f"sweep state version {state.get('sweep_version')}, this rcdiag reads {SWEEP_STATE_VERSION}"
            )
        out = cls(
            resolved,
            rows=int(state["rows"]),
            tokens=int(state["tokens"]),
            valid_tokens=int(state["valid_tokens"]),
            grid=SweepGrid.from_specs(state["grid"]),
        )
        for step, batch_state in state["batches"]:
            out.batch(None if step is None else int(step)).load_state_dict(batch_state)
        return out


def new_sweep_state(grid: SweepGrid) -> SweepState:
    """An empty sweep state (the engine's configuration is verl's metrics-only default; the grid is separate)."""
    return SweepState(CorrectionConfig().resolve(), grid=grid)


def _finite(value: MetricValue) -> MetricValue:
    value = verl_float(value)
    return value if value is not None and abs(value) != float("inf") and value == value else None
