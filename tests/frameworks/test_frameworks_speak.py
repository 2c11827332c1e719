"""The verdict speaks the user's framework (``analyze --as NAME``): the prescription in that framework's own settings,
as its users write them, with its effect measured under its own semantics, checked against the framework's own
code run on the same dump (tests/framework_oracles.py ``token_weights``); nothing prescribed under ``fix`` or
``broken``. Through the CLI, on the tests' real-model dumps: int4 (``correct``: noise, token TIS 2), spikes
(``correct``: sparse outliers, token TIS 2 with token_k1 RS), bf16 (``healthy``), a planted offset (``fix``) and a
one-position shift (``broken``)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from conftest import run
from framework_cases import all_rows, dump_rows, padded, readings
from framework_oracles import require, token_weights

from rcdiag.cli import main

BAND = (1 / 2.718, 1 / 0.3679)
"""verl's outlier band ``0.3679_2.718`` (token_k1, inverted): the ratios it keeps."""
EXPECTED: dict[str, dict[str, tuple[str, dict[str, Any], str]]] = {
    "trl": {
        "int4": ("same", {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_min": None,
                          "vllm_importance_sampling_clip_max": 2.0}, "vllm_importance_sampling_mode: token_truncate"),
        "spikes": ("same_rejections", {"vllm_importance_sampling_mode": "token_mask",
                                       "vllm_importance_sampling_clip_min": BAND[0],
                                       "vllm_importance_sampling_clip_max": BAND[1]},
                   "vllm_importance_sampling_mode: token_mask"),
    },
    "openrlhf": {
        "int4": ("same", {"algo.advantage.is_correction_enable": True, "algo.advantage.is_correction_type": "tis",
                          "algo.advantage.is_correction_threshold": [0.0, 2.0]},
                 "--algo.advantage.is_correction_threshold 0.0 2.0"),
        "spikes": ("same_rejections", {"algo.advantage.is_correction_enable": True,
                                       "algo.advantage.is_correction_type": "icepop",
                                       "algo.advantage.is_correction_threshold": list(BAND)},
                   "--algo.advantage.is_correction_type icepop"),
    },
    "areal": {
        "int4": ("same", {"actor.use_decoupled_loss": True, "actor.rejection_sampling": {
            "level": "token", "action": "clamp", "metric": "ratio", "agg": "mean", "upper": 2.0, "lower": None}},
                 "actor:\n  use_decoupled_loss: true\n  rejection_sampling:\n    level: token\n    action: clamp"),
        "spikes": ("same_rejections", {"actor.use_decoupled_loss": True, "actor.rejection_sampling": {
            "level": "token", "action": "mask", "metric": "ratio", "agg": "mean", "upper": BAND[1],
            "lower": BAND[0]}}, "    action: mask\n    metric: ratio"),
    },
}  # fmt: skip
"""Per framework and dump: how its setting matches verl's, the options (by hand: token TIS 2 is a one-sided
clamp at 2; the outlier band is the ratio band [1/2.718, 1/0.3679], zeroed), and a line of its spelling."""


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, float):
        return isinstance(got, float) and math.isclose(got, want, rel_tol=1e-12)
    return bool(got == want)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("scenario", ["int4", "spikes"])
def test_the_prescription_in_the_frameworks_settings_with_its_effect(
    name: str, scenario: str, capsys: pytest.CaptureFixture
) -> None:
    require(name)
    from shape_dumps import dump

    path = dump(scenario, 0)
    code, out, _ = run(capsys, "analyze", str(path), "--as", name, "--format", "json", "-q")
    verdict = json.loads(out)["verdict"]
    assert code == 0 and verdict["status"] == "correct"
    prescription = verdict["recommendation"]
    spoken = prescription["framework"]
    match, options, spelling = EXPECTED[name][scenario]
    assert spoken["name"] == name and spoken["match"] == match
    assert _same(spoken["options"], options), spoken["options"]
    assert spelling in spoken["paste"], spoken["paste"]
    assert f"correct it with {spoken['release']}'s setting" in verdict["headline"]
    # its effect, against the framework's own code on the same dump (all steps as one batch)
    old, rollout, mask = padded(all_rows(dump_rows(path)))
    weights = token_weights(name, spoken["options"], old, rollout, mask)
    moved = (weights != 0) & ~torch_isclose(weights, (old - rollout).exp().double())
    want = readings(weights, mask, moved)
    effect = spoken["effect"]
    for key, field in (("weight_mean", "weight_mean"), ("zeroed_fraction", "tokens_zeroed"),
                       ("zeroed_response_fraction", "responses_zeroed"), ("truncated_fraction", "weights_truncated"),
                       ("ess", "ess")):  # fmt: skip
        assert math.isclose(effect[field], want[key], rel_tol=1e-5, abs_tol=1e-12), (field, effect[field], want[key])
    verl = token_weights("verl", prescription["config"], old, rollout, mask)[mask.bool()]
    if match == "same":  # the same weight on every token: verl's own weights' mean and share truncated
        assert math.isclose(effect["weight_mean"], float(verl.mean()), rel_tol=1e-6)
        assert math.isclose(effect["weights_truncated"], prescription["effect"]["is_truncated_share"], rel_tol=1e-9)
        assert effect["weights_truncated"] > 0  # the dump trips the clamp
    else:  # the same tokens zeroed, and so the same responses
        assert effect["tokens_zeroed"] == pytest.approx(float((verl == 0).double().mean()), abs=1e-15)
        assert effect["tokens_zeroed"] == pytest.approx(prescription["effect"]["tokens_rejected"], abs=1e-15)
        assert effect["responses_zeroed"] == pytest.approx(prescription["effect"]["responses_rejected"], abs=1e-15)
        assert effect["tokens_zeroed"] > 0 and effect["weights_truncated"] == 0


def torch_isclose(a: Any, b: Any) -> Any:
    import torch

    return torch.isclose(a, b, rtol=1e-5, atol=0.0)


def test_the_terminal_gives_the_frameworks_setting_first(capsys: pytest.CaptureFixture) -> None:
    from shape_dumps import dump

    code, out, _ = run(capsys, "analyze", str(dump("spikes", 0)), "--as", "openrlhf", "-q")
    assert code == 0
    spoken = out.index("prescription in OpenRLHF 0.11.0 (--as openrlhf; same rejections as verl's setting)")
    assert spoken < out.index("--algo.advantage.is_correction_type icepop") < out.index("verl's setting\n")
    assert "measured on this dump under OpenRLHF 0.11.0's semantics: weight mean" in out
    assert "what differs: the same tokens zeroed" in out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_healthy_dump_names_the_optional_setting_in_the_framework(name: str, capsys: pytest.CaptureFixture) -> None:
    from shape_dumps import dump

    code, out, _ = run(capsys, "analyze", str(dump("bf16", 0)), "--as", name, "--format", "json", "-q")
    verdict = json.loads(out)["verdict"]
    assert code == 0 and verdict["status"] == "healthy" and verdict["recommendation"] is None
    optional = next(step for step in verdict["next_steps"] if step.startswith("correction is optional"))
    release = {"trl": "TRL 1.16.0", "openrlhf": "OpenRLHF 0.11.0", "areal": "AReaL 1.0.4"}[name]
    assert f"; in {release}: " in optional and optional.endswith("(same)")


@pytest.mark.parametrize(("defect", "status"), [("offset", "fix"), ("alignment", "broken")])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_nothing_is_prescribed_under_fix_or_broken(
    defect: str, status: str, name: str, capsys: pytest.CaptureFixture
) -> None:
    from shape_dumps import defect_dump

    code, out, _ = run(capsys, "analyze", str(defect_dump(defect, 0)), "--as", name, "--format", "json", "-q")
    verdict = json.loads(out)["verdict"]
    assert code == 0 and verdict["status"] == status and verdict["recommendation"] is None
    assert "correct it with" not in verdict["headline"]
    assert not any("optional" in step for step in verdict["next_steps"])


# ------------------------------------------------------------------------------------------------ sweep --as NAME


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_sweep_recommends_in_the_frameworks_settings(name: str, capsys: pytest.CaptureFixture) -> None:
    """Each recommendation in the framework's settings, its effect under the framework's own code on the dump; a
    ``same`` claim truncates the share verl's recommendation targets, a ``same_rejections`` zeroes it; an option it
    has nothing alike for says so."""
    require(name)
    from shape_dumps import dump

    path = dump("spikes", 0)
    args = ("sweep", str(path), "--is", "token", "--rs", "token_k1,seq_mean_k2", "--format", "json", "-q")
    code, out, _ = run(capsys, *args, "--as", name)
    report = json.loads(out)
    assert code == 0 and report["framework"] == {"trl": "TRL 1.16.0", "openrlhf": "OpenRLHF 0.11.0",
                                                 "areal": "AReaL 1.0.4"}[name]  # fmt: skip
    old, rollout, mask = padded(all_rows(dump_rows(path)))
    by_option = {rec["option"]: rec for rec in report["recommendations"]}
    for option, match in (("is_token", "same"), ("token_k1", "same_rejections")):
        rec = by_option[option]
        spoken = rec["framework"]
        assert spoken["match"] == match, (option, spoken)
        weights = token_weights(name, spoken["options"], old, rollout, mask)
        moved = (weights != 0) & ~torch_isclose(weights, (old - rollout).exp().double())
        want = readings(weights, mask, moved)
        effect = spoken["effect"]
        assert math.isclose(effect["weight_mean"], want["weight_mean"], rel_tol=1e-5)
        assert math.isclose(effect["ess"], want["ess"], rel_tol=1e-5)
        if match == "same":  # the weights verl's TIS threshold truncates, the share it was chosen for
            assert effect["weights_truncated"] == pytest.approx(want["truncated_fraction"], abs=1e-15)
            assert effect["weights_truncated"] == pytest.approx(rec["token_reject"], abs=1e-15)
        else:
            assert effect["tokens_zeroed"] == pytest.approx(want["zeroed_fraction"], abs=1e-15)
            assert effect["tokens_zeroed"] == pytest.approx(rec["token_reject"], abs=1e-15)
            assert effect["responses_zeroed"] == pytest.approx(rec["seq_reject"], abs=1e-15)
    k2 = by_option["seq_mean_k2"]["framework"]  # a per-response KL bound: only AReaL has one
    if name == "areal":
        assert k2["match"] == "same_rejections" and k2["options"]["actor.rejection_sampling"]["metric"] == "kl_k2"
    else:
        assert k2["match"] == "none" and not k2["options"] and k2["effect"] is None and "no equivalent" in k2["meaning"]
    code, plain, _ = run(capsys, *args)
    assert code == 0 and "framework" not in json.loads(plain)  # without --as: the sweep's JSON as it was
    code, as_verl, _ = run(capsys, *args, "--as", "verl")
    assert code == 0 and as_verl == plain


def test_the_sweep_terminal_and_refusal(capsys: pytest.CaptureFixture) -> None:
    from shape_dumps import dump

    path = str(dump("spikes", 0))
    code, out, _ = run(capsys, "sweep", path, "--rs", "token_k1", "--as", "trl", "-q")
    assert code == 0 and "recommendations also in TRL 1.16.0's settings" in out
    assert "In TRL 1.16.0's settings, measured on this dump under its semantics" in out
    assert "in TRL 1.16.0 (same rejections)" in out and "vllm_importance_sampling_mode: token_mask" in out
    with pytest.raises(SystemExit) as refused:
        main(["sweep", path, "--as", "trl", "--as-option", "vllm_importance_sampling_mode=token_mask"])
    assert refused.value.code == 2 and "--as-option has no use here" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ compare --as, check --as


def test_compare_tables_the_frameworks_keys(capsys: pytest.CaptureFixture) -> None:
    """Both sides --as TRL: its keys side by side, each side's value TRL's own lines' on that dump (all steps as one
    batch), B's prescription in TRL's settings; the verl flags that would configure TRL's correction refused."""
    require("trl")
    from framework_oracles import trl_metrics
    from shape_dumps import dump

    a, b = dump("bf16", 0), dump("int4", 0)
    code, out, _ = run(capsys, "compare", str(a), str(b), "--as", "trl", "--format", "json", "-q")
    result = json.loads(out)
    assert code == 0
    rows = {row["key"]: row for row in result["metrics"]}
    keys = [row["key"] for row in result["metrics"]][:5]
    assert keys == [f"sampling/{k}" for k in ("sampling_logp_difference/mean", "sampling_logp_difference/max",
                                             "importance_sampling_ratio/min", "importance_sampling_ratio/mean",
                                             "importance_sampling_ratio/max")]  # fmt: skip
    for side, path in (("a", a), ("b", b)):
        logged, _ = trl_metrics(*padded(all_rows(dump_rows(path))))
        for key, value in logged.items():
            assert math.isclose(rows[key][side], value, rel_tol=2e-6, abs_tol=1e-7), (side, key, rows[key][side], value)
    row = rows["sampling/importance_sampling_ratio/mean"]
    assert row["difference"] == pytest.approx(row["b"] - row["a"], rel=1e-12)
    assert "rcdiag/trl/weight_mean" in rows and "rcdiag/trl/ess" in rows
    assert result["b"]["verdict"]["recommendation"]["framework"]["name"] == "trl"
    code, text, _ = run(capsys, "compare", str(a), str(b), "--as", "trl", "-q")
    assert code == 0 and "framework (both sides): TRL 1.16.0 (--as trl:" in text
    assert "sampling/importance_sampling_ratio/mean" in text and "prescription in TRL 1.16.0" in text
    with pytest.raises(SystemExit) as refused:
        main(["compare", str(a), str(b), "--as", "trl", "--is", "token"])
    assert refused.value.code == 2 and "--is configures verl's correction" in capsys.readouterr().err


def test_check_rules_name_the_frameworks_new_readings(capsys: pytest.CaptureFixture) -> None:
    """A rule on rcdiag's ESS of TRL's weights (`--steps mean`: the mean of each step's, each against TRL's own
    weights on that step), and a baseline rule on TRL's own key."""
    require("trl")
    from framework_oracles import trl_metrics
    from shape_dumps import dump

    path, good = dump("int4", 0), dump("bf16", 0)
    options = ("--as", "trl", "--as-option", "vllm_importance_sampling_mode=token_truncate")
    steps = dump_rows(path)
    per_step = []
    for rows in steps.values():
        old, rollout, mask = padded(rows)
        _, ratio = trl_metrics(old, rollout, mask, vllm_importance_sampling_mode="token_truncate")
        per_step.append(readings(ratio, mask)["ess"])
    ess = sum(per_step) / len(per_step)
    args = ("check", str(path), *options, "--steps", "mean", "--format", "json", "-q")
    code, out, _ = run(capsys, *args, "--min", f"rcdiag/trl/ess={ess * 0.999}")
    result = json.loads(out)["results"][0]
    assert code == 0 and result["status"] == "passed" and math.isclose(result["value"], ess, rel_tol=1e-5)
    code, out, _ = run(capsys, *args, "--min", f"rcdiag/trl/ess={ess * 1.001}")
    assert code == 1 and json.loads(out)["results"][0]["status"] == "failed"
    code, out, _ = run(capsys, *args, "--baseline", str(good), "--max-increase",
                    "sampling/sampling_logp_difference/mean=50%")  # fmt: skip
    assert code == 1 and json.loads(out)["results"][0]["status"] == "failed"  # int4 moves 20x bf16's


# ------------------------------------------------------------------ the frameworks a harness checks (no release)

HARNESSED = {
    "skyrl": {"int4": "same", "spikes": "same"},
    "slime": {"int4": "same", "spikes": "same"},
    "nemo-rl": {"int4": "same", "spikes": "same_rejections"},
    "roll": {"int4": "same", "spikes": "same"},
    "prime-rl": {"int4": "nearest", "spikes": "nearest"},
}
"""How each framework without a release on the package index writes verl's prescription: TIS 2 (int4) and TIS 2
with token_k1 RS (spikes). prime-rl's losses have no truncated weight: its IPO loss is the nearest."""


@pytest.mark.parametrize("name", sorted(HARNESSED))
@pytest.mark.parametrize("scenario", ["int4", "spikes"])
def test_the_prescription_in_a_harnessed_frameworks_settings(
    name: str, scenario: str, capsys: pytest.CaptureFixture
) -> None:
    """Its effect is what `analyze --as NAME` with those options computes (rcdiag's weights of NAME, checked against
    NAME's own code in tests/frameworks/test_frameworks_harness.py), and a same or same-rejections claim holds against verl's
    own code on the dump."""
    _verl_oracle()
    from shape_dumps import dump

    import rcdiag

    path = dump(scenario, 0)
    code, out, _ = run(capsys, "analyze", str(path), "--as", name, "--format", "json", "-q")
    prescription = json.loads(out)["verdict"]["recommendation"]
    spoken = prescription["framework"]
    assert code == 0 and spoken["name"] == name and spoken["match"] == HARNESSED[name][scenario], spoken
    assert spoken["paste"] and spoken["options"]
    direct = rcdiag.analyze(path, framework=name, framework_options=spoken["options"]).extras
    effect = spoken["effect"]
    for key, field in (("weight_mean", "weight_mean"), ("zeroed_fraction", "tokens_zeroed"),
                       ("zeroed_response_fraction", "responses_zeroed"), ("truncated_fraction", "weights_truncated"),
                       ("ess", "ess")):  # fmt: skip
        assert effect[field] == pytest.approx(direct[f"rcdiag/{name}/{key}"], rel=1e-12, abs=1e-15), field
    old, rollout, mask = padded(all_rows(dump_rows(path)))
    verl = token_weights("verl", prescription["config"], old, rollout, mask)[mask.bool()]
    if spoken["match"] == "same":
        assert math.isclose(effect["weight_mean"], float(verl.mean()), rel_tol=1e-6)
    if spoken["match"] in ("same", "same_rejections"):
        assert effect["tokens_zeroed"] == pytest.approx(float((verl == 0).double().mean()), abs=1e-15)


def _verl_oracle() -> None:
    from verl_oracle import require_verl

    require_verl("0.9.0")
