"""``rcdiag translate SETTING --from A --to B``: each claim checked on dumps by running both frameworks' code.

For every framework built, a list of its settings (its forms, one- and two-sided, token and sequence, the k1, k2
and reversed k3 bounds; for the frameworks checked by a harness, the settings of its expected values) is translated
into every framework. Where the whole setting is claimed ``same``, the weight A puts on each valid token equals the
weight B puts there under the translated options, to float32 rounding; where it is claimed ``same_rejections``,
the two zero exactly the same tokens, and the dumps zero some (the claim is not vacuous). The weights are the
frameworks' own code's where it runs here (tests/framework_oracles.py ``token_weights``: verl's
``compute_rollout_correction_and_rejection_mask``, TRL's inline lines, OpenRLHF's ``PolicyLoss``, AReaL's
``ppo_actor_loss_fn``), and for slime, SkyRL, prime-rl, NeMo-RL and ROLL rcdiag's (``captured``: the weights whose
mean and zeroed share tests/frameworks/test_frameworks_harness.py checks against each one's own code). rcdiag's own ``--as
B`` readings of the translated options equal B's weights' too. The dumps: a synthetic one (masked padding, empty and
fully masked rows, 3,000-token responses, outlier tokens) and a real-model int4 dump.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from framework_cases import all_rows, dump_rows, padded, synthetic_dump
from framework_oracles import require, token_weights
from harness.common import load

import rcdiag
from rcdiag.cli.flags import AS_NAMES
from rcdiag.frameworks.registry import choose, framework, names
from rcdiag.frameworks.translate import express, translate
from rcdiag.settings.correction import PRESETS, preset

ENABLE = {"algo.advantage.is_correction_enable": True}
DECOUPLED = {"actor.use_decoupled_loss": True}
SETTINGS: dict[str, list[dict[str, Any]]] = {
    "verl": [
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
        {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.001},
        {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"},
    ],
    "trl": [
        {},
        {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 1.05},
        {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_min": 0.95,
         "vllm_importance_sampling_clip_max": 1.05},
        {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.9,
         "vllm_importance_sampling_clip_max": 1.1},
        {"vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_clip_max": 2.0},
        {"vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_min": 0.5,
         "vllm_importance_sampling_clip_max": 1.2},
    ],
    "openrlhf": [
        {**ENABLE},
        {**ENABLE, "algo.advantage.is_correction_threshold": [0.0, 1.05]},
        {**ENABLE, "algo.advantage.is_correction_type": "icepop", "algo.advantage.is_correction_threshold": [0.9, 1.1]},
        {**ENABLE, "algo.advantage.is_correction_type": "seq-mask-tis",
         "algo.advantage.is_correction_threshold": [0.99, 1.01]},
    ],
    "areal": [
        {**DECOUPLED, "actor.rejection_sampling": {"upper": 1.2, "lower": 0.8}},
        {**DECOUPLED, "actor.rejection_sampling": {"upper": 1.1}},
        {**DECOUPLED, "actor.rejection_sampling": {"action": "clamp", "upper": 1.05}},
        {**DECOUPLED, "actor.rejection_sampling": {"level": "sequence", "upper": 1.02, "lower": 0.98}},
        {**DECOUPLED, "actor.rejection_sampling": {"level": "sequence", "agg": "sum", "upper": 1.5, "lower": 0.5}},
        {**DECOUPLED, "actor.rejection_sampling": {"level": "sequence", "action": "clamp", "upper": 1.02}},
        {**DECOUPLED, "actor.rejection_sampling": {"metric": "kl_k1", "upper": 0.05, "lower": -0.05}},
        {**DECOUPLED, "actor.rejection_sampling": {"metric": "kl_k2", "upper": 0.001}},
        {**DECOUPLED, "actor.rejection_sampling": {"metric": "kl_k3", "upper": 0.002}},
        {**DECOUPLED, "actor.rejection_sampling": {"level": "sequence", "metric": "kl_k2", "agg": "mean",
                                                   "upper": 0.002}},
        {**DECOUPLED, "actor.rejection_sampling": {"level": "sequence", "metric": "kl_k3", "agg": "max",
                                                   "upper": 0.05}},
    ],
}  # fmt: skip
"""Settings of each framework, as ``--as-option`` takes them."""
for _name in ("skyrl", "slime", "prime-rl", "nemo-rl", "roll"):
    SETTINGS[_name] = list(load(_name)["settings"].values())
CHECKED = ("same", "same_rejections")
LIVE = ("verl", "trl", "openrlhf", "areal")
"""Frameworks whose own code runs here (their release installed under .gl/)."""


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Any, Any, Any]]:
    """The dumps as each framework's code holds them: (path, old, rollout, mask), all steps as one padded batch."""
    from shape_dumps import dump

    paths = [synthetic_dump(tmp_path_factory.mktemp("translate"), 3, scale=0.08), dump("int4", 0)]
    return [(path, *padded(all_rows(dump_rows(path)))) for path in paths]


def test_every_framework_is_a_source_and_a_target() -> None:
    assert set(SETTINGS) == set(names()) and set(names()) == set(AS_NAMES)


def weights(name: str, options: Any, batch: tuple) -> Any:
    """The weight ``name`` puts on each valid token of the batch, flat in reading order (float64): its own code's
    where it runs here, else rcdiag's (``captured``)."""
    path, old, rollout, mask = batch
    key = (name, json.dumps(options, sort_keys=True), str(path))
    if key not in _SEEN:  # a source's weights serve every target
        _SEEN[key] = (
            token_weights(name, options, old, rollout, mask)[mask.bool()]
            if name in LIVE
            else captured(name, options, path)
        )
    return _SEEN[key]


_SEEN: dict[tuple[str, str, str], Any] = {}


def captured(name: str, options: Any, path: Path) -> Any:
    """rcdiag's weights of ``name`` on every valid token, as its accumulator folds them in, in reading order (one
    pass, one process: the blocks in the dump's order)."""
    import numpy as np
    import torch

    from rcdiag.api import accumulate
    from rcdiag.frameworks.base import FrameworkMetrics
    from rcdiag.frameworks.section import FrameworkSection

    seen: list[Any] = []
    original = FrameworkMetrics.add_weights

    def spy(self: Any, weight: Any, rows: Any, truncated: Any) -> None:
        seen.append(np.asarray(weight, dtype=np.float64))
        original(self, weight, rows, truncated)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FrameworkMetrics, "add_weights", spy)
        accumulate(path, None, rcdiag.ReadOptions(workers=1), sections=[FrameworkSection(choose(name, options))])
    return torch.from_numpy(np.concatenate(seen) if seen else np.zeros(0))


def test_captured_weights_are_the_oracles_in_reading_order(batches: list) -> None:
    """The capture's order is the padded batch's (checked on a framework whose own code runs here)."""
    require("trl")
    options = {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_max": 1.1}
    for batch in batches:
        theirs, ours = weights("trl", options, batch), captured("trl", options, batch[0])
        assert ours.shape == theirs.shape and _close(theirs, ours)


@pytest.mark.parametrize("target", names())
@pytest.mark.parametrize("source", names())
def test_every_same_claim_holds_on_dumps(source: str, target: str, batches: list) -> None:
    """The whole setting's claim (and each part's, for a setting of one part), on each framework's own code."""
    for name in {source, target} & set(LIVE):
        require(name) if name != "verl" else _verl()
    checked = 0
    for options in SETTINGS[source]:
        wanted = choose(source, options).settings.correction()
        if wanted.other:  # nothing the vocabulary can say (prime-rl's default loss): no weight to compare
            continue
        trivial = wanted.weight.unit == "one" and not wanted.bands  # no correction: weights of 1 on both sides
        result = translate(choose(source, options), target)
        claims = [result.whole, *(result.parts if len(result.parts) == 1 else ())]
        for claim in {json.dumps([c.match, c.options], sort_keys=True): c for c in claims}.values():
            assert claim.meaning, (options, claim)
            assert (claim.match == "none") == (not claim.options), (options, claim)
            if claim.match not in CHECKED:
                continue
            tripped = False
            for batch in batches:
                path = batch[0]
                theirs, ours = weights(source, options, batch), weights(target, claim.options, batch)
                where = (source, options, target, claim.options, path.name)
                zeroed = theirs == 0
                assert bool((zeroed == (ours == 0)).all()), (where, int(zeroed.sum()), int((ours == 0).sum()))
                if claim.match == "same":
                    assert _close(theirs, ours), (where, _worst(theirs, ours))
                    tripped = tripped or bool((theirs != 1).any())
                else:
                    tripped = tripped or bool(zeroed.any())
                if target in LIVE and target != "verl":  # rcdiag's --as readings: the target's own weights'
                    report = rcdiag.analyze(path, framework=target, framework_options=claim.options)
                    want = float(ours.mean())
                    got = report.extras.get(f"rcdiag/{target}/weight_mean", 1.0)  # none: the target corrects nothing
                    assert got == pytest.approx(want, rel=1e-5), where
            assert tripped or trivial, (source, options, target, claim)  # the dumps trip the bounds: not vacuous
            checked += 1
    if source == target:  # every setting of a framework is itself, checked on the dumps
        assert checked >= len(SETTINGS[source]) - unsayable(source)


def unsayable(name: str) -> int:
    """Settings of ``name`` the shared vocabulary cannot say (prime-rl's default loss reads the advantages)."""
    return sum(bool(choose(name, options).settings.correction().other) for options in SETTINGS[name])


def _verl() -> None:
    from verl_oracle import require_verl

    require_verl("0.9.0")


def _close(a: Any, b: Any) -> bool:
    """Equal to float32 rounding: a product of 3,000 ratios summed in another order differs in its last bits, and
    verl's clamp of a log-ratio at -20 leaves a weight of e^-20 where another gives less (both ~0)."""
    import torch

    return bool(torch.isclose(a, b, rtol=2e-5, atol=1e-8).all())


def _worst(a: Any, b: Any) -> tuple[float, float]:
    i = int((a - b).abs().argmax())
    return float(a[i]), float(b[i])


@pytest.mark.parametrize("name", names())
def test_every_setting_is_itself_through_its_own_forms(name: str) -> None:
    """A setting read into the shared vocabulary and written back by its own framework's forms is the same setting:
    the forms cover everything the framework's reading can say."""
    for options in SETTINGS[name]:
        wanted = choose(name, options).settings.correction()
        if wanted.other:  # what the vocabulary cannot say is itself only as given (prime-rl's default loss)
            assert translate(choose(name, options), name).whole.match == "same"
            continue
        back = express(wanted, framework(name))
        assert back.match == "same", (options, back)
        assert choose(name, back.options).settings.correction().same(wanted)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_translates_into_every_framework(name: str) -> None:
    config = preset(name)
    fields = {k: v for k, v in config.to_dict().items() if k != "verl_version"}
    for target in names():
        result = translate(choose("verl", fields), target)
        assert result.parts and all(p.meaning for p in result.parts)
        for part in (*result.parts, result.whole):
            if part.options:
                choose(target, part.options)  # the target's own checks accept every option set given


def test_the_semantic_differences_are_said() -> None:
    """verl's inverted k1 band, one- vs two-sided clamps, products vs geometric means, AReaL's reversed k3."""
    k1 = translate(choose("verl", {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.7_1.3"}), "trl").whole
    assert "[0.769231, 1.42857]" in k1.part and "inverted" in k1.part
    assert k1.options["vllm_importance_sampling_clip_min"] == pytest.approx(1 / 1.3)
    assert k1.options["vllm_importance_sampling_clip_max"] == pytest.approx(1 / 0.7)
    assert k1.match == "same_rejections" and "verl's: weight 1" in k1.meaning
    two_sided = translate(choose("openrlhf", ENABLE), "verl").whole  # tis [0.5, 5] into verl's one-sided TIS
    assert two_sided.match == "nearest" and "clamped to [0.5, 5]" in two_sided.meaning
    assert two_sided.options == {"rollout_is": "token", "rollout_is_threshold": 5.0}
    one_sided = translate(choose("verl", {"rollout_is": "token", "rollout_is_threshold": 2.0}), "openrlhf").whole
    assert one_sided.match == "same" and one_sided.options["algo.advantage.is_correction_threshold"] == [0.0, 2.0]
    k3 = translate(choose("verl", {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}), "areal").whole
    assert k3.match == "nearest" and "other direction" in k3.meaning
    assert k3.options["actor.rejection_sampling"]["metric"] == "kl_k3"
    product = translate(choose("trl", {}), "openrlhf").whole  # TRL's default bounds a product; OpenRLHF has none
    assert product.match == "none" and "product" in product.meaning
    geomean = translate(choose("verl", {"rollout_is": "sequence", "rollout_is_threshold": 2.0}), "areal").whole
    assert geomean.match == "nearest" and "geometric-mean" in geomean.meaning


def test_cli_prints_the_parts_the_setting_to_paste_and_the_command(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "translate", "rollout_is=token", "rollout_is_threshold=0.5_5.0", "--to", "openrlhf")
    assert code == 0 and "verl 0.9.1 -> OpenRLHF 0.11.0" in out and "same" in out
    assert "--algo.advantage.is_correction_type icepop" in out  # OpenRLHF's own argparse flags
    assert "--algo.advantage.is_correction_threshold 0.5 5.0" in out
    assert "rcdiag analyze DUMP --as openrlhf --as-option 'algo.advantage.is_correction_enable=true'" in out
    code, out, _ = run(capsys, "translate", "--from", "trl", "--to", "areal", "--format", "json")
    result = json.loads(out)
    assert code == 0 and result["from"] == "TRL 1.16.0" and result["to"] == "AReaL 1.0.4"
    setting = result["setting"]
    assert setting["match"] == "same_rejections"  # TRL's default sequence_mask: the same responses, weighted otherwise
    assert setting["options"]["actor.rejection_sampling"]["agg"] == "sum"
    assert "actor:\n  use_decoupled_loss: true\n  rejection_sampling:\n    level: sequence" in setting["paste"]


def test_cli_refusals_are_one_line(capsys: pytest.CaptureFixture) -> None:
    for args, message in (
        (("decoupled_geo_rs", "--to", "megatron"), "--to megatron"),
        (("--from", "trl", "vllm_importance_sampling_mode=nope", "--to", "verl"), "vllm_importance_sampling_mode"),
        (("not_a_preset", "--to", "trl"), "not a verl preset"),
        (("--from", "megatron", "--to", "trl"), "megatron"),
    ):
        code, out, err = run(capsys, "translate", *args)
        assert code == 2 and not out and err.count("\n") == 1 and message in err, (args, err)
