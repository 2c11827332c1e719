"""The sweep's memory stays flat as the dump grows (docs/performance.md#memory): a sweep holds every step's batch
until its report is built, and the recommendations a value per response, so what each step and each response
costs is what grows. These pin each reduction: a step's batch shares its options' layout (cells, maps, bounds)
with the other steps' instead of building its own; the responses' lengths are kept once, not once per option, and
float32 statistics stay float32; the report drops each step's batch once its rows are computed. None of it changes
a number: the recommendations of a state saved and loaded back, or merged, are the same."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import numpy as np
import pytest
from conftest import padded_chunk, random_batch

from rcdiag.api import input_facts
from rcdiag.engine.stream import Engine
from rcdiag.io.base import SourceInfo
from rcdiag.io.screen import Screen, as_chunk
from rcdiag.runtime.fields import FieldError
from rcdiag.sections.registry import KNOWN
from rcdiag.sweep.build import build_sweep_report
from rcdiag.sweep.grid import build_grid
from rcdiag.sweep.recommend import recommend
from rcdiag.sweep.state import SweepState, new_sweep_state

STEPS = 4


def _chunk(seed: int, steps: int = STEPS) -> Any:
    old, rollout, mask = random_batch(np.random.default_rng(seed), rows=48, width=30, noise=0.3, outliers=0.02)
    return padded_chunk(old, rollout, mask, np.arange(48, dtype=np.int64) % steps)


def _state(seeds: tuple[int, ...] = (1, 2)) -> tuple[SweepState, Screen]:
    """The default sweep (every option, recommendations) over stepped chunks."""
    state = new_sweep_state(build_grid(), target_reject=0.05)
    screen = Screen("error")
    Engine(state.resolved, state=state).run(screen(as_chunk(_chunk(seed), i) for i, seed in enumerate(seeds)))
    return state, screen


def test_every_steps_batch_shares_its_options_layout() -> None:
    """Each option's cells, maps, bounds and declaration are built once per sweep state, not once per step: an empty
    batch of the default grid took 88 KB (tracemalloc), mostly these; now under 60 (37 measured)."""
    state = new_sweep_state(build_grid(), target_reject=0.01)
    first, second = state.new_batch(), state.new_batch()
    shared = 0
    for mine, theirs in zip(first.sweeps, second.sweeps, strict=True):
        for name in ("cells", "maps", "lo", "hi", "STATES", "needed", "own", "constant"):
            if name in vars(mine):
                assert getattr(mine, name) is getattr(theirs, name), (mine.option, name)
                shared += 1
        assert all(a.state is not b.state for a, b in zip(mine.parts(), theirs.parts(), strict=True))
    assert shared > 40
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        batches = [state.new_batch() for _ in range(10)]
        per_batch = (tracemalloc.get_traced_memory()[0] - before) / len(batches)
    finally:
        tracemalloc.stop()
    assert per_batch < 60 * 1024, per_batch


def test_the_recommendations_keep_each_length_once_and_float32_statistics_as_given() -> None:
    """Per response: each length once for all 13 options, float32 statistics (a row's worst token) as float32: 96
    bytes at most where every option kept a float64 statistic and a float64 length (208 bytes)."""
    state, _ = _state()
    collector = state.collector
    assert collector is not None
    kept = sum(part.nbytes for part in collector.totals.state["lengths"])
    for option, part in collector.collectors.items():
        kept += sum(values.nbytes for values in part.rows)
        if part.token_level:
            assert {values.dtype for values in part.rows} == {np.dtype(np.float32)}, option
        assert "lengths" not in part.state, option
    assert len(collector.collectors) == 13
    assert kept / collector.rows <= 96, kept / collector.rows


def test_the_recommendations_are_the_same_from_a_saved_or_merged_state() -> None:
    """float32 statistics saved (as numbers), loaded back (as float64) and merged with another part recommend
    exactly what the state they came from does."""
    whole, _ = _state((1, 2))
    want = recommend(whole.collector, 0.05)  # type: ignore[arg-type]
    loaded = SweepState.from_state_dict(whole.resolved, whole.state_dict(), KNOWN)
    assert recommend(loaded.collector, 0.05) == want  # type: ignore[arg-type]
    first, _ = _state((1,))
    second, _ = _state((2,))
    second_loaded = SweepState.from_state_dict(second.resolved, second.state_dict(), KNOWN)
    assert recommend(first.merge(second_loaded).collector, 0.05) == want  # type: ignore[arg-type]
    assert any(r.threshold is not None for r in want)


def test_the_report_drops_each_steps_batch_once_its_rows_are_computed() -> None:
    """Building the report consumes the state's batches (the rows they give are kept instead), and the rows are
    those of each batch computed on its own, pooled from all of them."""
    state, screen = _state()
    other, _ = _state()
    want_steps = {step: batch.compute() for step, batch in other.batches.items()}
    want_pooled = other.pooled().compute()
    assert len(want_steps) == STEPS
    facts = input_facts(state, SourceInfo(path="<memory>", format="chunks"), screen.stats)
    report = build_sweep_report(state, facts, "cpu", 0.0)
    assert state.batches == {}
    for row in report.rows:
        key = (row.option, row.threshold)
        assert row.metrics == want_pooled[key].metrics
        assert row.steps == tuple((step, want_steps[step][key].metrics) for step in range(STEPS))


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (0, "collector lengths must hold one length per response"),
        (3, "collector token_k1 must hold a statistic for every response of the lengths"),
    ],
)
def test_a_saved_collector_whose_statistics_and_lengths_disagree_is_refused(group: int, message: str) -> None:
    """The lengths are kept once for every option, so a saved state whose lengths (group 0, the totals) or one
    option's statistics lost a response is refused, named, rather than pairing statistics with other responses'
    lengths."""
    state, _ = _state()
    saved = state.state_dict()
    groups = saved["collector"]["groups"]
    assert groups[group]["kind"] in ("Totals", "TokenCollector")
    values = groups[group]["state"]["lengths" if group == 0 else "statistic"]
    del values[-1]
    with pytest.raises(FieldError, match=message):
        SweepState.from_state_dict(state.resolved, saved, KNOWN)
