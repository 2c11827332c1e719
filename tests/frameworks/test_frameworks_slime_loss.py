"""``rcdiag analyze --as slime``'s PPO loss keys (``train/pg_loss``, ``train/pg_clipfrac``, ``train/ppo_kl``): their
values are checked against slime's own ``compute_policy_loss`` and reducer lines at the pin by
tests/frameworks/test_frameworks_harness.py (the harness's dumps with a current policy and advantages: a real-model
one, one with a step without a valid token, per step and pooled, every setting incl. dual-clip); here: left out with
a note naming the missing column, ``eps_clip_c`` refused where slime's assertion stops it, and the CLI's column
flags."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from framework_cases import synthetic_dump, with_loss_inputs

import rcdiag

PG_LOSS, PG_CLIPFRAC, PPO_KL = "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl"


def _left_out(report: rcdiag.Report, key: str) -> str | None:
    return next((n for n in report.sections["framework"].notes if n.startswith(f"left out: {key}")), None)


def test_left_out_with_a_note_naming_the_columns(tmp_path: Path) -> None:
    path = synthetic_dump(tmp_path, 0)
    bare = rcdiag.analyze(path, framework="slime")
    assert not {PG_LOSS, PG_CLIPFRAC, PPO_KL} & set(bare.metrics)
    kl, loss = _left_out(bare, PPO_KL), _left_out(bare, f"{PG_LOSS}, {PG_CLIPFRAC}")
    assert kl is not None and "'log_prob' (--current-col NAME)" in kl and "advantages" not in kl
    assert loss is not None and "'advantages' (--advantages-col NAME)" in loss
    current_only = tmp_path / "current.parquet"
    pq.write_table(pq.read_table(with_loss_inputs(path, tmp_path / "in", 0)).drop_columns(["advantages"]), current_only)
    report = rcdiag.analyze(current_only, framework="slime")
    assert PPO_KL in report.metrics and not {PG_LOSS, PG_CLIPFRAC} & set(report.metrics)
    assert _left_out(report, PPO_KL) is None and _left_out(report, PG_LOSS) is not None
    full = rcdiag.analyze(with_loss_inputs(path, tmp_path / "in", 0), framework="slime")
    assert list(full.metrics)[:3] == [PG_LOSS, PG_CLIPFRAC, PPO_KL]  # slime's order, before the abs diff
    assert full.metrics[PG_CLIPFRAC] > 0 and _left_out(full, PG_LOSS) is None


@pytest.mark.parametrize("bound", [1.0, 0.5])
def test_eps_clip_c_must_exceed_one(bound: float, tmp_path: Path) -> None:
    with pytest.raises(rcdiag.ConfigError, match=r"eps_clip_c=.* must be above 1"):
        rcdiag.analyze(synthetic_dump(tmp_path, 0), framework="slime", framework_options={"eps_clip_c": bound})


def test_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Columns under other names (--current-col, --advantages-col), slime's clip flags as --as-option."""
    from rcdiag.cli import app

    path = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "in", 0)
    table = pq.read_table(path)
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(table.rename_columns([*table.column_names[:-2], "pi", "adv"]), renamed)
    options = {"use_tis": True, "eps_clip_high": 0.28, "eps_clip_c": 3.0}
    flags = [arg for key, value in options.items() for arg in ("--as-option", f"{key}={json.dumps(value)}")]
    with pytest.raises(SystemExit) as exited:
        app(["analyze", str(renamed), "--as", "slime", *flags, "--current-col", "pi", "--advantages-col", "adv",
             "--format", "json", "-q"], standalone_mode=True)  # fmt: skip
    assert exited.value.code == 0
    got = json.loads(capsys.readouterr().out)["metrics"]
    want = rcdiag.analyze(path, framework="slime", framework_options=options).metrics
    default = rcdiag.analyze(path, framework="slime", framework_options={"use_tis": True}).metrics
    for key in (PG_LOSS, PG_CLIPFRAC, PPO_KL):
        assert got[key] == pytest.approx(want[key], rel=1e-12)
    assert want[PG_CLIPFRAC] != default[PG_CLIPFRAC]
