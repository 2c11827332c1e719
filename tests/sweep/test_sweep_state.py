"""The sweep keeps its state on the accumulator protocol (``rcdiag.metrics.base``): declared states, ``update``,
``merge``, saved and checked like every other accumulator's; each threshold's engine accumulator is filled through
its public ``set_states``, so a state added to the engine's accumulator is carried, or refused, never read as 0."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import padded_chunk, random_batch

from rcdiag.metrics import rejection
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.base import Accumulator, Moments
from rcdiag.metrics.block import Block
from rcdiag.metrics.extras import ExtraMetrics
from rcdiag.metrics.rejection import RSOptionMetrics
from rcdiag.sweep import sweep_chunks
from rcdiag.sweep.cells import Passes
from rcdiag.sweep.grid import SweepGrid, resolve
from rcdiag.sweep.state import SweepBatch

SPECS = {"token_k1": ["1.5", "2.0"], "seq_mean_k3": ["0.01", "0.5"], "is_token": ["2.0", "0.5_2.0"]}


def _block(seed: int) -> Block:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 30, 40).astype(np.int64)
    old = rng.normal(-1.0, 0.5, int(lengths.sum())).astype(np.float32)
    rollout = (old + rng.normal(0.0, 0.4, old.shape[0])).astype(np.float32)
    return Block(NumpyBackend(), old, rollout, lengths)


def _chunk(seed: int) -> Any:
    old, rollout, mask = random_batch(np.random.default_rng(seed), rows=12, width=20, noise=0.3)
    return padded_chunk(old, rollout, mask, None)


def test_a_new_threshold_dependent_rs_state_is_refused_never_read_as_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """An RS state that depends on the threshold and that the sweep does not compute per threshold stops the sweep
    (a developer's error, named), where it would have read 0 at every threshold."""
    found = rejection._reject

    def reject(block: Block, option: Any) -> rejection.Rejection:
        result = found(block, option)
        result.states["tok_nan"] = result.masked_tokens + 1.0  # depends on the threshold
        return result

    monkeypatch.setattr(rejection, "_reject", reject)
    monkeypatch.setattr(RSOptionMetrics, "STATES", {**RSOptionMetrics.STATES, "tok_nan": "sum"})
    threshold_states = getattr(RSOptionMetrics, "THRESHOLD_STATES", frozenset())
    monkeypatch.setattr(RSOptionMetrics, "THRESHOLD_STATES", threshold_states | {"tok_nan"}, raising=False)
    analyze = RSOptionMetrics(resolve("token_k1", "2.0").rs_option)
    analyze.update(_block(1))
    assert analyze.state["tok_nan"] >= 1.0
    with pytest.raises(NotImplementedError, match=r"'tok_nan'.*rcdiag/sweep/option_sweeps\.py"):
        sweep_chunks([_chunk(1)], SweepGrid.from_specs({"token_k1": ["1.5", "2.0"]}))


def test_an_rs_state_neither_threshold_free_nor_per_threshold_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state declared on ``RSOptionMetrics`` but given by no threshold-free pass (``THRESHOLD_STATES`` not told)
    is refused at the first block, not left empty."""
    monkeypatch.setattr(RSOptionMetrics, "STATES", {**RSOptionMetrics.STATES, "forgotten": "sum"})
    with pytest.raises(NotImplementedError, match="forgotten"):
        sweep_chunks([_chunk(2)], SweepGrid.from_specs({"seq_mean_k3": ["0.5"]}))


def test_a_new_threshold_free_rs_state_is_carried_to_every_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threshold-free state added to ``RSOptionMetrics`` (and to the per-row pass) reaches every threshold's
    accumulator in the sweep with analyze's value."""
    row_values = rejection._row_values

    def more(block: Block, agg: str, estimator: Any, level: str) -> tuple[Any, dict[str, Any]]:
        v, states = row_values(block, agg, estimator, level)
        return v, {**states, "v_sq": float(np.sum(np.square(v)))}

    monkeypatch.setattr(rejection, "_row_values", more)
    monkeypatch.setattr(RSOptionMetrics, "STATES", {**RSOptionMetrics.STATES, "v_sq": "sum"})
    grid = SweepGrid.from_specs({"token_k1": ["1.5", "2.0"], "seq_mean_k3": ["0.01", "0.5"]})
    batch = SweepBatch(grid, Passes())
    for seed in (3, 4):
        batch.update(_block(seed))
    for sweep in batch.sweeps:
        for index, threshold in enumerate(sweep.thresholds):
            assert threshold.rs_option is not None
            analyze = RSOptionMetrics(threshold.rs_option)
            for seed in (3, 4):
                analyze.update(_block(seed))
            assert analyze.state["v_sq"] > 0
            assert sweep.at(index).state["v_sq"] == analyze.state["v_sq"]
            assert sweep.at(index).state["masked_rows"] == analyze.state["masked_rows"]


def test_set_states_wants_every_filled_state_and_no_other() -> None:
    extras = ExtraMetrics()
    with pytest.raises(ValueError, match="missing"):
        extras.set_states({})
    with pytest.raises(ValueError, match=r"unknown \['nope'\]"):
        extras.set_states({**extras.state, "nope": 1.0})
    option = RSOptionMetrics(resolve("seq_mean_k3", "0.5").rs_option)
    given = {name: 1.0 for name in option.filled_states() if RSOptionMetrics.STATES[name] == "sum"}
    given.update({name: Moments(1.0, 0.5, 0.0) for name in ("clamped", "v")}, v_max=1.0, v_min=0.0, v_abs_max=1.0)
    option.set_states(given)  # a sequence option leaves the token-only states empty
    assert option.state["tok_max"] == -np.inf and option.state["masked_rows"] == 1.0


def _parts(batch: SweepBatch) -> list[Accumulator]:
    return batch.groups()


def test_every_sweep_state_merges_and_round_trips_like_an_accumulator() -> None:
    """Two halves merged equal one pass over both blocks, and every part's saved state loads back to itself."""
    grid = SweepGrid.from_specs(SPECS)
    passes = Passes()
    whole, first, second = SweepBatch(grid, passes), SweepBatch(grid, passes), SweepBatch(grid, passes)
    for seed in (5, 6):
        whole.update(_block(seed))
    first.update(_block(5))
    second.update(_block(6))
    first.merge(second)
    assert first.compute().keys() == whole.compute().keys()
    for mine, theirs in zip(first.compute().values(), whole.compute().values(), strict=True):
        for key, value in mine.metrics.items():
            expected = theirs.metrics[key]
            assert value == pytest.approx(expected, rel=1e-9, abs=1e-12, nan_ok=True), key
    loaded = SweepBatch(grid, passes)
    loaded.load_state_dict(whole.state_dict())
    assert loaded.state_dict() == whole.state_dict()
    assert {type(part).__name__ for part in _parts(whole)} >= {"TokenRSSweep", "SequenceRSSweep", "TokenISSweep"}


@pytest.mark.parametrize(
    "spec",
    [("seq_mean_k3", "0.5"), ("token_k1", "1.5"), ("is_token", "2.0"), ("is_token", "0.5_2.0"), ("is_sequence", "2.0")],
)
@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_an_update_leaves_every_state_outside_filled_states_empty(spec: tuple[str, str], version: str) -> None:
    """``filled_states`` is what ``set_states`` insists on: a state ``update`` fills but ``filled_states`` leaves out
    would be left empty by the sweep without a word."""
    from rcdiag.metrics.importance import ISMetrics
    from rcdiag.settings.versions import verl_version

    threshold = resolve(*spec)
    accumulator: Accumulator = (
        ISMetrics(threshold.is_spec, verl_version(version))
        if threshold.is_spec is not None
        else RSOptionMetrics(threshold.rs_option)
    )
    empty = dict(accumulator.state)
    accumulator.update(_block(7))
    for name in set(accumulator.STATES) - accumulator.filled_states():
        assert accumulator.state[name] == empty[name], name
    changed = {name for name in accumulator.STATES if accumulator.state[name] != empty[name]}
    assert changed and changed <= accumulator.filled_states()
