"""slime's ``train/ois`` and SkyRL's ``policy/minibatch_rollout_logprobs_abs_diff_*``, the keys each logs from the
current policy's log-probs alone: computed where the dump has that column (their values are checked against each
framework's own code by tests/frameworks/test_frameworks_harness.py, on the harness's dumps with a current policy,
a real-model one and one with a step without a valid token), left out with a note naming the column where it has
not, and read under another name through ``--current-col``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from framework_cases import synthetic_dump, with_loss_inputs

import rcdiag

OIS = "train/ois"
MINIBATCH = tuple(f"policy/minibatch_rollout_logprobs_abs_diff_{s}" for s in ("mean", "max", "min", "std"))
CASES = [("slime", {"use_tis": True}, (OIS,)), ("skyrl", {}, MINIBATCH)]


@pytest.mark.parametrize(("name", "options", "keys"), CASES, ids=["slime", "skyrl"])
def test_left_out_with_a_note_naming_the_column(name: str, options: dict, keys: tuple, tmp_path: Path) -> None:
    path = synthetic_dump(tmp_path, 0)
    report = rcdiag.analyze(path, framework=name, framework_options=options)
    assert not set(keys) & set(report.metrics)
    assert all(not set(keys) & set(step.metrics) for step in report.steps)
    note = next(n for n in report.sections["framework"].notes if n.startswith(f"left out: {keys[0]}"))
    assert "'log_prob' (--current-col NAME)" in note and "advantages" not in note
    current_only = tmp_path / "current.parquet"
    pq.write_table(pq.read_table(with_loss_inputs(path, tmp_path / "in", 0)).drop_columns(["advantages"]), current_only)
    with_current = rcdiag.analyze(current_only, framework=name, framework_options=options)
    assert list(keys) == [k for k in with_current.metrics if k in keys]
    assert not [n for n in with_current.sections["framework"].notes if n.startswith(f"left out: {keys[0]}")]


def test_slime_logs_no_ois_where_the_tis_function_does_not_run(tmp_path: Path) -> None:
    """slime computes ``ois`` inside its TIS block: under its defaults no key with the column, no note without."""
    path = synthetic_dump(tmp_path, 0)
    for dump in (path, with_loss_inputs(path, tmp_path / "in", 0)):
        report = rcdiag.analyze(dump, framework="slime")
        assert OIS not in report.metrics
        assert not [n for n in report.sections["framework"].notes if n.startswith(f"left out: {OIS}")]


@pytest.mark.parametrize(("name", "options", "keys"), CASES, ids=["slime", "skyrl"])
def test_through_the_cli_under_another_column_name(
    name: str, options: dict, keys: tuple, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from rcdiag.cli import app

    path = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "in", 0)
    table = pq.read_table(path).drop_columns(["advantages"])
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(table.rename_columns([*table.column_names[:-1], "pi"]), renamed)
    flags = [arg for key, value in options.items() for arg in ("--as-option", f"{key}={json.dumps(value)}")]
    with pytest.raises(SystemExit) as exited:
        app(["analyze", str(renamed), "--as", name, *flags, "--current-col", "pi", "--format", "json", "-q"],
            standalone_mode=True)  # fmt: skip
    assert exited.value.code == 0
    got = json.loads(capsys.readouterr().out)["metrics"]
    want = rcdiag.analyze(path, framework=name, framework_options=options).metrics
    for key in keys:
        assert got[key] == pytest.approx(want[key], rel=1e-12)
