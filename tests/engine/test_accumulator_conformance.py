"""One protocol for every accumulator (``rcdiag.metrics.base.Accumulator``), the per-step ones and the whole-dump
ones (``--explain``'s): the merge of parts equals one pass, one pass equals an independent reference, and a state
file round trip changes nothing (then merges as the state it came from).

``CASES`` is the hook: each case builds the engine state its accumulators live in; a new kind of accumulator (the
sweep's, once it is built on ``metrics/base``) joins by adding a case, and ``test_every_accumulator_is_covered``
fails until it does.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SAMPLES, assert_metrics_close, random_batch
from explain_sums_reference import reference as explain_reference
from reference import all_metrics

import rcdiag
from rcdiag.engine.state_files import decode_state, encode_state
from rcdiag.engine.stream import Engine, EngineState
from rcdiag.explain.detector_state import DetectorState
from rcdiag.explain.state import ExplainState
from rcdiag.explain.statistics import GroupSums, SumsAccumulator
from rcdiag.frameworks.base import FrameworkMetrics
from rcdiag.frameworks.registry import choose
from rcdiag.frameworks.section import FrameworkState, SettingsState
from rcdiag.io.base import Chunk
from rcdiag.metrics.base import Accumulator
from rcdiag.sections.exact import FIRST_RESPONSES, ExactState
from rcdiag.sections.registry import KNOWN
from rcdiag.sections.slices import DETAIL, SliceRows
from rcdiag.sweep.grid import SweepGrid
from rcdiag.sweep.option_sweeps import RSSweep
from rcdiag.sweep.state import SweepState, new_sweep_state

CONFIG = rcdiag.CorrectionConfig(
    rollout_is="token", rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_2.0,0.01"
)
ABSTRACT = frozenset({SumsAccumulator, GroupSums, RSSweep, FrameworkMetrics})
"""Bases that declare a state but are never accumulated on their own."""
BLOCK_TOKENS = 97
"""Small blocks, so that every part spans several of them and rows of one step sit in several blocks."""


@dataclass(frozen=True)
class Data:
    """One dump: padded arrays (for the references) and its rows as chunks (for the engine)."""

    old: np.ndarray
    rollout: np.ndarray
    mask: np.ndarray
    ids: np.ndarray
    current: np.ndarray
    advantages: np.ndarray

    def chunk(self, a: int, b: int) -> Chunk:
        rows, width = self.old[a:b].shape
        return Chunk(
            old=np.ascontiguousarray(self.old[a:b]).reshape(-1),
            rollout=np.ascontiguousarray(self.rollout[a:b]).reshape(-1),
            offsets=np.arange(rows + 1, dtype=np.int64) * width,
            mask=self.mask[a:b].astype(bool).reshape(-1),
            tokens=np.ascontiguousarray(self.ids[a:b]).reshape(-1),
            labels={"env": np.array([f"e{row % 3}" for row in range(a, b)], dtype=object)},
            loss_inputs={  # the current policy and per-token advantages: the --as loss keys' states too
                "log_prob": np.ascontiguousarray(self.current[a:b]).reshape(-1),
                "advantages": np.ascontiguousarray(self.advantages[a:b]).reshape(-1),
            },
        )


@dataclass(frozen=True)
class Case:
    """A kind of accumulator: the engine state holding it (``new``), the accumulators in such a state
    (``members``), and the check of one pass's state against an independent reference (``reference``)."""

    name: str
    new: Callable[[], tuple[EngineState, Any]]
    """An empty engine state and the whole-dump accumulator fed beside it (``None``: the per-step ones only)."""
    members: Callable[[EngineState], list[Accumulator]]
    reference: Callable[[Data, EngineState], None]


def _per_step(state: EngineState) -> list[Accumulator]:
    return [group for batch in state.batches.values() for group in batch.groups()]


def _per_step_reference(data: Data, state: EngineState) -> None:
    got = state.pooled().compute().metrics
    want = all_metrics(data.old, data.rollout, data.mask, **CONFIG.to_dict())
    assert_metrics_close(got, want)


def _sums_reference(data: Data, got: dict[str, np.ndarray]) -> None:
    """The explain pass's sums (``got``, by name) against the definitions (tests/explain_sums_reference.py)."""
    mask = data.mask.astype(bool)
    lengths = np.full(data.old.shape[0], data.old.shape[1], dtype=np.int64)
    want = explain_reference(data.old.reshape(-1), data.rollout.reshape(-1), mask.reshape(-1), lengths)
    size = explain_reference(data.old.reshape(-1), data.rollout.reshape(-1), mask.reshape(-1), lengths, True)
    for name, values in got.items():
        tolerance = 1e-6 if name in ("offset", "shape") else 1e-12  # the capped IS ratio: float32 exp
        assert np.all(np.abs(values - want[name]) <= tolerance * size[name] + 1e-300), name


def _explain_reference(data: Data, state: EngineState) -> None:
    explain = state.whole_dump["explain"]
    mask = data.mask.astype(bool)
    got = {
        "prob": explain.breakdowns.prob,
        "position": explain.breakdowns.position,
        "length": explain.breakdowns.length,
        "scale": explain.scale.sums,
        "offset": explain.offset.sums,
        "shape": explain.shape.sums,
    }
    _sums_reference(data, got)
    d = (data.old.astype(np.float64) - data.rollout.astype(np.float64)) * mask
    sums = d.sum(axis=1)
    order = sorted(range(len(sums)), key=lambda r: (-abs(sums[r]), r))[: explain.worst.n]
    entries = explain.worst.entries()
    assert [e.row for e in entries] == order
    assert [e.log_ratio_sum for e in entries] == pytest.approx([sums[r] for r in order], rel=1e-6)
    ids, table = explain.tokens.table()
    valid_ids = data.ids[mask]
    assert ids.tolist() == sorted(set(valid_ids.tolist()))
    assert table[:, 0].tolist() == [float(np.count_nonzero(valid_ids == i)) for i in ids.tolist()]
    lr = (data.old.astype(np.float64) - data.rollout.astype(np.float64))[mask]
    assert table[:, 1] == pytest.approx([lr[valid_ids == i].sum() for i in ids.tolist()], rel=1e-6, abs=1e-9)


def _detectors_reference(data: Data, state: EngineState) -> None:
    """The default analyze's detector sums: the definitions' (as ``--explain``'s same parts)."""
    detectors = state.whole_dump["detectors"]
    got = {
        "position": detectors.position_sums,
        "scale": detectors.scale.sums,
        "offset": detectors.offset.sums,
        "shape": detectors.shape.sums,
    }
    _sums_reference(data, got)


def _explain_members(state: EngineState) -> list[Accumulator]:
    return [*_per_step(state), *state.whole_dump["explain"].parts().values()]


def _exact_members(state: EngineState) -> list[Accumulator]:
    return [*_per_step(state), state.whole_dump["exact"].sums]


def _exact_reference(data: Data, state: EngineState) -> None:
    """Bits compared token by token (``view(np.int32)``), ulps from the ordered integers written with a branch: a
    float's magnitude bits, negated when its sign bit is set."""
    got = state.whole_dump["exact"].record()
    mask = data.mask.astype(bool)
    a, b = data.old.view(np.int32), data.rollout.view(np.int32)
    differ = (a != b) & mask

    def ordered(bits: np.ndarray) -> np.ndarray:
        wide = bits.astype(np.int64)
        return np.where(wide < 0, -(wide & 0x7FFFFFFF), wide)

    ulps = np.abs(ordered(a) - ordered(b)) * mask
    rows = [r for r in range(a.shape[0]) if differ[r].any()]
    assert (got.tokens_compared, got.tokens_different) == (int(mask.sum()), int(differ.sum()))
    assert (got.responses_compared, got.responses_different) == (a.shape[0], len(rows))
    assert got.max_ulp == int(ulps.max())
    want = [(r, int(np.flatnonzero(differ[r])[0]), int(differ[r].sum()), int(ulps[r].max())) for r in rows]
    listed = [(f.row, f.position, f.tokens_different, f.max_ulp) for f in got.first_difference]
    assert listed == want[:FIRST_RESPONSES]


SWEEP = SweepGrid.from_specs({"token_k1": ["1.5", "0.5_2.0"], "seq_mean_k3": ["0.01", "0.5"], "is_token": ["2.0"]})
"""A small grid: a token RS option (one- and two-sided), a sequence RS option, token IS."""


def _sweep_members(state: EngineState) -> list[Accumulator]:
    assert isinstance(state, SweepState) and state.collector is not None
    return [group for batch in state.batches.values() for group in batch.groups()] + state.collector.groups()


def _sweep_reference(data: Data, state: EngineState) -> None:
    """Every grid point's metrics are those of the brute-force reference run with that single option."""
    assert isinstance(state, SweepState)
    points = state.pooled().compute()
    for option, thresholds in SWEEP.specs().items():
        for spec in thresholds:
            if option.startswith("is_"):
                config = {"rollout_is": option.removeprefix("is_"), "rollout_is_threshold": spec}
            else:
                config = {"rollout_rs": option, "rollout_rs_threshold": spec}
            want = all_metrics(data.old, data.rollout, data.mask, **config)
            got = points[option, spec].metrics
            assert set(got) <= set(want), (option, spec)
            assert_metrics_close(got, {key: want[key] for key in got})


def _framework_case(name: str, options: dict[str, Any], reference: Callable[[Data], dict[str, float]]) -> Case:
    """``--as name``'s per-step accumulators (``rcdiag.frameworks``) beside analyze's, checked against a numpy
    brute force of the framework's formulas (its own code checks them in tests/frameworks/test_frameworks_*.py)."""

    def new() -> tuple[EngineState, Any]:
        whole = FrameworkState(choose(name, options))
        return EngineState(CONFIG.resolve(), whole_dump={"framework": whole}), whole

    def members(state: EngineState) -> list[Accumulator]:
        return [*_per_step(state), *state.whole_dump["framework"].steps.values()]

    def check(data: Data, state: EngineState) -> None:
        pooled = state.whole_dump["framework"].pooled()
        got, _ = pooled.compute()
        for key, value in reference(data).items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, key)

    return Case(f"framework-{name}", new, members, check)


def _settings_case() -> Case:
    """``sweep --as NAME``'s measures: several frameworks' settings, each pooled over the dump, in one state."""
    chosen = (choose("trl", {}), choose("openrlhf", {"algo.advantage.is_correction_enable": True}))

    def new() -> tuple[EngineState, Any]:
        whole = SettingsState(chosen)
        return EngineState(CONFIG.resolve(), whole_dump={"framework_settings": whole}), whole

    def members(state: EngineState) -> list[Accumulator]:
        return [*_per_step(state), *state.whole_dump["framework_settings"].metrics]

    def check(data: Data, state: EngineState) -> None:
        trl, openrlhf = (m.compute()[0] for m in state.whole_dump["framework_settings"].metrics)
        for got, want in ((trl, _trl_reference(data)), (openrlhf, _openrlhf_reference(data))):
            for key, value in want.items():
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key

    return Case("framework-settings", new, members, check)


def _valid(data: Data) -> tuple[np.ndarray, np.ndarray]:
    mask = data.mask.astype(bool)
    return mask, data.old.astype(np.float64) - data.rollout.astype(np.float64)


def _trl_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    ratio = np.exp((d * mask).sum(axis=1))
    ratio[ratio > 3.0] = 0.0  # sequence_mask at TRL's default 3
    return {
        "sampling/sampling_logp_difference/mean": float(np.abs(d[mask]).mean()),
        "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
        "sampling/importance_sampling_ratio/max": float(ratio.max()),
    }


def _openrlhf_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    ratio = np.exp(d[mask])
    return {"vllm_kl": float(-d[mask].mean()), "rcdiag/openrlhf/weight_mean": float(np.clip(ratio, 0.5, 5.0).mean())}


def _areal_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    weight = np.exp(d[mask])
    kept = weight <= 2.0
    return {
        "ppo_actor/update/behave_imp_weight/avg": float(weight[kept].mean()),
        "ppo_actor/update/behave_approx_kl/avg": float(d[mask][kept].mean()),
        "ppo_actor/update/rs_filtered_fraction": float(1.0 - kept.mean()),
    }


def _slices_reference(data: Data, state: EngineState) -> None:
    """Every response's row, finite tokens, capped k3 (token ratios at most e^3), exact k3 and label against numpy."""
    slices = state.whole_dump["slices"]
    assert isinstance(slices, SliceRows)
    (table,) = slices.tables().values()
    d = data.old.astype(np.float64) - data.rollout.astype(np.float64)
    valid = data.mask.astype(bool) & np.isfinite(d)
    d0 = np.where(valid, d, 0.0)
    capped = np.where(valid, np.minimum(np.exp(d0), math.exp(3)) - 1 - d0, 0.0).sum(axis=1)
    d32 = np.where(valid, (data.old - data.rollout).astype(np.float64), 0.0)  # k3 reads d in float32, as the report
    exact = np.where(valid, np.expm1(d32) - d32, 0.0).sum(axis=1)
    assert table[:, 0].tolist() == list(range(data.old.shape[0]))
    assert table[:, 1].tolist() == valid.sum(axis=1).tolist()
    assert table[:, 2] == pytest.approx(capped, rel=1e-6, abs=1e-9)  # the capped ratio: the kernel's expm1
    assert table[:, 3 + DETAIL.index("k3_exact")] == pytest.approx(exact, rel=1e-9, abs=1e-12)
    codes = table[:, -1].astype(int)
    assert [slices.values["env"][c] for c in codes] == [f"e{row % 3}" for row in range(data.old.shape[0])]


def _skyrl_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    padded = np.exp(np.clip(d, -20, 20)) * mask  # SkyRL's ratio * loss_mask over the (B, T) batch, pads 0
    return {
        "policy/rollout_train_logprobs_abs_diff_mean": float(np.abs(d[mask]).mean()),
        "policy/loss_metrics/is_ratio_mean": float(padded[mask].mean()),
        "policy/loss_metrics/is_ratio_std": float(padded.std(ddof=1)),
        "policy/loss_metrics/is_ratio_min": 0.0,
    }


def _slime_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    count = np.maximum(mask.sum(axis=1), 1)
    per_sample = (np.exp(d) * mask).sum(axis=1) / count  # every sample's masked mean, an empty one 0
    return {"train/tis": float(per_sample.mean()), "train/train_rollout_logprob_abs_diff": float(
        ((np.abs(d) * mask).sum(axis=1) / count).mean())}  # fmt: skip


def _prime_rl_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    moved = np.abs(np.exp(data.old.astype(np.float64)) - np.exp(data.rollout.astype(np.float64))) > 0.1
    return {
        "mismatch_kl/all/max": float((np.exp(d) - d - 1)[mask].max()),
        "is_masked/mean": float(((moved & mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1)).mean()),
    }


def _nemo_rl_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    per_sample = (np.exp(np.abs(d)) * mask).sum(axis=1)[mask.any(axis=1)] / mask.sum(axis=1)[mask.any(axis=1)]
    return {
        "train/token_mult_prob_error": float(np.exp(np.abs(d[mask])).mean()),
        "train/num_valid_samples": float(mask.shape[0]),
        "train/mean_seq_mult_prob_error": float(per_sample.mean()),
    }


def _roll_reference(data: Data) -> dict[str, float]:
    mask, d = _valid(data)
    ratio = np.exp(d)  # every stored position, masked ones too: ROLL's pass rate counts the whole padded batch
    rows = mask.any(axis=1)
    return {
        "actor/train_infer_ratio_token_mean": float(((ratio * mask).sum(axis=1)[rows] / mask.sum(axis=1)[rows]).mean()),
        "actor/train_infer_token_ratio_mask_mean": float(((ratio >= 0.8) & (ratio <= 1.2)).sum() / mask.sum()),
    }


CASES: list[Case] = [
    Case("per-step", lambda: (EngineState(CONFIG.resolve()), None), _per_step, _per_step_reference),
    Case(
        "explain",
        lambda: (EngineState(CONFIG.resolve(), whole_dump={"explain": (whole := ExplainState(7))}), whole),
        _explain_members,
        _explain_reference,
    ),
    Case(
        "detectors",
        lambda: (EngineState(CONFIG.resolve(), whole_dump={"detectors": (whole := DetectorState())}), whole),
        lambda state: [*_per_step(state), *state.whole_dump["detectors"].parts().values()],
        _detectors_reference,
    ),
    Case("sweep", lambda: (new_sweep_state(SWEEP, target_reject=0.01), None), _sweep_members, _sweep_reference),
    _framework_case("trl", {}, _trl_reference),
    _framework_case("openrlhf", {"algo.advantage.is_correction_enable": True}, _openrlhf_reference),
    _framework_case("areal", {"use_decoupled_loss": True, "rejection_sampling": {"upper": 2.0}}, _areal_reference),
    _framework_case("skyrl", {"tis_ratio_type": "token", "sequence_mask_metric": "geometric"}, _skyrl_reference),
    _framework_case("slime", {"use_tis": True}, _slime_reference),
    _framework_case("prime-rl", {"loss": {"type": "ipo"}}, _prime_rl_reference),
    _framework_case("nemo-rl", {}, _nemo_rl_reference),
    _framework_case("roll", {"filters": [{"enabled": True}]}, _roll_reference),
    _settings_case(),
    Case(
        "exact",
        lambda: (EngineState(CONFIG.resolve(), whole_dump={"exact": (whole := ExactState())}), whole),
        _exact_members,
        _exact_reference,
    ),
    Case(
        "slices",
        lambda: (EngineState(CONFIG.resolve(), whole_dump={"slices": (whole := SliceRows(("env",)))}), whole),
        lambda state: [*_per_step(state), state.whole_dump["slices"]],
        _slices_reference,
    ),
]
"""Every kind of accumulator: analyze's per-step ones, the bias detectors' (every analyze), ``--explain``'s, the
sweep's, each framework's (``--as``), exact match's, the slices' (with ``--by``)."""


def _run(case: Case, data: Data, cuts: list[int]) -> EngineState:
    """The rows read in parts split before each row of ``cuts``, each part by its own engine, merged in order."""
    bounds = [0, *cuts, data.old.shape[0]]
    merged: EngineState | None = None
    for a, b in itertools.pairwise(bounds):
        state, whole = case.new()
        engine = Engine(state.resolved, wholes=() if whole is None else [whole], state=state)
        engine.block_tokens = BLOCK_TOKENS
        engine.run([data.chunk(a, b)])
        merged = state if merged is None else merged.merge(state)
    assert merged is not None
    return merged


def _data(seed: int) -> Data:
    rng = np.random.default_rng(seed)
    old, rollout, mask = random_batch(rng, rows=40, width=30, outliers=0.02)
    ids = rng.integers(0, 50, old.shape).astype(np.int64)
    ids[rng.random(old.shape) < 0.05] = (1 << 22) + rng.integers(0, 3)  # beyond the dense table: the sparse rows
    current = (old + rng.normal(0.0, 0.02, old.shape)).astype(np.float32)
    advantages = rng.normal(0.0, 1.0, old.shape).astype(np.float32)
    return Data(old, rollout, mask, ids, current, advantages)


def _close(a: Any, b: Any, where: str = "") -> None:
    """Equal saved states: numbers to float64 rounding in another order, everything else exactly."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_merge_of_parts_is_one_pass_and_one_pass_is_the_reference(case: Case, seed: int) -> None:
    data = _data(seed)
    one = _run(case, data, [])
    case.reference(data, one)
    for cuts in ([13], [1, 22, 39]):
        parts = _run(case, data, cuts)
        for mine, theirs in zip(case.members(one), case.members(parts), strict=True):
            _close(mine.state_dict(), theirs.state_dict(), type(mine).__name__)
        case.reference(data, parts)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_state_file_round_trip_changes_nothing(case: Case) -> None:
    """Saved (non-finite numbers as strings, JSON), loaded with every field checked: the same state, which merges
    with another part as the state it came from does."""
    data = _data(2)
    first, second = _run(case, data, [17]), _run(case, data, [])
    text = json.dumps(encode_state(first.state_dict()))
    loaded = type(first).from_state_dict(first.resolved, decode_state(json.loads(text)), KNOWN)
    assert json.dumps(encode_state(loaded.state_dict())) == text
    later = _run(case, data, [])
    merged, merged_loaded = first.merge(second), loaded.merge(later)
    assert json.dumps(encode_state(merged.state_dict())) == json.dumps(encode_state(merged_loaded.state_dict()))


def _subclasses(cls: type) -> set[type]:
    found, pending = set(), list(cls.__subclasses__())
    while pending:
        sub = pending.pop()
        pending.extend(sub.__subclasses__())
        if sub.__module__.startswith("rcdiag."):
            found.add(sub)
    return found


def test_every_accumulator_is_covered() -> None:
    """A new accumulator joins a case (or a new case), so the protocol is checked for it too."""
    data = _data(3)
    covered = {type(member) for case in CASES for member in case.members(_run(case, data, []))}
    assert _subclasses(Accumulator) - ABSTRACT - covered == set()


def test_an_explain_state_loads_in_a_process_that_imported_only_the_state_module(tmp_path: Path) -> None:
    """Whole-dump kinds are one table (``rcdiag.sections.registry``), given to the state files: loading a saved
    ``--explain`` state (and the exact match every analyze saves) works from ``rcdiag.engine.state_files`` and that table alone
    (a fresh process), whatever the process happened to import."""
    import subprocess
    import sys

    saved = tmp_path / "explain.state.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rcdiag",
            "analyze",
            str(SAMPLES / "healthy.parquet"),
            "--explain",
            "--save-state",
            str(saved),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    code = (
        "import sys; from rcdiag.engine.state_files import load_state; from rcdiag.sections.registry import KNOWN; "
        "state = load_state(sys.argv[1], KNOWN)[0]; "
        "print(sorted(state.whole_dump))"
    )
    loaded = subprocess.run([sys.executable, "-c", code, str(saved)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "['exact', 'explain', 'slices']"  # exact match and slices ride on every analyze
