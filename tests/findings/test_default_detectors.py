"""The bias detectors on every analyze (issue 34 item 1; docs/verdict.md): their sums (``DetectorState``) are the
explain pass without its breakdowns, the same bits as ``--explain``'s and the definitions' to rounding, on the
kernel and on its numpy twin; the default analyze finds what ``--explain`` finds on the tests' real-model dumps and
on the samples; clean real-model dumps raise none of them; a one-sided temperature reads ``fix``/``temperature`` in
analyze, ``check --pack analyze``, ``compare``, ``watch --once`` and ``sweep``; saved states carry the sums, so
``merge`` judges as one run; ``token_specific`` says why it did not run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES, run
from explain_sums_reference import assert_sums_match, blocks
from hypothesis import given, settings
from hypothesis import strategies as st
from shape_dumps import defect_dump, dump

import rcdiag
from rcdiag.explain.detector_state import DetectorState
from rcdiag.explain.detectors import DETECTORS
from rcdiag.explain.state import ExplainState
from rcdiag.explain.token_detector import NEEDS_EXPLAIN, NOT_BUILT
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.block import Block
from rcdiag.records.report import Report

PARTS = ("position", "scale", "offset", "shape")
PLANTED = {
    "temperature_0.7": {"temperature_mismatch"},
    "temperature_0.9": {"temperature_mismatch"},
    "topk_50": {"sampling_truncation"},
    "topp_0.95": {"sampling_truncation"},
    "rope_low_precision": set(),  # sparse huge late tokens: outliers, not drift (DRIFT_ABS_RATIO_MIN)
    "drift": {"mismatch_trend"},
}
"""Each real-model scenario the default path is held to ``--explain`` on, and the detectors it fires."""
CLEAN = ("clean_fp32", "bf16", "fp16", "int4")
CLEAN_DEFECTS = ("kv_fp8", "stale")
SUMS_DETECTORS = tuple(code for code in DETECTORS if code != "token_specific")
"""What the default analyze runs (token_specific reads ``--explain``'s by-token table)."""


def _sums(state: DetectorState | ExplainState) -> dict[str, np.ndarray]:
    return {
        "position": state.position_sums,
        "scale": state.scale.sums,
        "offset": state.offset.sums,
        "shape": state.shape.sums,
    }


def _block(old, rollout, mask, lengths, compiled: bool) -> Block:  # type: ignore[no-untyped-def]
    rows = np.split(np.ones(old.shape[0], dtype=bool) if mask is None else mask, np.cumsum(lengths)[:-1])
    valid = np.array([np.count_nonzero(row) for row in rows], dtype=np.int64)
    return Block(NumpyBackend(compiled), old, rollout, valid, mask=mask, raw_lengths=lengths)


@settings(max_examples=80, deadline=None)
@given(data=blocks(), compiled=st.booleans())
def test_the_detectors_sums_are_the_explain_pass_without_its_breakdowns(data, compiled: bool) -> None:  # type: ignore[no-untyped-def]
    """On the kernel (``compiled``) and on its numpy twin: bit for bit what ``--explain``'s pass adds to the same
    sums, and the definitions' (tests/explain_sums_reference.py's brute force): counts exactly, sums to rounding."""
    old, rollout, mask, lengths = data
    block = _block(old, rollout, mask, lengths, compiled)
    slim, full = DetectorState(), ExplainState()
    with np.errstate(all="ignore"):
        slim.update(block)
        full._fold_sums(block)
    got = _sums(slim)
    for name, values in _sums(full).items():
        assert np.array_equal(got[name], values, equal_nan=True), name
    assert_sums_match(got, old, rollout, mask, lengths, names=PARTS)


def _detected(report: Report) -> dict[str, tuple]:
    return {
        f.code: (f.severity, f.message, f.value, f.threshold, f.evidence)
        for f in report.findings
        if f.code in SUMS_DETECTORS
    }


def _judged(report: Report) -> tuple:
    assert report.verdict is not None
    return report.verdict.status, [cause.cls for cause in report.verdict.causes]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("scenario", sorted(PLANTED))
def test_the_default_analyze_finds_what_explain_finds(scenario: str, seed: int) -> None:
    """Real-model dumps with a planted cause: the same findings (codes, messages, evidence), the same verdict, the
    same not-run reasons but token_specific's, and the planted detector fires."""
    path = dump(scenario, seed)
    plain, explained = rcdiag.analyze(path), rcdiag.analyze(path, explain=True)
    assert _detected(plain) == _detected(explained)
    assert set(_detected(plain)) == PLANTED[scenario]
    assert _judged(plain) == _judged(explained)
    assert plain.explain is None and plain.detectors is not None
    not_run = plain.to_dict()["detectors_not_run"]
    assert not_run.pop("token_specific") == NEEDS_EXPLAIN  # the real-model dumps carry token ids
    assert not_run == {k: v for k, v in explained.to_dict()["detectors_not_run"].items() if k != "token_specific"}


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.parquet")), ids=lambda p: p.stem)
def test_the_default_analyze_finds_what_explain_finds_on_the_samples(path: Path) -> None:
    """The same verdict too, but where token_specific (``--explain`` only) names the cause: the default analyze,
    which did not run it, calls that mismatch unexplained and says token_specific did not run."""
    plain, explained = rcdiag.analyze(path), rcdiag.analyze(path, explain=True)
    assert _detected(plain) == _detected(explained)
    if "token_specific" in {f.code for f in explained.findings}:
        assert _judged(plain)[1] == [c if c != "token_specific" else "unexplained" for c in _judged(explained)[1]]
        assert plain.to_dict()["detectors_not_run"] == {"token_specific": NEEDS_EXPLAIN}
    else:
        assert _judged(plain) == _judged(explained)


@pytest.mark.parametrize("name", ["stop_token", "rollout_temperature_only", "topk_offset", "position_drift"])
def test_the_kernel_gives_the_same_bits_with_and_without_explain(name: str) -> None:
    """The compiled pass (a backend built by the caller is kept: no small-dump path), token ids read or not."""
    from rcdiag.api import accumulate
    from rcdiag.explain.detector_section import DetectorSection
    from rcdiag.explain.section import ExplainSection

    path = SAMPLES / f"{name}.parquet"
    slim = accumulate(path, sections=[DetectorSection()], device=NumpyBackend()).state.whole_dump["detectors"]
    full = accumulate(path, sections=[ExplainSection()], device=NumpyBackend()).state.whole_dump["explain"]
    for part, values in _sums(full).items():
        assert np.array_equal(_sums(slim)[part], values, equal_nan=True), part


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scenario", [*CLEAN, *(f"defect:{d}" for d in CLEAN_DEFECTS)])
def test_no_false_alarm_on_clean_real_model_dumps(scenario: str, seed: int) -> None:
    """fp32, bf16, fp16, int4, a bf16 rollout with an fp8 KV cache, a policy one small step stale: no detector
    fires in the default analyze, and its verdict is healthy or correct (noise)."""
    path = (
        defect_dump(scenario.removeprefix("defect:"), seed) if scenario.startswith("defect:") else dump(scenario, seed)
    )
    report = rcdiag.analyze(path)
    assert not _detected(report)
    status, classes = _judged(report)
    assert status in ("healthy", "correct") and set(classes) <= {"noise"}, report.verdict


def _temperature() -> Path:
    return dump("temperature_0.7", 1)


def test_a_one_sided_temperature_is_fix_in_analyze_and_check(capsys: pytest.CaptureFixture) -> None:
    path = _temperature()
    assert _judged(rcdiag.analyze(path)) == ("fix", ["temperature"])
    code, out, _ = run(capsys, "analyze", path, "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["verdict"]["status"] == "fix"
    assert [c["class"] for c in report["verdict"]["causes"]] == ["temperature"]
    assert "temperature_mismatch" in {f["code"] for f in report["findings"]}
    code, out, _ = run(capsys, "check", path, "--pack", "analyze", "--format", "json")
    assert code == 1
    assert "temperature_mismatch" in {f["code"] for f in json.loads(out)["failing_findings"]}
    code, _, _ = run(capsys, "check", path, "--fail-on", "temperature_mismatch", "-q")
    assert code == 1


def test_a_one_sided_temperature_is_fix_in_compare(capsys: pytest.CaptureFixture) -> None:
    """Side b's verdict names the temperature, and the pair's noise comparison does not blame the engines."""
    code, out, _ = run(capsys, "compare", dump("clean_fp32", 1), _temperature(), "--format", "json")
    result = json.loads(out)
    assert code == 0
    assert result["verdicts"]["a"]["status"] == "healthy"
    b = result["verdicts"]["b"]
    assert (b["status"], [c["class"] for c in b["causes"]]) == ("fix", ["temperature"])
    assert not {"engine_noise_differs", "temperature_noise_mismatch"} & {f["code"] for f in result["findings"]}


def _steps_directory(source: Path, target: Path) -> Path:
    """The dump's rows as one file per step, as a trainer writes them."""
    target.mkdir()
    table = pq.read_table(source)
    for step in sorted(set(table.column("step").to_pylist())):
        pq.write_table(table.filter(pc.equal(table.column("step"), step)), target / f"step_{step:04d}.parquet")
    return target


def test_a_one_sided_temperature_is_fix_in_watch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``watch --once``: the temperature alerts at the first step (the detectors' sums of the run so far), the
    report of the run reads fix/temperature; a restart from the saved state judges the same."""
    steps = _steps_directory(next(_temperature().glob("*.parquet")).parent, tmp_path / "run")
    state = tmp_path / "watch.json"
    code, out, _ = run(capsys, "watch", steps, "--once", "--settle", "0", "--state", state, "--format", "json")
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    first = next(e for e in events if e["kind"] == "step")
    assert "finding:temperature_mismatch" in {a["key"] for a in first["alerts"]}
    report = [e for e in events if e["kind"] == "report"][-1]
    assert report["verdict"]["status"] == "fix" and "temperature" in report["verdict"]["headline"]
    assert "temperature_mismatch" in {f["code"] for f in report["findings"]}
    merged, one = rcdiag.merge_states([state]), rcdiag.analyze(steps)  # the watch's state holds the detectors' sums
    assert set(_detected(merged)) == set(_detected(one)) == {"temperature_mismatch"}  # (merged file by file: the
    assert _judged(merged) == _judged(one)  # sums agree to float64 rounding, not bit for bit)


def test_a_climbing_mismatch_alerts_at_a_step_in_watch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """mismatch_trend is a per-step rule: it alerts at the step where the growth clears the fit, and the run's
    verdict is not healthy."""
    steps = _steps_directory(SAMPLES / "step_trend.parquet", tmp_path / "run")
    code, out, _ = run(capsys, "watch", steps, "--once", "--settle", "0", "--state", tmp_path / "w.json",
                       "--format", "json")  # fmt: skip
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    alerted = [e["step"] for e in events if e["kind"] == "step" and any(
        a["key"] == "finding:mismatch_trend" for a in e["alerts"])]  # fmt: skip
    assert alerted == [3]  # four steps are the fit's minimum (TREND_MIN_STEPS)
    report = [e for e in events if e["kind"] == "report"][-1]
    assert report["verdict"]["status"] == "fix" and "across steps" in report["verdict"]["headline"]


def test_a_one_sided_temperature_leads_the_sweep(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "sweep", _temperature(), "--format", "json")
    assert code == 0
    assert [f["code"] for f in json.loads(out)["findings"] if f["severity"] == "warning"] == ["temperature_mismatch"]
    code, out, _ = run(capsys, "sweep", dump("bf16", 1), "--format", "json")
    assert [f["code"] for f in json.loads(out)["findings"]] == []


def test_saved_states_carry_the_sums_so_merge_judges_as_one_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two shards' states merged: the detectors find what one analyze of both finds (the sums merge by addition,
    float64 rounding aside: the messages quote 3 digits); ``--workers 2`` too."""
    files = sorted(_temperature().glob("*.parquet"))
    shards = [tmp_path / "a", tmp_path / "b"]
    for shard, part in zip(shards, (files[:2], files[2:]), strict=True):
        shard.mkdir()
        for file in part:
            shutil.copy(file, shard / file.name)
    states = []
    for shard in shards:
        states.append(tmp_path / f"{shard.name}.json")
        assert run(capsys, "analyze", shard, "--save-state", states[-1], "-q")[0] == 0
        assert "detectors" in json.loads(states[-1].read_text())["state"]["whole_dump"]
    whole = tmp_path / "whole"
    whole.mkdir()
    for file in files:
        shutil.copy(file, whole / file.name)
    merged, one = rcdiag.merge_states(states), rcdiag.analyze(whole)
    assert set(_detected(merged)) == set(_detected(one)) == {"temperature_mismatch"}
    assert _judged(merged) == _judged(one)
    assert merged.to_dict()["detectors_not_run"] == one.to_dict()["detectors_not_run"]
    workers = rcdiag.analyze(whole, workers=2)
    assert set(_detected(workers)) == {"temperature_mismatch"} and _judged(workers) == _judged(one)


def test_token_specific_says_why_it_did_not_run() -> None:
    """A dump with token ids: the default analyze leaves the by-token table to --explain, and says so (never "not
    examined", never silence); --explain runs it."""
    path = SAMPLES / "stop_token.parquet"
    plain = rcdiag.analyze(path)
    assert plain.to_dict()["detectors_not_run"] == {"token_specific": NEEDS_EXPLAIN}
    assert plain.verdict is not None
    assert f"token_specific not run: {NEEDS_EXPLAIN.removeprefix('not run: ')}" in plain.verdict.next_steps
    assert not any("not examined" in step for step in plain.verdict.next_steps)
    explained = rcdiag.analyze(path, explain=True)
    assert "token_specific" in {f.code for f in explained.findings}
    assert explained.to_dict()["detectors_not_run"] == {}


def test_chunks_built_by_hand_are_judged_too() -> None:
    """``rcdiag.analyze_chunks`` runs the detectors as analyze does."""
    table = pq.read_table(SAMPLES / "rollout_temperature_only.parquet")
    lengths = np.asarray(pc.list_value_length(table.column("old_log_prob")), dtype=np.int64)
    chunk = rcdiag.Chunk(
        np.asarray(pc.list_flatten(table.column("old_log_prob")), dtype=np.float32),
        np.asarray(pc.list_flatten(table.column("rollout_log_prob")), dtype=np.float32),
        np.concatenate([[0], np.cumsum(lengths)]),
        np.asarray(pc.list_flatten(table.column("response_mask")), dtype=bool),
    )
    report = rcdiag.analyze_chunks([chunk])
    assert "temperature_mismatch" in _detected(report)
    assert report.to_dict()["detectors_not_run"]["token_specific"] == NOT_BUILT


def test_the_torch_backend_finds_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--device cuda`` (here torch on the CPU) runs the detectors' pass on the host, as ``--explain``'s: the same
    findings as the CPU's kernels."""
    pytest.importorskip("torch", reason="pip install torch to compare the torch backend")
    from rcdiag.kernels.small import SWITCH

    monkeypatch.setenv(SWITCH, "0")  # the CPU's kernels, not a small dump's numpy path
    for name in ("rollout_temperature_only", "topk_offset", "position_drift"):
        path = SAMPLES / f"{name}.parquet"
        cpu, torch_cpu = rcdiag.analyze(path), rcdiag.analyze(path, device="torch-cpu")
        assert _detected(cpu) == _detected(torch_cpu), name
        assert _detected(cpu), name
