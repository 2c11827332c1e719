"""The sweep's accumulators of one batch (one training step), and of a whole dump (one batch per step).

``SweepState`` is a ``StepStates`` whose batches are ``SweepBatch`` es, so the engine's streaming, step grouping,
state files, workers and merging all carry over unchanged; every state in it is an accumulator's
(``rcdiag.metrics.base``), saved and checked as ``rcdiag analyze``'s are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rcdiag.catalogue.metrics import PREFIX
from rcdiag.core.limits import finite_f32
from rcdiag.engine.stream import EngineState, StepStates, WholeDumpKinds, load_batches, load_whole_dump, saved_counts
from rcdiag.kernels import sweep_encoding
from rcdiag.metrics.base import Accumulator, MetricValue, VerlCrash
from rcdiag.metrics.batch import BatchMetrics, GroupedBatch, empty_batch_crash, prefixed_crash
from rcdiag.metrics.block import Block
from rcdiag.runtime.fields import checked, real
from rcdiag.settings.correction import CorrectionConfig, ResolvedConfig
from rcdiag.settings.versions import verl_version
from rcdiag.sweep.cells import Passes
from rcdiag.sweep.collector import Collector
from rcdiag.sweep.grid import SweepGrid
from rcdiag.sweep.option_sweeps import OptionSweep, option_sweep


def sweep_layout() -> dict[str, Any]:
    """What the sweep's own state means beyond its accumulators' declared states (which the layout hash reads with
    every other accumulator's): the kernel's buckets and histogram modes; for the one state layout hash
    (``rcdiag.engine.state_files.state_layout``)."""
    return {"kernel": sweep_encoding.layout(), "batch": SweepBatch.LAYOUT}


@dataclass(frozen=True, slots=True)
class PointResult:
    """One option at one threshold on one batch: verl's metrics for that single option, and any crash. Slotted: a
    report's build holds one per point of every step (135 a step by default)."""

    metrics: dict[str, MetricValue]
    crashes: tuple[VerlCrash, ...]


class SweepBatch(GroupedBatch):
    """Every option of the grid over one batch, and analyze's own metrics of it (``analysis``: verl's metrics-only
    default, what the verdict reads, less verl's ``training/*`` debug metrics, which no rule reads): their
    accumulators (``groups``), fed, merged and saved as ``BatchMetrics``' are."""

    LAYOUT: ClassVar[str] = "analysis without debug, then each option"
    """What ``groups`` holds, in order (in the state layout hash: a sweep state saved without ``analysis`` is
    refused, never read into the wrong groups)."""

    def __init__(
        self,
        grid: SweepGrid,
        passes: Passes,
        collector: Collector | None = None,
        resolved: ResolvedConfig | None = None,
    ) -> None:
        super().__init__()
        self.grid = grid
        self.analysis = BatchMetrics(
            resolved or CorrectionConfig(verl_version=grid.verl_version).resolve(), debug=False
        )
        self.collector = collector
        """The state's pooled collector for recommendations (fed every block; not this batch's to merge)."""
        version = verl_version(grid.verl_version)
        self.sweeps: list[OptionSweep] = [
            option_sweep(option, thresholds, version, passes) for option, thresholds in grid.options
        ]

    def groups(self) -> list[Accumulator]:
        """Every accumulator holding this batch's state: analyze's, then option by option in grid order."""
        return [*self.analysis.groups(), *(part for sweep in self.sweeps for part in sweep.parts())]

    def analyzed(self) -> BatchMetrics:
        """This batch's analyze metrics, with the batch's counts (the groups were fed through this batch)."""
        self.analysis.rows, self.analysis.valid_tokens = self.rows, self.valid_tokens
        self.analysis.empty_rows = self.empty_rows
        return self.analysis

    def update(self, block: Block) -> None:
        super().update(block)
        if self.collector is not None:
            self.collector.update(block)

    def merge(self, other: SweepBatch) -> SweepBatch:
        if self.grid.specs() != other.grid.specs():
            raise ValueError("cannot merge sweeps over different grids")
        self.merge_state(other)
        return self

    def compute(self) -> dict[tuple[str, str], PointResult]:
        """(option, threshold spec) -> the point's result, in grid order."""
        out: dict[tuple[str, str], PointResult] = {}
        for sweep in self.sweeps:
            for index, threshold in enumerate(sweep.thresholds):
                values, crashes = sweep.compute_at(index, self.rows)
                if self.valid_tokens == 0:
                    crashes = [empty_batch_crash()]
                out[sweep.option, threshold.spec] = PointResult(
                    {_shown(key): finite_f32(value) for key, value in values.items()},
                    tuple(prefixed_crash(crash) for crash in crashes),
                )
            sweep.release()
        return out


@functools.cache
def _shown(key: str) -> str:
    """A metric's key as shown (``rollout_corr/...``), made once: a report holds it for every point of every step."""
    return PREFIX + key


@dataclass
class SweepState(StepStates[SweepBatch]):
    """An engine state whose batches are sweeps over ``grid``."""

    KIND: ClassVar[str] = "sweep"

    grid: SweepGrid = field(default_factory=lambda: SweepGrid(()))
    collector: Collector | None = None
    """Pooled over steps: what the recommendations need (``None``: no recommendations)."""
    target_reject: float | None = None
    """The share the recommendations aim at (kept in state files, so a merge recommends as the run would)."""
    passes: Passes = field(default_factory=Passes)
    """The per-token passes every batch's token options and the collector read (one grid: the same cells)."""
    cpu_block_tokens: ClassVar[int] = 1 << 20
    """Larger blocks than analyze's: each block runs every option's per-threshold work (~140 thresholds), whose
    Python overhead a 1M-token block (the default chunk) spreads thinner; the per-token work is in compiled
    passes, which do not mind the size (measured 34-37 ns a token at 1M, 36-40 at 256k)."""

    def new_batch(self) -> SweepBatch:
        return SweepBatch(self.grid, self.passes, self.collector, self.resolved)

    def pooled(self) -> SweepBatch:
        pooled = SweepBatch(self.grid, self.passes, resolved=self.resolved)
        for batch in self.batches.values():
            pooled.merge(batch)
        return pooled

    def analyzed(self) -> EngineState:
        """The state ``rcdiag analyze`` would have read from the same dump with verl's metrics-only default: each
        step's analyze metrics and the whole-dump sections' states, shared with this state (read before the report
        consumes the batches); what the verdict is built from."""
        batches = {step: batch.analyzed() for step, batch in self.batches.items()}
        whole_dump = dict(self.whole_dump)
        # debug=False: its batches hold no debug group, so the pooled batch it makes must hold none either
        return EngineState(self.resolved, batches, self.rows, self.tokens, self.valid_tokens, whole_dump, debug=False)

    def merge(self, other: SweepState) -> SweepState:
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
    def layout(cls) -> dict[str, Any]:
        return sweep_layout()

    @classmethod
    def from_state_dict(cls, resolved: Any, state: dict[str, Any], kinds: WholeDumpKinds) -> SweepState:
        grid = checked(state["grid"], dict[str, list[str]], "state.grid")
        out = cls(resolved, **saved_counts(state), grid=SweepGrid.from_specs(grid, resolved.version.name))
        target = state.get("target_reject")
        out.target_reject = None if target is None else real(target, "state.target_reject", nonnegative=True)
        if state.get("collector") is not None:
            out.collector = Collector([option for option, _ in out.grid.options], out.passes)
            out.collector.load_state_dict(state["collector"])
        load_batches(out, state)
        load_whole_dump(out, state, kinds)
        return out


def new_sweep_state(grid: SweepGrid, target_reject: float | None = None) -> SweepState:
    """An empty sweep state (the engine's configuration is verl's metrics-only default; the grid is separate);
    with ``target_reject``, it also collects what the recommendations need."""
    resolved = CorrectionConfig(verl_version=grid.verl_version).resolve()
    state = SweepState(resolved, grid=grid, target_reject=target_reject)
    if target_reject is not None:
        state.collector = Collector([option for option, _ in grid.options], state.passes)
    return state
