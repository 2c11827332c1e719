"""DumpWriter's durability contract and the reading progress callback / bar."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, assert_metrics_close, padded_chunk, random_batch

import rcdiag
from rcdiag.cli import main
from rcdiag.cli import progress as cli_progress


def test_writer_survives_a_kill_between_steps(tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(5), rows=16, width=10)
    writer = rcdiag.DumpWriter(tmp_path / "run", metadata={"temperature": 0.6})
    writer.write(step=0, old_log_prob=old[:8], rollout_log_prob=rollout[:8], response_mask=mask[:8])
    part = writer.write(step=1, old_log_prob=old[8:], rollout_log_prob=rollout[8:], response_mask=mask[8:])
    # a process killed while writing step 2 leaves a hidden, half-written temporary file
    (tmp_path / "run" / f".step-000000002-0000.parquet.{12345}.tmp").write_bytes(part.read_bytes()[:100])
    report = rcdiag.analyze(tmp_path / "run")
    expected = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask, steps=np.repeat([0, 1], 8))])
    assert_metrics_close(report.metrics, expected.metrics, rel=1e-9, abs_tol=1e-12)
    assert report.input.files == 2 and report.input.metadata["temperature"] == "0.6"
    assert sorted(p.name for p in (tmp_path / "run").glob("*.parquet")) == [
        "step-000000000-0000.parquet", "step-000000001-0000.parquet",
    ]  # fmt: skip
    table = pq.read_table(part)
    assert table.schema.field("old_log_prob").type == pa.list_(pa.float32())
    assert table.schema.field("response_mask").type == pa.list_(pa.int8())
    assert table.schema.metadata[b"temperature"] == b"0.6"


def test_writer_accepts_tensors_lists_and_repeated_steps(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    writer = rcdiag.DumpWriter(tmp_path)
    writer.write(
        step=3,
        old_log_prob=torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.bfloat16),
        rollout_log_prob=torch.tensor([[-1.5, -2.0, 0.0]]),
        response_mask=torch.tensor([[1, 1, 0]]),
    )
    second = writer.write(step=3, old_log_prob=[[-0.5]], rollout_log_prob=[[-0.25]])
    assert second.name == "step-000000003-0001.parquet"
    report = rcdiag.analyze(tmp_path)
    assert (report.input.rows, report.input.tokens, report.input.valid_tokens) == (2, 3, 3)
    assert report.metrics["rollout_corr/kl"] == pytest.approx(((-1.5 + 1.0) + 0.0 + (-0.25 + 0.5)) / 3)
    with pytest.raises(ValueError, match="row 0: old_log_prob, rollout_log_prob and response_mask have 2, 1"):
        writer.write(step=4, old_log_prob=[[-1.0, -1.0]], rollout_log_prob=[[-1.0]], response_mask=[[1, 1]])
    with pytest.raises(ValueError, match="have 1, 2 and 1 rows"):
        writer.write(step=4, old_log_prob=[[-1.0]], rollout_log_prob=[[-1.0], [-1.0]], response_mask=[[1]])


def test_writer_names_only_the_arrays_it_was_given(tmp_path: Path) -> None:
    writer = rcdiag.DumpWriter(tmp_path)
    with pytest.raises(ValueError, match=r"^row 0: old_log_prob and rollout_log_prob have 2 and 1 tokens; they must"):
        writer.write(step=4, old_log_prob=[[-1.0, -1.0]], rollout_log_prob=[[-1.0]])
    with pytest.raises(ValueError, match=r"^old_log_prob and rollout_log_prob have 1 and 2 rows; they must"):
        writer.write(step=4, old_log_prob=[[-1.0]], rollout_log_prob=[[-1.0], [-1.0]])
    assert list(tmp_path.iterdir()) == []


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("old", "rollout", "mask", "step", "message"),
    [
        ([[-1.0, NAN]], [[-1.0, -1.0]], None, 0, "row 0, position 1: old_log_prob holds NaN"),
        ([[-1.0], [-1.0]], [[-1.0], [INF]], None, 0, "row 1, position 0: rollout_log_prob holds +inf"),
        ([[0.5, -1.0]], [[-1.0, -1.0]], None, 0, "row 0, position 0: old_log_prob holds a positive log-prob (0.5)"),
        ([[-1.0, -1.0]], [[-1.0, -1.0]], [[1, 2]], 0, "row 0, position 1: response_mask holds the mask value 2 (a mask must be 0 or 1)"),
        ([[-1.0]], [[-1.0]], None, NAN, "step must be an integer training step, got nan"),
        ([[-1.0]], [[-1.0]], None, 2.5, "step must be an integer training step, got 2.5"),
    ],
    ids=["NaN", "+inf", "positive", "mask 2", "NaN step", "fractional step"],
)
def test_writer_refuses_what_analyze_would_refuse(
    tmp_path: Path, old: list, rollout: list, mask: list | None, step: object, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rcdiag.DumpWriter(tmp_path).write(step=step, old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)
    assert [p for p in tmp_path.iterdir() if p.suffix == ".parquet"] == []


def test_writer_accepts_nan_where_the_mask_is_zero_and_minus_inf(tmp_path: Path) -> None:
    writer = rcdiag.DumpWriter(tmp_path)
    nan, inf = float("nan"), float("inf")
    writer.write(
        step=np.int64(2),
        old_log_prob=[[-1.0, nan, -inf, nan]],
        rollout_log_prob=[[-1.5, nan, -2.0, nan]],
        response_mask=[[1, 0, 1, 0]],
    )
    report = rcdiag.analyze(tmp_path)
    assert report.input.valid_tokens == 2 and report.input.neg_inf_tokens["old_log_prob"] == 1
    assert [s.step for s in report.steps] == [2]


def test_progress_callback_counts_every_row(tmp_path: Path) -> None:
    events = []
    report = rcdiag.analyze(
        ROOT / "sample_data" / "healthy.parquet",
        chunk_tokens=5000,
        on_chunk=events.append,
    )
    assert len(events) > 5
    assert [e.rows for e in events] == sorted(e.rows for e in events)
    assert events[-1].rows == events[-1].total_rows == report.input.rows == 384
    assert events[-1].tokens == report.input.tokens


def test_progress_bar_only_on_an_interactive_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert cli_progress.wanted(quiet=False, json_to_stdout=False)
    assert not cli_progress.wanted(quiet=True, json_to_stdout=False)
    assert not cli_progress.wanted(quiet=False, json_to_stdout=True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert cli_progress.wanted(quiet=False, json_to_stdout=True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not cli_progress.wanted(quiet=False, json_to_stdout=False)


def test_progress_bar_drives_rich(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = cli_progress.progress_bar

    def spy(enabled: bool) -> object:
        calls.append(enabled)
        return real(True)

    monkeypatch.setattr(cli_progress, "progress_bar", spy)
    sample = str(ROOT / "sample_data" / "healthy.parquet")
    with pytest.raises(SystemExit) as info:
        main(["analyze", sample, "--chunk-tokens", "4000", "--format", "json"])
    assert info.value.code == 0 and calls == [False]
    assert '"rows": 384' in capsys.readouterr().out
