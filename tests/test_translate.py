"""``rcdiag translate SETTING --to NAME``: each claim checked on dumps. A part marked ``same`` puts the same weight
on every token (verl's ``rollout_is_mean``, the token mean of its applied weights, equals the framework's
``rcdiag/NAME/weight_mean`` under the translated options); ``same_rejections`` rejects the same tokens (verl's
``rollout_rs_masked_fraction`` equals ``rcdiag/NAME/zeroed_fraction``); every translated option set is one the
framework's own validation accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_cases import synthetic_dump

import rcdiag
from rcdiag.cli import main
from rcdiag.cli.translate import TARGETS as CLI_TARGETS
from rcdiag.config import PRESETS, CorrectionConfig, preset
from rcdiag.frameworks.translate import TARGETS, combined, translate

SETTINGS = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"rollout_is": "token", "rollout_is_threshold": 1.05},
    {"rollout_is": "token", "rollout_is_threshold": "0.9_1.1"},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2.0"},
    {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.7_1.3"},
    {"rollout_rs": "token_k1", "rollout_rs_threshold": 1.1},
    {"rollout_rs": "token_k2", "rollout_rs_threshold": 0.005},
    {"rollout_rs": "token_k3", "rollout_rs_threshold": 0.002},
    {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.99_1.01"},
    {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"},
    {"rollout_rs": "seq_mean_k2", "rollout_rs_threshold": 0.002},
    {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.05},
]


def test_the_command_takes_every_target() -> None:
    assert CLI_TARGETS == TARGETS


@pytest.mark.parametrize("target", TARGETS)
def test_every_claim_holds_on_dumps(target: str, tmp_path: Path) -> None:
    from shape_dumps import dump

    dumps = [synthetic_dump(tmp_path, 3, scale=0.08), dump("int4", 0)]
    checked = 0
    for fields in SETTINGS:
        config = CorrectionConfig(**fields)
        (part,) = translate(config, target)
        if part.match not in ("same", "same_rejections"):
            assert part.meaning and (part.match == "none") == (not part.options), part
            continue
        for path in dumps:
            verl = rcdiag.analyze(path, config)
            theirs = rcdiag.analyze(path, framework=target, framework_options=part.options)
            if part.match == "same":
                want = verl.metrics["rollout_corr/rollout_is_mean"]
                assert theirs.extras[f"rcdiag/{target}/weight_mean"] == pytest.approx(want, rel=1e-6), (fields, path)
            else:
                want = verl.metrics["rollout_corr/rollout_rs_masked_fraction"]
                assert theirs.extras[f"rcdiag/{target}/zeroed_fraction"] == pytest.approx(want, abs=1e-12), (
                    fields, path.name)  # fmt: skip
                assert want > 0, (fields, path.name)  # the dumps trip the bound: the claim is not vacuous
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_translates_to_options_each_framework_accepts(name: str) -> None:
    for target in TARGETS:
        parts = translate(preset(name), target)  # translate checks each part with the framework's validation
        assert parts and all(p.meaning for p in parts)
        assert combined(parts) is None or isinstance(combined(parts), dict)


def test_the_inverted_k1_band_is_said_and_applied() -> None:
    (part,) = translate(CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.7_1.3"), "trl")
    assert "[0.769231, 1.42857]" in part.part and "inverted" in part.part
    assert part.options["vllm_importance_sampling_clip_min"] == pytest.approx(1 / 1.3)
    assert part.options["vllm_importance_sampling_clip_max"] == pytest.approx(1 / 0.7)
    (k3,) = translate(CorrectionConfig(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01), "areal")
    assert k3.match == "nearest" and "other direction" in k3.meaning


def test_cli_prints_the_parts_and_one_command_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as ok:
        main(["translate", "rollout_is=token", "rollout_is_threshold=0.5_5.0", "--to", "openrlhf"])
    out = capsys.readouterr().out
    assert ok.value.code == 0 and "verl 0.9.1 -> OpenRLHF 0.11.0" in out and "same" in out
    assert "rcdiag analyze DUMP --as openrlhf --as-option" in out
    assert "--as-option 'algo.advantage.is_correction_type=icepop'" in out
    with pytest.raises(SystemExit) as refused:
        main(["translate", "decoupled_geo_rs", "--to", "slime"])
    assert refused.value.code == 2 and "--to slime" in capsys.readouterr().err
    with pytest.raises(SystemExit) as not_verl:
        main(["translate", "decoupled_geo_rs", "--to", "trl", "--from", "trl"])
    assert not_verl.value.code == 2
