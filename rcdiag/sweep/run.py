"""Library entry points of the sweep: read a dump once into a ``SweepState``, then build the report."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rcdiag.api import ProgressCallback, accumulate, input_facts
from rcdiag.backend import Backend, get_backend
from rcdiag.config import CorrectionConfig
from rcdiag.engine import Engine
from rcdiag.io import Chunk
from rcdiag.io.base import SourceInfo
from rcdiag.options import ReadOptions
from rcdiag.sweep.batch import SweepState, new_sweep_state
from rcdiag.sweep.grid import SweepGrid, build_grid
from rcdiag.sweep.report import SweepReport, build_sweep_report
from rcdiag.validate import Screen, as_chunk


def _new_state(specs: dict[str, list[str]], version: str, target_reject: float | None) -> SweepState:
    return new_sweep_state(SweepGrid.from_specs(specs, version), target_reject)


def sweep(
    path: str | Path,
    grid: SweepGrid | None = None,
    read: ReadOptions | None = None,
    *,
    on_chunk: ProgressCallback | None = None,
    save_state: str | Path | None = None,
    target_reject: float | None = 0.01,
    min_ess: float = 0.0,
    **options: Any,
) -> SweepReport:
    """Every option of ``grid`` (default: both IS levels and all 11 RS options over the default grids) at every
    threshold, in one pass over the dump; with ``target_reject``, the recommended threshold per option (from the
    same pass, docs/sweep.md); and verl's presets ranked (``min_ess``: those leaving a lower ESS last).

    ``read`` (or its fields as keywords) says how to read the dump, as for ``rcdiag.analyze``. Each row's
    metrics equal ``rcdiag.analyze`` with that single option at that threshold.
    """
    grid = grid or build_grid()
    read = ReadOptions.of(read, options)
    new_state = functools.partial(_new_state, grid.specs(), grid.verl_version, target_reject)
    accumulated = accumulate(
        path,
        CorrectionConfig(verl_version=grid.verl_version),
        read,
        on_chunk=on_chunk,
        save_state=save_state,
        new_state=new_state,
    )
    state = accumulated.state
    assert isinstance(state, SweepState)
    facts = input_facts(state, accumulated.info, accumulated.screen)
    return build_sweep_report(state, facts, accumulated.device, min_ess)


def sweep_chunks(
    chunks: Iterable[Chunk],
    grid: SweepGrid | None = None,
    read: ReadOptions | None = None,
    *,
    target_reject: float | None = 0.01,
    min_ess: float = 0.0,
    **options: Any,
) -> SweepReport:
    """Like ``sweep`` but over chunks you built yourself; of ``read``, ``device`` and ``on_bad_row`` apply."""
    state = new_sweep_state(grid or build_grid(), target_reject)
    read = ReadOptions.of(read, options)
    backend = read.device if isinstance(read.device, Backend) else get_backend(read.device)
    screen = Screen(read.on_bad_row)
    Engine(state.resolved, backend, state=state).run(screen(as_chunk(chunk, i) for i, chunk in enumerate(chunks)))
    facts = input_facts(state, SourceInfo(path="<memory>", format="chunks"), screen.stats)
    return build_sweep_report(state, facts, backend.name, min_ess)


def merge_sweep_states(paths: list[str | Path], min_ess: float = 0.0) -> SweepReport:
    """The sweep of one run over every shard whose ``rcdiag sweep --save-state`` files are given; recommendations
    (at the target the states were written with) when every state carries what they need."""
    from rcdiag.state import combined_info, merge_state_files

    state, sources, stats = merge_state_files(paths)
    assert isinstance(state, SweepState)
    facts = input_facts(state, combined_info(sources), stats)
    return build_sweep_report(state, facts, "merged", min_ess)
