"""The sweep's accumulators of one batch (one training step), and of a whole dump (one batch per step).

``SweepState`` is an ``EngineState`` whose batches are ``SweepBatch`` es, so the engine's streaming, step grouping,
state files, workers and merging all carry over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import PREFIX
from rcdiag.config import CorrectionConfig
from rcdiag.core.limits import finite_f32
from rcdiag.engine import EngineState, StepKey, load_batches, saved_counts
from rcdiag.fields import checked, integer, real
from rcdiag.kernels import sweep_encoding
from rcdiag.metrics.base import MetricValue, VerlCrash
from rcdiag.metrics.batch import empty_batch_crash, prefixed_crash
from rcdiag.metrics.block import Block
from rcdiag.sweep.cells import NO_EDGES, TokenScan
from rcdiag.sweep.collector import Collector
from rcdiag.sweep.grid import SweepGrid
from rcdiag.sweep.options import OptionSweep, RSSweep, SequenceRSSweep, TokenRSSweep, option_sweep
from rcdiag.versions import verl_version


def sweep_layout() -> dict[str, Any]:
    """What the sweep's own state means beyond the engine's accumulators: the kernel's buckets and histogram
    modes, and the counts each RS option keeps per threshold; for the one state layout hash
    (``rcdiag.state.state_layout``)."""
    counts = {cls.__name__: list(cls._counts) for cls in (RSSweep, SequenceRSSweep, TokenRSSweep)}
    return {"kernel": sweep_encoding.layout(), "counts": counts}


@dataclass(frozen=True)
class PointResult:
    """One option at one threshold on one batch: verl's metrics for that single option, and any crash."""

    metrics: dict[str, MetricValue]
    crashes: tuple[VerlCrash, ...]


class SweepBatch:
    """Every option of the grid over one batch."""

    def __init__(self, grid: SweepGrid, collector: Collector | None = None) -> None:
        self.grid = grid
        self.collector = collector
        """The state's pooled collector for recommendations (fed every block; not this batch's to merge)."""
        version = verl_version(grid.verl_version)
        self.sweeps: list[OptionSweep] = [
            option_sweep(option, thresholds, version) for option, thresholds in grid.options
        ]
        self.rows = 0
        self.valid_tokens = 0
        self.empty_rows = 0

    def update(self, block: Block) -> None:
        self.rows += block.n_rows
        self.valid_tokens += block.n_tokens
        self.empty_rows += block.n_rows - block.n_valid_rows
        scans = self._scans(block)
        for sweep in self.sweeps:
            sweep.update(block, scans.get(sweep.statistic) if sweep.statistic else None)
        if self.collector is not None:
            self.collector.update(block, scans)

    def _scans(self, block: Block) -> dict[str, TokenScan]:
        """One pass over each per-token statistic that a token option or the collector needs: the sweep's cells
        (per row for token IS) and the collector's histogram together."""
        b = block.b
        histograms = self.collector.histograms if self.collector is not None else {}
        cells = {sweep.statistic: sweep.cells for sweep in self.sweeps if sweep.statistic and sweep.cells}
        scans = {}
        lengths = b.to_numpy(block.row_len).astype(np.int64)
        for statistic in dict.fromkeys([*cells, *histograms]):
            ratio = statistic == "ratio"
            values = b.to_numpy(block.ratio if ratio else _statistic(block, statistic))
            found = cells.get(statistic, NO_EDGES).scan(
                values, lengths, ratio and statistic in cells, histograms.get(statistic), nan_values=ratio
            )
            scans[statistic] = found
        return scans

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
                    {PREFIX + key: finite_f32(value) for key, value in values.items()},
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
        self.rows = integer(state["rows"], "rows")
        self.valid_tokens = integer(state["valid_tokens"], "valid_tokens")
        self.empty_rows = integer(state["empty_rows"], "empty_rows")


def _statistic(block: Block, estimator: str) -> Any:
    """The block's k statistic; k1 as the negated clamped log-ratio the block already holds (its definition),
    so no k1 array is built for the sweep alone."""
    return -block.lr_safe if estimator == "k1" else block.k(estimator)  # type: ignore[arg-type]


@dataclass
class SweepState(EngineState):
    """An engine state whose batches are sweeps over ``grid``."""

    grid: SweepGrid = field(default_factory=lambda: SweepGrid(()))
    collector: Collector | None = None
    """Pooled over steps: what the recommendations need (``None``: no recommendations)."""
    target_reject: float | None = None
    """The share the recommendations aim at (kept in state files, so a merge recommends as the run would)."""
    cpu_block_tokens: ClassVar[int] = 1 << 20
    """Larger blocks than analyze's: each block runs every option's per-threshold work (~140 thresholds), whose
    Python overhead a 1M-token block (the default chunk) spreads thinner; the per-token work is in compiled
    passes, which do not mind the size (measured 34-37 ns a token at 1M, 36-40 at 256k)."""

    def batch(self, step: StepKey) -> SweepBatch:  # type: ignore[override]
        batch = self.batches.get(step)
        if batch is None:
            batch = self.batches[step] = SweepBatch(self.grid, self.collector)  # type: ignore[assignment]
        return batch  # type: ignore[return-value]

    def pooled(self) -> SweepBatch:  # type: ignore[override]
        pooled = SweepBatch(self.grid)
        for batch in self.batches.values():
            pooled.merge(batch)  # type: ignore[arg-type]
        return pooled

    def merge(self, other: EngineState) -> SweepState:
        assert isinstance(other, SweepState)
        if self.grid.specs() != other.grid.specs():
            raise ValueError("cannot merge sweeps over different grids")
        super().merge(other)
        if self.collector is not None and other.collector is not None:
            self.collector.merge(other.collector)
        else:  # recommendations need every part's collector
            self.collector = None
        return self

    def state_dict(self) -> dict[str, Any]:
        collector = None if self.collector is None else self.collector.state_dict()
        return {
            **super().state_dict(),
            "grid": self.grid.specs(),
            "collector": collector,
            "target_reject": self.target_reject,
        }

    @classmethod
    def from_state_dict(cls, resolved: Any, state: dict[str, Any]) -> SweepState:
        grid = checked(state["grid"], dict[str, list[str]], "state.grid")
        out = cls(resolved, **saved_counts(state), grid=SweepGrid.from_specs(grid, resolved.version.name))
        target = state.get("target_reject")
        out.target_reject = None if target is None else real(target, "state.target_reject", nonnegative=True)
        if state.get("collector") is not None:
            out.collector = Collector([option for option, _ in out.grid.options])
            out.collector.load_state_dict(state["collector"])
        load_batches(out, state)
        return out


def new_sweep_state(grid: SweepGrid, target_reject: float | None = None) -> SweepState:
    """An empty sweep state (the engine's configuration is verl's metrics-only default; the grid is separate);
    with ``target_reject``, it also collects what the recommendations need."""
    collector = Collector([option for option, _ in grid.options]) if target_reject is not None else None
    resolved = CorrectionConfig(verl_version=grid.verl_version).resolve()
    return SweepState(resolved, grid=grid, collector=collector, target_reject=target_reject)
