"""``analyze --explain --html``: the breakdown charts, the worst-responses table and the per-token traces of the
worst responses (bounded, mergeable, independent of chunking and workers), checked in a real browser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES, run
from page_checks import opened

import rcdiag
from rcdiag.explain.worst import PLOTTED, TRACE_POINTS, token_trace
from rcdiag.render.text import BREAKDOWNS

pytest.importorskip("matplotlib")
DRIFT = SAMPLES / "position_drift.parquet"


def lists(table: object, column: str, row: int) -> np.ndarray:
    return np.asarray(table.column(column)[row].as_py(), dtype=np.float32)  # type: ignore[attr-defined]


def test_a_short_trace_is_every_valid_token_at_its_list_position() -> None:
    lr = np.array([0.1, -0.2, 0.3], dtype=np.float32)
    trace = token_trace(7, lr, np.array([0, 1, 0, 1, 1], dtype=bool))
    assert trace.row == 7 and trace.positions == (1, 3, 4)
    assert trace.log_ratios == tuple(float(v) for v in lr)


def test_a_long_trace_keeps_each_runs_extremes() -> None:
    rng = np.random.default_rng(0)
    lr = rng.normal(0, 0.1, 10_000).astype(np.float32)
    lr[1234], lr[8765] = 5.0, -7.0
    trace = token_trace(0, lr, None)
    assert len(trace.positions) <= TRACE_POINTS and list(trace.positions) == sorted(trace.positions)
    assert dict(zip(trace.positions, trace.log_ratios, strict=True))[1234] == 5.0
    assert dict(zip(trace.positions, trace.log_ratios, strict=True))[8765] == -7.0
    for run_values in np.array_split(lr, TRACE_POINTS // 2):  # 256 runs of 39 or 40 tokens: each keeps both
        assert float(run_values.max()) in trace.log_ratios and float(run_values.min()) in trace.log_ratios


def _thinned_by_loop(lr: np.ndarray) -> list[int]:
    """Brute force: per run of ``np.array_split``, the first lowest and highest value ignoring NaN, or the run's
    first position when it holds no finite value."""
    kept: set[int] = set()
    for span in np.array_split(np.arange(lr.shape[0]), TRACE_POINTS // 2):
        values = lr[span]
        if np.isfinite(values).any():
            kept.update((int(span[np.nanargmin(values)]), int(span[np.nanargmax(values)])))
        else:
            kept.add(int(span[0]))
    return sorted(kept)


@pytest.mark.parametrize("seed", range(6))
def test_a_long_trace_keeps_the_points_a_loop_over_the_runs_keeps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(TRACE_POINTS + 1, 20_000))
    lr = np.round(rng.normal(0, 1, n), 1).astype(np.float32)  # rounded: ties inside runs
    for special, share in ((np.nan, 0.05 * seed), (np.inf, 0.01), (-np.inf, 0.01)):
        lr[rng.random(n) < share] = special
    lr[: n // 7] = np.nan  # runs holding no finite value
    trace = token_trace(3, lr, None)
    assert list(trace.positions) == _thinned_by_loop(lr)
    np.testing.assert_array_equal(np.asarray(trace.log_ratios, dtype=np.float32), lr[list(trace.positions)])


@pytest.mark.parametrize("workers", [1, 2])
def test_traces_are_the_worst_responses_tokens_whatever_the_chunking(workers: int) -> None:
    table = pq.read_table(DRIFT)
    whole = rcdiag.analyze(DRIFT, explain=True)
    split = rcdiag.analyze(DRIFT, explain=True, chunk_tokens=5000, workers=workers)
    assert whole.explain.traces == split.explain.traces  # type: ignore[union-attr]
    traces = whole.explain.traces  # type: ignore[union-attr]
    assert [t.row for t in traces] == [w.row for w in whole.explain.worst_sequences[:PLOTTED]]  # type: ignore[union-attr]
    for trace in traces:
        mask = np.asarray(table.column("response_mask")[trace.row].as_py(), dtype=bool)
        lr = (lists(table, "old_log_prob", trace.row) - lists(table, "rollout_log_prob", trace.row))[mask]
        positions = np.flatnonzero(mask)
        if lr.size <= TRACE_POINTS:
            assert trace.positions == tuple(positions.tolist()) and trace.log_ratios == tuple(lr.tolist())
        else:
            at = np.searchsorted(positions, trace.positions)
            assert np.array_equal(lr[at], np.asarray(trace.log_ratios, dtype=np.float32))
            assert float(lr.max()) in trace.log_ratios and float(lr.min()) in trace.log_ratios


def test_saved_states_carry_the_traces(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table = pq.read_table(DRIFT)
    halves = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(table.slice(0, 200), halves[0])
    pq.write_table(table.slice(200), halves[1])
    for half in halves:
        assert (
            run(capsys, "analyze", str(half), "--explain", "-q", "--save-state", f"{half}.json", "-o", f"{half}.txt")[0]
            == 0
        )
    merged = rcdiag.merge_states([f"{h}.json" for h in halves])
    assert merged.explain.traces == rcdiag.analyze(DRIFT, explain=True).explain.traces  # type: ignore[union-attr]


def test_explain_html_opens_offline_with_breakdowns_worst_and_traces(
    browser: object,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    page, load, _ = opened(browser, capsys, tmp_path, "analyze", str(DRIFT), "--explain")
    report = rcdiag.analyze(DRIFT, explain=True)
    assert "position_drift" in {f.code for f in report.findings}
    for finding in report.findings:
        assert finding.code in load.text and finding.message in load.text
    for title in BREAKDOWNS.values():
        assert title in load.text
    text = page.read_text()
    assert text.count('class="chart"') == 6 + 3 + PLOTTED  # trends, breakdowns, traces (and the histogram: wide)
    for worst in report.explain.worst_sequences[:PLOTTED]:  # type: ignore[union-attr]
        assert f"row {worst.row}, step {worst.step}" in load.text
    assert len(text) < 5_000_000
