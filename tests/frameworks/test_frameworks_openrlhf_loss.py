"""``rcdiag analyze --as openrlhf`` on dumps holding the current policy's log-probs and the advantages:
``PolicyLoss``'s ``policy_loss``, ``ppo_clip_ratio`` and ``ppo_kl`` (which OpenRLHF's actor logs whatever its IS
correction) against OpenRLHF 0.11.0's own ``PolicyLoss`` (tests/framework_oracles.py), per step and pooled, on a
real-model dump and synthetic ones with padding, empty and fully masked rows, long responses and a step without a
valid token, per-row and per-token advantages, under OpenRLHF's defaults and five other settings (dual-clip among
them); without the columns the keys are left out with a note naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from framework_cases import close, loss_dumps, loss_views, synthetic_dump, with_loss_inputs
from framework_oracles import openrlhf_loss_metrics, require

import rcdiag

ENABLE = "algo.advantage.is_correction_enable"
SETTINGS: tuple[dict[str, Any], ...] = (
    {},
    {ENABLE: True, "actor.eps_clip_low_high": [0.1, 0.28]},
    {ENABLE: True, "algo.advantage.is_correction_type": "icepop", "actor.eps_clip": 0.05},
    {"actor.policy_loss_type": "gspo", "actor.eps_clip_low_high": [0.0003, 0.0004]},
    {ENABLE: True, "actor.policy_loss_type": "gspo", "actor.eps_clip": 0.01},
    {ENABLE: True, "algo.advantage.is_correction_type": "seq-mask-tis", "actor.dual_clip": 1.5},
)
KEYS = ("policy_loss", "ppo_clip_ratio", "ppo_kl", "vllm_kl")


def _oracle_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as ``PPOActor`` passes them to ``PolicyLoss`` (``train_ppo_ray``'s resolution of the clip)."""
    eps = options.get("actor.eps_clip", 0.2)
    return {
        "enable": options.get(ENABLE, False),
        "kind": options.get("algo.advantage.is_correction_type", "tis"),
        "loss": options.get("actor.policy_loss_type", "ppo"),
        "eps": tuple(options.get("actor.eps_clip_low_high", (eps, eps))),
        "dual_clip": options.get("actor.dual_clip"),
    }


@pytest.mark.parametrize(
    "options", SETTINGS, ids=["defaults", "tis_eps_pair", "icepop_eps", "gspo", "gspo_corrected", "seq_mask_dual"]
)
def test_openrlhf_loss_keys_match_its_own_code(options: dict, tmp_path: Path) -> None:
    require("openrlhf")
    compared, clipped, empty = 0, 0, 0
    masked = with_loss_inputs(synthetic_dump(tmp_path, 3, masked_step=1), tmp_path / "m3", 3)
    for path in [*loss_dumps(tmp_path), masked]:
        report = rcdiag.analyze(path, framework="openrlhf", framework_options=options)
        for metrics, old, rollout, mask, current, advantages in loss_views(report, path):
            ours = {k: metrics[k] for k in KEYS if k in metrics}
            theirs = openrlhf_loss_metrics(old, current, rollout, mask, advantages, **_oracle_options(options))
            assert set(ours) == set(theirs), (path.name, options, list(ours), list(theirs))
            for key, value in theirs.items():
                assert close(ours[key], value, rel=2e-5), (path.name, options, key, ours[key], value)
                compared += 1
            clipped += theirs["ppo_clip_ratio"] > 0
            empty += ours["policy_loss"] is None  # the step without a valid token: OpenRLHF's 0/0
    assert compared >= 24 and clipped >= 4 and empty == 1, (compared, clipped, empty)


def test_openrlhf_loss_keys_left_out_with_a_note_without_the_columns(tmp_path: Path) -> None:
    path = synthetic_dump(tmp_path, 0)
    report = rcdiag.analyze(path, framework="openrlhf")
    assert "ppo_kl" not in report.metrics and "ppo_clip_ratio" not in report.metrics
    notes = report.sections["framework"].notes
    kl_note = next(n for n in notes if n.startswith("left out: ppo_kl need"))
    assert "'log_prob' (--current-col NAME)" in kl_note and "advantages" not in kl_note
    clip_note = next(n for n in notes if n.startswith("left out: policy_loss, ppo_clip_ratio need"))
    assert "'advantages' (--advantages-col NAME)" in clip_note
    inputs = with_loss_inputs(path, tmp_path / "in", 0)
    with_inputs = rcdiag.analyze(inputs, framework="openrlhf")
    assert not [n for n in with_inputs.sections["framework"].notes if n.startswith("left out: ppo_")]
    assert {"policy_loss", "ppo_kl", "ppo_clip_ratio"} <= set(with_inputs.metrics)


def test_openrlhf_ppo_kl_without_the_advantages(tmp_path: Path) -> None:
    """The current policy alone gives ``ppo_kl``; ``ppo_clip_ratio`` stays out, its note naming the advantages."""
    import pyarrow.parquet as pq

    source = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "in", 0)
    path = tmp_path / "current_only.parquet"
    pq.write_table(pq.read_table(source).drop_columns(["advantages"]), path)
    report = rcdiag.analyze(path, framework="openrlhf")
    full = rcdiag.analyze(source, framework="openrlhf")
    assert report.metrics["ppo_kl"] == pytest.approx(full.metrics["ppo_kl"], rel=1e-12)
    assert "ppo_clip_ratio" not in report.metrics and "policy_loss" not in report.metrics
    assert any(n.startswith("left out: policy_loss, ppo_clip_ratio need") for n in report.sections["framework"].notes)


def test_openrlhf_loss_keys_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Columns under other names, given with --current-col and --advantages-col, and an option as a flag."""
    import json

    import pyarrow.parquet as pq

    from rcdiag.cli import app

    path = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "in", 0)
    table = pq.read_table(path)
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(table.rename_columns([*table.column_names[:-2], "pi", "adv"]), renamed)
    with pytest.raises(SystemExit) as exited:
        app(["analyze", str(renamed), "--as", "openrlhf", "--as-option", "actor.eps_clip=0.1", "--current-col", "pi",
             "--advantages-col", "adv", "--format", "json", "-q"], standalone_mode=True)  # fmt: skip
    assert exited.value.code == 0
    got = json.loads(capsys.readouterr().out)
    want = rcdiag.analyze(path, framework="openrlhf", framework_options={"actor.eps_clip": 0.1}).metrics
    for key in ("policy_loss", "ppo_clip_ratio", "ppo_kl"):
        assert got["metrics"][key] == pytest.approx(want[key], rel=1e-12)


def test_openrlhf_dual_clip_must_exceed_one(tmp_path: Path) -> None:
    with pytest.raises(rcdiag.ConfigError, match=r"dual_clip must be > 1\.0"):
        rcdiag.analyze(synthetic_dump(tmp_path, 0), framework="openrlhf", framework_options={"actor.dual_clip": 1.0})
