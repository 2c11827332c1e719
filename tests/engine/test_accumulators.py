"""The accumulator protocol and the saved-state layout derived from it."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from conftest import ragged_lists, random_batch, write_dump

import rcdiag
from rcdiag.engine.state_files import load_state, state_layout
from rcdiag.metrics.base import Accumulator, Reduce
from rcdiag.metrics.extras import ExtraMetrics
from rcdiag.metrics.rejection import RSOptionMetrics
from rcdiag.sections.registry import KNOWN


def _accumulators() -> list[type[Accumulator]]:
    found, pending = [], list(Accumulator.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("rcdiag."):
            found.append(cls)
    return found


@pytest.mark.parametrize("cls", _accumulators(), ids=lambda cls: cls.__name__)
def test_every_accumulator_updates_from_the_block_alone(cls: type[Accumulator]) -> None:
    """One protocol: ``update(block) -> None``, no values passed in or handed out between accumulators."""
    signature = inspect.signature(cls.update)
    assert list(signature.parameters) == ["self", "block"], cls
    assert signature.return_annotation in (None, "None"), cls
    assert cls.STATES, cls


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    old, rollout, mask = random_batch(np.random.default_rng(3), rows=10, width=8)
    path = write_dump(tmp_path / "d.parquet", ragged_lists(old, rollout, mask))
    config = rcdiag.CorrectionConfig(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    rcdiag.analyze(path, config, save_state=tmp_path / "s.json")
    return tmp_path / "s.json"


def test_the_layout_follows_the_declared_states(monkeypatch: pytest.MonkeyPatch) -> None:
    before = state_layout(KNOWN)
    monkeypatch.setattr(ExtraMetrics, "STATES", {**ExtraMetrics.STATES, "new_sum": "sum"})
    added = state_layout(KNOWN)
    monkeypatch.setattr(ExtraMetrics, "STATES", {**ExtraMetrics.STATES, "new_sum": "max"})
    assert len({before, added, state_layout(KNOWN)}) == 3
    monkeypatch.undo()
    assert state_layout(KNOWN) == before


def test_a_file_from_another_layout_is_refused_naming_its_version(
    state_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_state(state_file, KNOWN)  # the layout it was written with loads
    payload = json.loads(state_file.read_text())
    payload["rcdiag_version"] = "0.0.7"
    state_file.write_text(json.dumps(payload))
    # the same file after an accumulator gained a state (renamed reductions, removed states: the same)
    states = dict(RSOptionMetrics.STATES)
    monkeypatch.setattr(RSOptionMetrics, "STATES", {**states, "tok_sq": "sum"})
    with pytest.raises(
        rcdiag.InputError, match=r"s\.json: was written by rcdiag 0\.0\.7, whose states have another layout"
    ):
        load_state(state_file, KNOWN)
    monkeypatch.undo()
    # a file that records no layout (written before layouts were recorded) is refused too
    del payload["layout"]
    state_file.write_text(json.dumps(payload))
    with pytest.raises(rcdiag.InputError, match=r"rcdiag 0\.0\.7.*layout not recorded"):
        load_state(state_file, KNOWN)


def test_the_cli_refuses_a_state_file_of_another_layout(
    state_file: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import run

    payload = json.loads(state_file.read_text())
    payload["layout"] = "0" * 16
    state_file.write_text(json.dumps(payload))
    code, _, err = run(capsys, "merge", str(state_file), str(state_file))
    assert code == 2
    assert f"was written by rcdiag {rcdiag.__version__}" in err and "re-run 'rcdiag analyze ... --save-state'" in err
    assert "Traceback" not in err


def test_a_new_accumulator_follows_its_declared_states_when_they_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The empty state is built once per declaration, not once per class: a patched ``STATES`` or ``BINS``, or a
    subclass declaring more, gets its own (a stale template would start without the new state, or with the old
    bin count)."""
    assert set(ExtraMetrics().state) == set(ExtraMetrics.STATES)
    monkeypatch.setattr(ExtraMetrics, "STATES", {**ExtraMetrics.STATES, "new_sum": "sum", "new_counts": "counts"})
    monkeypatch.setattr(ExtraMetrics, "BINS", 3)
    fresh = ExtraMetrics()
    assert fresh.state["new_sum"] == 0.0 and fresh.state["new_counts"].tolist() == [0, 0, 0]
    monkeypatch.undo()
    assert "new_sum" not in ExtraMetrics().state

    class MoreExtras(ExtraMetrics):
        STATES: ClassVar[dict[str, Reduce]] = {**ExtraMetrics.STATES, "more": "max"}

    assert MoreExtras().state["more"] == -np.inf
    assert "more" not in ExtraMetrics().state
