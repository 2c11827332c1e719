"""Tests that kill the mutants a planted-bug probe left alive (issue 33 item 7).

Each test pins one behaviour no other test pinned, against a value computed here independently: the rows-read count
two workers merge, the watch forecast's horizon counted from the last step, the by-token table's multiple-testing
correction, the token detector's share cap, a token exactly on a token_k1 lower bound in a sweep grid, and a
NeMo-RL record without ``sample_loss_mask`` after one with it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import padded_chunk, run

import rcdiag
from rcdiag.explain import token_detector
from rcdiag.explain.by_token import ALPHA, MIN_COUNT, SUMS, TokenStats, _token_stats
from rcdiag.watch.alerts import AlertPolicy
from rcdiag.watch.forecast import Forecast

# ------------------------------------------------------------------ a merge keeps both sides' rows read


def _all_bad_dump(path: Path, rows: int = 40) -> Path:
    """``rows`` responses of 3 tokens, each with a NaN trainer log-prob, in two row groups (two worker parts)."""
    old = [[-0.5, math.nan, -0.25] for _ in range(rows)]
    rollout = [[-0.5, -0.5, -0.25] for _ in range(rows)]
    table = pa.table(
        {
            "old_log_prob": pa.array(old, pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(rollout, pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path, row_group_size=rows // 2)
    return path


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_row_skipped_counts_the_rows_of_every_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture, workers: str
) -> None:
    """With ``--on-bad-row skip`` on a dump whose every row is bad, the run refuses with the count of all 40 rows:
    a merge that dropped one worker's rows read would see 40 skipped of 20 read and go on."""
    path = _all_bad_dump(tmp_path / "bad.parquet")
    code, _, err = run(capsys, "analyze", str(path), "--on-bad-row", "skip", "--workers", workers)
    assert code == 2, err
    assert "every row was skipped (40 rows" in err, err
    code, _, err = run(capsys, "analyze", str(path), "--workers", workers)
    assert code == 2 and "every row of the dump is bad (40 rows" in err, err


# ------------------------------------------------------------------ the forecast horizon from the last step


def _forecast(last_step: int, expected: float) -> Forecast:
    return Forecast(
        "rollout_corr/kl", 0.1, "above", last_step, 8, 0.001, 0.0001, 0.95, expected, last_step + 1, last_step + 40
    )


@pytest.mark.parametrize(("ahead", "alerts"), [(49.0, True), (50.0, True), (50.5, False), (200.0, False)])
def test_a_forecast_alerts_within_the_horizon_after_the_last_step(
    monkeypatch: pytest.MonkeyPatch, ahead: float, alerts: bool
) -> None:
    """The horizon (50 steps) counts from the last step read, not from step 0: a run at step 1000 whose crossing
    is expected 49 or 50 steps later alerts; 50.5 or 200 steps later does not."""
    policy = AlertPolicy(horizon=50)
    forecast = _forecast(1000, 1000 + ahead)
    monkeypatch.setattr(AlertPolicy, "trends", lambda self, report: ([forecast], []))
    found, forecasts, _ = policy.on_step(SimpleNamespace(metrics={}, extras={}, steps=()), 1000, ())  # type: ignore[arg-type]
    assert forecasts == [forecast]
    assert [a.kind for a in found] == (["forecast"] if alerts else [])


# ------------------------------------------------------------------ the by-token table's Bonferroni correction


def _table(counts: np.ndarray, means: np.ndarray, spread: float) -> SimpleNamespace:
    """A by-token table (``SUMS`` columns) whose ids have these counts and mean |log-ratio| values, each id's
    |log-ratio| spread ``spread`` around its mean."""
    table = np.zeros((counts.size, len(SUMS)))
    table[:, SUMS.index("tokens")] = counts
    table[:, SUMS.index("abs_lr")] = counts * means
    table[:, SUMS.index("k3")] = counts * means**2 / 2
    table[:, SUMS.index("lr_sq")] = counts * (means**2 + spread**2)
    ids = np.arange(counts.size, dtype=np.int64)
    return SimpleNamespace(table=lambda: (ids, table))


def test_the_token_tests_critical_value_is_bonferroni_over_the_ids_tested() -> None:
    """100 ids with 20+ tokens are tested (5 with fewer are not): the critical z is the normal quantile of
    1 - 0.01 / 100 (3.719), not the single test's 2.326; an id whose z lies between them is not significant."""
    counts = np.array([200] * 100 + [MIN_COUNT - 1] * 5, dtype=np.float64)
    means = np.full(counts.size, 0.01)
    stats = _token_stats(_table(counts, means, 0.01))
    assert stats.tested == 100
    assert stats.z_critical == pytest.approx(NormalDist().inv_cdf(1 - ALPHA / 100), rel=1e-12)
    assert stats.z_critical == pytest.approx(3.7190, abs=1e-4)
    # id 0's mean raised so that its z is about 3 (between 2.326 and 3.719): computed here from its definition
    means[0] = 0.01 + 3.0 * math.sqrt(0.01**2 / 200 + 0.01**2 / (99 * 200))
    stats = _token_stats(_table(counts, means, 0.01))
    assert 2.5 < stats.z[0] < stats.z_critical
    assert not stats.significant[0]


# ------------------------------------------------------------------ the token detector's share cap


def _stats(token_share: float) -> TokenStats:
    """Three ids over 10,000 tokens: id 7 carries 60% of the k3 on ``token_share`` of the tokens, significant."""
    total_tokens = 10_000
    n7 = token_share * total_tokens
    sums = np.zeros((3, len(SUMS)))
    sums[:, 0] = [n7, 3000, total_tokens - 3000 - n7]
    sums[:, 3] = [0.6, 0.25, 0.15]
    return TokenStats(
        ids=np.array([7, 8, 9]),
        sums=sums,
        total=sums.sum(axis=0),
        z=np.array([10.0, 0.5, -1.0]),
        z_critical=3.0,
        tested=3,
    )


@pytest.mark.parametrize(("token_share", "fires"), [(0.04, True), (0.05, True), (0.0501, False), (0.2, False)])
def test_the_token_detector_caps_the_ids_share_of_tokens(token_share: float, fires: bool) -> None:
    """The ids must carry at least half the k3 while being at most 5% of the valid tokens (inclusive): 60% of the
    k3 on 20% of the tokens is no token-specific mismatch."""
    assert token_detector.TOKEN_SHARE_MAX == 0.05
    chosen = token_detector.concentrated(_stats(token_share))
    assert chosen == ([0] if fires else [])


# ------------------------------------------------------------------ a sweep grid point exactly on a k1 bound


def test_a_sweep_grid_keeps_a_token_exactly_on_its_k1_lower_bound() -> None:
    """Log-ratios old - rollout of -0.25 .. 0.25 (exact in float32) against a grid of three token_k1 bands whose
    lower bounds in log space are -0.125, -0.25 and -0.375: verl keeps a token whose -log-ratio (k1 = rollout -
    old) lies exactly on the lower bound, so each row rejects the tokens strictly below it, counted here."""
    from rcdiag.sweep import sweep_chunks
    from rcdiag.sweep.grid import build_grid, resolve

    d = np.array([-0.25, -0.125, 0.0, 0.125, 0.25, 0.375, 0.0625, -0.0625], dtype=np.float32)
    old = np.full((1, d.size), -1.0, dtype=np.float32)
    rollout = old - d[None, :]
    assert (old - rollout == d).all()
    k1 = -d.astype(np.float64)  # verl's k1 is rollout - old
    chunk = padded_chunk(old, rollout, np.ones_like(old, dtype=np.int64))
    specs = [f"{math.exp(lo)!r}_{math.exp(1.0)!r}" for lo in (-0.125, -0.25, -0.375)]
    grid = build_grid(None, ["token_k1"], specs)
    rows = sweep_chunks([chunk], grid, target_reject=None).rows
    assert len(rows) == 3
    key = "rollout_corr/rollout_rs_token_k1_masked_fraction"
    for row, lo in zip(sorted(rows, key=lambda r: -r.metrics[key]), (-0.125, -0.25, -0.375), strict=True):
        assert round(row.metrics[key] * d.size) == int(np.count_nonzero(k1 < lo)), (lo, row.option)
        expected = rcdiag.analyze_chunks([chunk], resolve("token_k1", f"{math.exp(lo)!r}_{math.exp(1.0)!r}")
                                         .config("token_k1")).metrics[key]  # fmt: skip
        assert row.metrics[key] == expected


# ------------------------------------------------------------------ NeMo-RL: sample_loss_mask missing from a record


def test_a_nemo_rl_record_without_sample_loss_mask_counts_whole(tmp_path: Path) -> None:
    """NeMo-RL's mask is token_loss_mask times sample_loss_mask; a record that lacks sample_loss_mask (after a first
    record that has it) multiplies by 1: all its masked-in tokens stay valid, and so does every later record."""
    lines = []
    for i in range(4):
        record = {
            "token_ids": [[1, 2, 3, 4]],
            "token_loss_mask": [[0, 1, 1, 1]],
            "generation_logprobs": [[0.0, -0.5, -0.25, -1.0]],
            "prev_logprobs": [[-0.1, -0.5, -0.3, -1.0]],
            "input_lengths": [4],
        }
        if i in (0, 2):
            record["sample_loss_mask"] = [1.0] if i == 0 else [0.0]
        lines.append(json.dumps(record))
    path = tmp_path / "train_data_step1.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = rcdiag.analyze(path)
    assert report.input.columns["response_mask"] == "token_loss_mask * sample_loss_mask"
    assert report.input.valid_tokens == 3 * 3  # records 0, 1 and 3; record 2's sample mask is 0
    assert report.input.empty_rows == 1
