"""``rcdiag analyze --as areal`` on dumps holding the current policy's log-probs and the advantages: the PPO loss's
stats ``grpo_loss_fn`` logs (``importance_weight``, ``approx_kl``, ``new_logp``, ``actor_loss``, ``clip_ratio``,
``dual_clip_ratio`` as avg/min/max, ``clipped_tokens``, ``dual_clipped_tokens``) beside rejection sampling's, against
AReaL 1.0.4's own ``ppo_actor_loss_fn`` and logging lines (tests/framework_oracles.py), per step and pooled, on a
real-model dump and synthetic ones with padding, empty and fully masked rows and long responses, per-row and
per-token advantages, under AReaL's defaults and four other settings; without the columns the keys are left out
with a note naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from framework_cases import close, loss_dumps, loss_views, synthetic_dump, with_loss_inputs
from framework_oracles import areal_loss_metrics, require

import rcdiag

DECOUPLED = "actor.use_decoupled_loss"
REJECTION = "actor.rejection_sampling"
SETTINGS: tuple[dict[str, Any], ...] = (
    {},
    {DECOUPLED: True, REJECTION: {"upper": 1.5, "lower": 0.7}, "actor.eps_clip_higher": 0.28},
    {DECOUPLED: True, REJECTION: {"action": "clamp", "upper": 1.2}, "actor.c_clip": 1.5, "actor.eps_clip": 0.1},
    {
        DECOUPLED: True,
        REJECTION: {"level": "sequence", "upper": 1.02, "lower": 0.98},
        "actor.importance_sampling_level": "sequence",
        "actor.eps_clip": 0.01,
    },
    {"actor.importance_sampling_level": "sequence", "actor.c_clip": 1.01, "actor.eps_clip": 0.02},
)
SCOPE = "ppo_actor/update/"
LOSS = ("importance_weight/", "approx_kl/", "new_logp/", "actor_loss/", "clip_ratio/", "dual_clip_ratio/",
        "clipped_tokens", "dual_clipped_tokens")  # fmt: skip


def _oracle_options(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "decoupled": options.get(DECOUPLED, False),
        "rejection": options.get(REJECTION),
        "eps_clip": options.get("actor.eps_clip", 0.2),
        "eps_clip_higher": options.get("actor.eps_clip_higher"),
        "c_clip": options.get("actor.c_clip"),
        "level": options.get("actor.importance_sampling_level", "token"),
    }


def _loss_keys(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k.removeprefix(SCOPE).startswith(LOSS)}


@pytest.mark.parametrize(
    "options", SETTINGS, ids=["defaults", "mask_band_eps_high", "clamp_dual", "sequence_both", "gspo_dual"]
)
def test_areal_loss_stats_match_its_own_code(options: dict, tmp_path: Path) -> None:
    require("areal")
    compared, clipped, dual = 0, 0, 0
    for path in loss_dumps(tmp_path):
        report = rcdiag.analyze(path, framework="areal", framework_options=options)
        for metrics, old, rollout, mask, current, advantages in loss_views(report, path):
            theirs = areal_loss_metrics(old, current, rollout, mask, advantages, **_oracle_options(options))
            theirs_loss = _loss_keys(theirs)
            ours = _loss_keys(metrics)
            assert list(ours) == list(theirs_loss), (path.name, options, list(ours), list(theirs_loss))
            for key, value in theirs.items():  # rejection sampling's keys too, as AReaL logs them beside
                if key.endswith("rs_filtered_fraction"):
                    continue  # the mean over micro-batch calls: tests/frameworks/test_frameworks_oracles.py
                assert close(metrics[key], value, rel=5e-5, abs_=2e-6), (path.name, options, key, metrics[key], value)
                compared += 1
            clipped += theirs[SCOPE + "clipped_tokens"] > 0
            dual += theirs[SCOPE + "dual_clipped_tokens"] > 0
    assert compared >= 100 and clipped >= 4, (compared, clipped)
    assert dual >= 4 or options.get("actor.c_clip") is None, dual


def test_areal_loss_stats_left_out_with_a_note_without_the_columns(tmp_path: Path) -> None:
    path = synthetic_dump(tmp_path, 0)
    report = rcdiag.analyze(path, framework="areal")
    assert not _loss_keys(report.metrics)
    notes = report.sections["framework"].notes
    current = next(n for n in notes if n.startswith(f"left out: {SCOPE}importance_weight/avg"))
    assert "'log_prob' (--current-col NAME)" in current and "advantages" not in current
    both = next(n for n in notes if n.startswith(f"left out: {SCOPE}clipped_tokens"))
    assert "'advantages' (--advantages-col NAME)" in both
    with_inputs = rcdiag.analyze(with_loss_inputs(path, tmp_path / "in", 0), framework="areal")
    assert not [n for n in with_inputs.sections["framework"].notes if n.startswith(f"left out: {SCOPE}")]
    assert with_inputs.metrics[SCOPE + "clip_ratio/avg"] > 0


def test_areal_c_clip_must_exceed_one(tmp_path: Path) -> None:
    path = synthetic_dump(tmp_path, 0)
    with pytest.raises(rcdiag.ConfigError, match=r"c_clip must be > 1\.0"):
        rcdiag.analyze(path, framework="areal", framework_options={"actor.c_clip": 1.0})


def test_areal_loss_stats_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Columns under other names, given with --current-col and --advantages-col, options with --as-option."""
    import json

    import pyarrow.parquet as pq

    from rcdiag.cli import app

    path = with_loss_inputs(synthetic_dump(tmp_path, 0), tmp_path / "in", 0)
    table = pq.read_table(path)
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(table.rename_columns([*table.column_names[:-2], "pi", "adv"]), renamed)
    options = {"actor.c_clip": 1.5, "actor.use_decoupled_loss": True}
    with pytest.raises(SystemExit) as exited:
        app(["analyze", str(renamed), "--as", "areal", "--as-option", "actor.c_clip=1.5", "--as-option",
             "actor.use_decoupled_loss=true", "--current-col", "pi", "--advantages-col", "adv", "--format", "json",
             "-q"], standalone_mode=True)  # fmt: skip
    assert exited.value.code == 0
    got = json.loads(capsys.readouterr().out)
    want = rcdiag.analyze(path, framework="areal", framework_options=options).metrics
    for key in ("clip_ratio/avg", "dual_clipped_tokens", "importance_weight/max", "actor_loss/avg"):
        assert got["metrics"][SCOPE + key] == pytest.approx(want[SCOPE + key], rel=1e-12)
    assert got["metrics"][SCOPE + "dual_clipped_tokens"] > 0
