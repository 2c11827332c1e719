"""``rcdiag analyze --as trl`` on dumps holding the current policy's log-probs and the advantages: the loss's clip
keys (``clip_ratio/*``, ``cispo_clip_ratio``) against TRL 1.16.0's own ``_compute_loss`` lines
(tests/framework_oracles.py), per step and pooled, on a real-model dump and synthetic ones with padding, empty and
fully masked rows and long responses, per-row and per-token advantages, under TRL's defaults and four other settings;
without the columns the keys are left out with a note naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from framework_cases import (
    all_rows,
    close,
    dump_inputs,
    dump_rows,
    padded,
    padded_inputs,
    synthetic_dump,
    with_loss_inputs,
)
from framework_oracles import require, trl_loss_metrics

import rcdiag

SETTINGS = (
    {},
    {"epsilon_high": 0.28, "delta": 1.5},
    {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 0.05},
    {"loss_type": "cispo", "epsilon_high": 1.1},
    {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 0.02, "epsilon_high": 0.03},
)
KEYS = ("clip_ratio/", "cispo_clip_ratio")


def _dumps(tmp_path: Path) -> list[Path]:
    from shape_dumps import dump

    return [
        with_loss_inputs(dump("bf16", 0), tmp_path / "real", 0),
        with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "s0", 0),
        with_loss_inputs(synthetic_dump(tmp_path, 1, scale=0.3), tmp_path / "s1", 1, per_row=False),
    ]


def _row_advantages(path: Path) -> dict:
    """Each step's per-row advantages as TRL's GRPOTrainer holds them, (B,), for a dump of one per row."""
    table = pq.read_table(path)
    out: dict = {}
    for a, s in zip(table.column("advantages").to_pylist(), table.column("step").to_pylist(), strict=True):
        out.setdefault(s, []).append(a)
    return out


def _views(report: rcdiag.Report, path: Path) -> list:
    steps, inputs = dump_rows(path), dump_inputs(path)
    per_row = not pq.read_schema(path).field("advantages").type.num_fields  # a list type has one field
    rows = _row_advantages(path) if per_row else {}
    order = sorted(steps, key=lambda s: (s is None, s or 0))
    views = [(s.metrics, steps[s.step], inputs[s.step], rows.get(s.step)) for s in report.steps]
    pooled_rows = [a for s in order for a in rows[s]] if per_row else None
    pooled = (report.metrics, all_rows(steps), [r for s in order for r in inputs[s]], pooled_rows)
    return [*views, pooled]


@pytest.mark.parametrize("options", SETTINGS, ids=["defaults", "dapo_delta", "grpo_sequence", "cispo", "luspo"])
def test_trl_clip_keys_match_its_own_code(options: dict, tmp_path: Path) -> None:
    torch = require("trl")
    compared = 0
    for path in _dumps(tmp_path):
        report = rcdiag.analyze(path, framework="trl", framework_options=options)
        sequence = options.get("importance_sampling_level") == "sequence"
        for metrics, rows, inputs, row_advantages in _views(report, path):
            ours = {k: v for k, v in metrics.items() if k.startswith(KEYS)}
            if sequence and row_advantages is None:  # advantages per token: TRL's (B,) cannot hold them
                assert ours == {}, (path.name, options)
                continue
            old, _, mask = padded(rows)
            current, advantages = padded_inputs(inputs)
            if row_advantages is not None:
                advantages = torch.tensor(row_advantages, dtype=torch.float32)
            theirs = trl_loss_metrics(old, current, mask, advantages, **options)
            assert list(ours) == list(theirs), (path.name, options, list(ours), list(theirs))
            for key, value in theirs.items():
                assert close(ours[key], value), (path.name, options, key, ours[key], value)
                compared += 1
    assert compared >= 13


def test_trl_clip_keys_are_not_all_zero(tmp_path: Path) -> None:
    """The settings above clip on these dumps: every key is somewhere above 0."""
    path = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "s0", 0)
    metrics = rcdiag.analyze(path, framework="trl").metrics
    assert all(metrics[key] > 0 for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/high_max"))
    cispo = rcdiag.analyze(path, framework="trl", framework_options={"loss_type": "cispo", "epsilon_high": 1.1})
    assert cispo.metrics["cispo_clip_ratio"] > 0


def test_trl_clip_keys_left_out_with_a_note_without_the_columns(tmp_path: Path) -> None:
    path = synthetic_dump(tmp_path, 0)
    report = rcdiag.analyze(path, framework="trl")
    assert not [k for k in report.metrics if k.startswith(KEYS)]
    record = report.sections["framework"]
    note = next(n for n in record.notes if n.startswith("left out: clip_ratio/low_mean"))
    assert "'log_prob' (--current-col NAME)" in note and "'advantages' (--advantages-col NAME)" in note
    with_inputs = rcdiag.analyze(with_loss_inputs(path, tmp_path / "in", 0), framework="trl").sections["framework"]
    assert not [n for n in with_inputs.notes if "clip_ratio/low_mean" in n]


def test_trl_clip_keys_through_the_cli_with_named_columns(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Columns under other names, given with --current-col and --advantages-col: the same values."""
    import json

    import pyarrow as pa

    from rcdiag.cli import app

    path = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "in", 0)
    table = pq.read_table(path).rename_columns(["old_log_prob", "rollout_log_prob", "response_mask", "step", "pi",
                                                "adv"])  # fmt: skip
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(table, renamed)
    with pytest.raises(SystemExit) as exited:
        app(["analyze", str(renamed), "--as", "trl", "--current-col", "pi", "--advantages-col", "adv", "--format",
             "json", "-q"], standalone_mode=True)  # fmt: skip
    assert exited.value.code == 0
    got = json.loads(capsys.readouterr().out)
    want = rcdiag.analyze(path, framework="trl").metrics
    for key in ("clip_ratio/low_mean", "clip_ratio/high_max"):
        assert got["metrics"][key] == pytest.approx(want[key], rel=1e-12)
    assert got["input"]["columns"]["advantages"] == "adv" and got["input"]["columns"]["log_prob"] == "pi"
    assert pa is not None and np is not None


def test_the_loss_inputs_are_read_only_for_as(tmp_path: Path) -> None:
    """A plain analyze neither decodes nor checks the optional loss inputs: an ``advantages`` column whose lists
    do not match the log-probs' lengths is not read (the report as without it); ``--as`` reads it and stops at
    the row, naming the column."""
    import pyarrow as pa

    old = [[-1.0, -0.5, -2.0], [-0.3, -0.7]]
    rollout = [[-1.1, -0.5, -1.9], [-0.3, -0.8]]
    table = {"old_log_prob": old, "rollout_log_prob": rollout, "response_mask": [[1, 1, 1], [1, 1]]}
    plain, bad = tmp_path / "plain.parquet", tmp_path / "bad.parquet"
    pq.write_table(pa.table(table), plain)
    pq.write_table(pa.table({**table, "advantages": [[0.5, 0.5, 0.5], [0.5]]}), bad)
    without = rcdiag.analyze(plain).to_dict()
    report = rcdiag.analyze(bad).to_dict()
    assert report["metrics"] == without["metrics"] and "advantages" not in report["input"]["columns"]
    with pytest.raises(rcdiag.InputError, match="advantages"):
        rcdiag.analyze(bad, framework="trl")
