"""``rcdiag analyze --as NAME --as-option KEY=VALUE`` and ``rcdiag presets --as NAME`` end to end: options parsed
as the framework spells them, one line and exit 2 for what is refused, ``--as verl`` byte-identical to a plain
analyze, the keys per step and pooled in JSON, state files and workers giving the same values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, run

import rcdiag
from rcdiag.cli.flags import AS_NAMES
from rcdiag.frameworks.options import parse_value
from rcdiag.frameworks.registry import FRAMEWORKS, choose
from rcdiag.runtime.errors import ConfigError

SAMPLE = str(ROOT / "sample_data" / "healthy.parquet")
OUTLIERS = str(ROOT / "sample_data" / "outliers.parquet")
MIS_HELPER = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


def test_the_flag_names_every_framework_of_the_registry() -> None:
    assert tuple(FRAMEWORKS) == AS_NAMES


@pytest.mark.parametrize("sample", ["healthy", "outliers", "topk_offset"])
def test_as_verl_is_a_plain_analyze_byte_for_byte(sample: str, capsys: pytest.CaptureFixture) -> None:
    path = str(ROOT / "sample_data" / f"{sample}.parquet")
    _, plain, _ = run(capsys, "analyze", path, "--format", "json", "-q")
    _, as_verl, _ = run(capsys, "analyze", path, "--as", "verl", "--format", "json", "-q")
    assert plain == as_verl


def test_as_verl_options_are_the_engine_fields(capsys: pytest.CaptureFixture) -> None:
    _, flags, _ = run(capsys, "analyze", SAMPLE, "--is", "token", "--rs", "token_k1", "--rs-threshold", "0.5_2.0",
                      "--format", "json", "-q")  # fmt: skip
    _, options, _ = run(capsys, "analyze", SAMPLE, "--as-option",
                        'algorithm.rollout_correction={"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}',
                        "--as-option", "rollout_is=token", "--format", "json", "-q")  # fmt: skip
    assert json.loads(flags)["metrics"] == json.loads(options)["metrics"]
    _, whole, _ = run(capsys, "analyze", SAMPLE, "--as-option", "rollout_is=token", "--as-option",
                      'algorithm.rollout_correction={"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}',
                      "--format", "json", "-q")  # fmt: skip
    assert "rollout_corr/rollout_is_mean" not in json.loads(whole)["metrics"]  # a block given whole: defaults


def test_values_bare_words_and_blocks_parse_as_documented() -> None:
    assert parse_value("3.0") == 3.0 and parse_value("null") is None and parse_value("[0.5, 5]") == [0.5, 5]
    assert parse_value("token_mask") == "token_mask" and parse_value('{"a": 1}') == {"a": 1}
    whole = choose("areal", ['actor.rejection_sampling={"level": "sequence"}']).settings.to_dict()
    field = choose("areal", ["rejection_sampling.level=sequence"]).settings.to_dict()
    assert whole == field
    assert whole["actor.rejection_sampling"] == {
        "level": "sequence", "action": "mask", "metric": "ratio", "agg": "mean", "upper": 5.0, "lower": None,
    }  # fmt: skip
    cap = choose("trl", ["vllm_importance_sampling_cap=2"]).settings.to_dict()
    assert cap["vllm_importance_sampling_clip_max"] == 2.0  # TRL's deprecated cap sets clip_max


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--as", "trl", "--as-option", "vllm_importance_sampling_mode=foo"),
         "--as-option vllm_importance_sampling_mode=foo: takes token_truncate, token_mask, sequence_truncate or "
         "sequence_mask, got 'foo'"),
        (("--as", "trl", "--as-option", "nope=1"), "--as-option nope=1: TRL 1.16.0 has no option 'nope'"),
        (("--as", "trl", "--as-option", "vllm_importance_sampling_clip_max"), "expected KEY=VALUE"),
        (("--as", "trl", "--as-option", "vllm_importance_sampling_clip_max=abc"), "takes a number (or null)"),
        (("--as", "trl", "--as-option", "vllm_importance_sampling_clip_min=3", "--as-option",
          "vllm_importance_sampling_clip_max=2"),
         "vllm_importance_sampling_clip_min (3.0) must be less than vllm_importance_sampling_clip_max (2.0)."),
        (("--as", "trl", "--as-option", "vllm_importance_sampling_mode=token_truncate", "--as-option",
          "vllm_importance_sampling_clip_max=null"), "TRL 1.16.0 crashes at its first batch"),
        (("--as", "areal", "--as-option", "rejection_sampling.upper=0.9"), "upper must be > 1.0 for 'ratio' metric"),
        (("--as", "areal", "--as-option", 'rejection_sampling={"metric": "kl_k3", "action": "clamp"}'),
         "action='clamp' only supports metric='ratio'"),
        (("--as", "areal", "--as-option", 'rejection_sampling={"levels": "token"}'),
         "actor.rejection_sampling has no field 'levels'"),
        (("--as", "openrlhf", "--as-option", "algo.advantage.is_correction_threshold=[1]"),
         "takes two numbers [low, high]"),
        (("--as", "trl", "--preset", "decoupled_token_is"), "--preset configures verl's correction"),
        (("--as", "roll", "--as-option", 'filters=[{"enabled": true, "agg": "token"}]'),
         "train_infer_correction.filters[0] has no field 'agg'"),
        (("--as", "roll", "--as-option", 'filters={"enabled": true}'), "takes a JSON list of objects of enabled"),
        (("--as", "nemo-rl", "--as-option", "loss_fn.truncated_importance_sampling_type=tis"),
         "truncated importance sampling is only supported when use_importance_sampling_correction is True"),
        (("--as", "nemo-rl", "--as-option", "loss_fn.sequence_level_importance_ratios=true"),
         "sequence-level importance sampling (e.g. GSPO) is mutually exclusive with token-level loss"),
        (("--as", "megatron",), "--as megatron: unknown framework"),
        (("--as", "slime", "--as-option", "use_tis=true", "--as-option", f"custom_tis_function_path={MIS_HELPER}",
          "--as-option", "tis_level=geometric"), "Unsupported tis_level: geometric"),
        (("--as", "slime", "--as-option", "use_tis=true", "--as-option", f"custom_tis_function_path={MIS_HELPER}",
          "--as-option", "tis_mode=mask", "--as-option", "tis_lower_bound=3"), "needs tis_lower_bound < tis_upper_bound"),
        (("--as", "prime-rl", "--as-option", "loss.ipo_threshold=0.3"),
         "loss.ipo_threshold: Extra inputs are not permitted (the default loss has no ipo_threshold)"),
        (("--as", "prime-rl", "--as-option", 'loss={"type": "ipo", "ipo_threshold": -1}'),
         "loss.ipo_threshold: Input should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_exit_2(args: tuple, message: str, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "analyze", SAMPLE, *args)
    assert code == 2 and not out
    assert err.count("\n") == 1 and message in err, err


def test_json_has_the_keys_per_step_and_pooled_first(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "analyze", OUTLIERS, "--as", "trl", "--format", "json", "-q")
    report = json.loads(out)
    keys = report["framework"]["keys"]
    assert code == 0 and report["framework"]["release"] == "TRL 1.16.0"
    own = [k for k in keys if not k.startswith("rcdiag/")]
    assert list(report["metrics"])[: len(own)] == own
    for step in report["steps"]:
        assert list(step["metrics"])[: len(own)] == own
        assert {"rcdiag/trl/weight_mean", "rcdiag/trl/zeroed_fraction"} <= set(step["extras"])
    assert report["framework"]["options"]["vllm_importance_sampling_mode"] == "sequence_mask"


def test_defaults_that_log_nothing_say_so(capsys: pytest.CaptureFixture) -> None:
    for name, key in (("openrlhf", "vllm_kl"), ("areal", "ppo_actor/update/behave_imp_weight/avg")):
        code, out, _ = run(capsys, "analyze", SAMPLE, "--as", name, "--format", "json", "-q")
        report = json.loads(out)
        assert code == 0 and key not in report["metrics"] and report["framework"]["keys"] == []
        assert "default" in report["framework"]["notes"][0]


def test_terminal_shows_the_framework_table(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "analyze", OUTLIERS, "--as", "areal", "--as-option", "use_decoupled_loss=true",
                       "--as-option", "rejection_sampling.upper=2", "-q")  # fmt: skip
    assert code == 0
    assert "AReaL 1.0.4 (--as areal: actor.use_decoupled_loss=true" in out
    assert "ppo_actor/update/behave_imp_weight/avg" in out and "note: left out:" in out


@pytest.mark.parametrize(("name", "release"), [("trl", "TRL 1.16.0"), ("openrlhf", "OpenRLHF 0.11.0"),
                                               ("areal", "AReaL 1.0.4"), ("verl", "verl 0.9.1"),
                                               ("skyrl", "SkyRL a9564572e"), ("slime", "slime 624b824a"),
                                               ("prime-rl", "prime-rl 559b4477"), ("nemo-rl", "NeMo-RL 7ea279abf"),
                                               ("roll", "ROLL 8eb27cc2")])  # fmt: skip
def test_presets_as_shows_the_release_options_and_keys(name: str, release: str, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "presets", "--as", name)
    assert code == 0 and out.startswith(f"{release} (--as {name})")
    framework = choose(name).framework
    for option in framework.options:
        assert option.key in out
    for key in framework.keys:
        assert key.key in out
    assert ("decoupled_token_is" in out) == (name == "verl")  # verl's presets follow its options


@pytest.mark.parametrize(
    ("name", "options"),
    [("trl", {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_max": 1.05}),
     ("openrlhf", {"algo.advantage.is_correction_enable": True, "algo.advantage.is_correction_type": "seq-mask-tis"}),
     ("areal", {"use_decoupled_loss": True, "rejection_sampling": {"level": "sequence", "upper": 1.02}}),
     ("skyrl", {"tis_ratio_type": "sequence", "sequence_mask_metric": "geometric",
                "outlier_token_is_threshold_high": 100, "token_mask_is_threshold_low": 0.5,
                "token_mask_is_threshold_high": 2}),
     ("slime", {"use_tis": True, "custom_tis_function_path": MIS_HELPER, "tis_level": "sequence"}),
     ("prime-rl", {"loss": {"type": "ipo", "ipo_threshold": 0.05}}),
     ("nemo-rl", {"loss_fn.use_importance_sampling_correction": True,
                  "loss_fn.truncated_importance_sampling_type": "seq-mask-tis",
                  "loss_fn.truncated_importance_sampling_ratio": 1.01,
                  "loss_fn.truncated_importance_sampling_ratio_min": 0.99, "grpo.seq_logprob_error_threshold": 1.05}),
     ("roll", {"is_weight": {"enabled": True, "weight_type": "segment"},
               "filters": [{"enabled": True, "agg_type": "token", "diff_enabled": True},
                           {"enabled": True, "agg_type": "sequence", "ratio_low": 0.5, "ratio_high": 2}]})],
)  # fmt: skip
def test_state_files_and_workers_give_the_same_values(name: str, options: dict, tmp_path: Path) -> None:
    one = rcdiag.analyze(OUTLIERS, framework=name, framework_options=options, save_state=tmp_path / "s.json")
    merged = rcdiag.merge_states([tmp_path / "s.json"])
    workers = rcdiag.analyze(OUTLIERS, framework=name, framework_options=options, workers=2)
    keys = one.sections["framework"].to_dict()["keys"]
    assert keys
    for other in (merged, workers):
        assert other.sections["framework"].to_dict() == one.sections["framework"].to_dict()
        for mine, theirs in zip(one.steps, other.steps, strict=True):
            assert {k: mine.metrics.get(k, mine.extras.get(k)) for k in keys} == {
                k: theirs.metrics.get(k, theirs.extras.get(k)) for k in keys
            }


def test_library_refuses_as_the_command_line_does() -> None:
    with pytest.raises(ConfigError, match="has no option 'x'"):
        rcdiag.analyze(SAMPLE, framework="trl", framework_options={"x": 1})


def test_check_rules_name_the_frameworks_keys(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "check", OUTLIERS, "--as", "trl", "--min", "rcdiag/trl/weight_mean=0.9",
                       "--max", "sampling/importance_sampling_ratio/max=3", "--format", "json", "-q")  # fmt: skip
    result = json.loads(out)
    report = rcdiag.analyze(OUTLIERS, framework="trl")
    worst = min(step.extras["rcdiag/trl/weight_mean"] for step in report.steps)
    by_metric = {r["metric"]: r for r in result["results"]}
    assert code == 1 and by_metric["sampling/importance_sampling_ratio/max"]["status"] == "passed"
    assert by_metric["rcdiag/trl/weight_mean"]["status"] == "failed"
    assert by_metric["rcdiag/trl/weight_mean"]["value"] == pytest.approx(worst)
    code, _, err = run(capsys, "check", OUTLIERS, "--as", "openrlhf", "--max", "vllm_kl=0.01")
    assert code == 2 and "OpenRLHF 0.11.0 does not log 'vllm_kl' with these options" in err
    code, out, _ = run(capsys, "check", OUTLIERS, "--as", "openrlhf", "--as-option",
                       "algo.advantage.is_correction_enable=true", "--max", "vllm_kl=1", "-q")  # fmt: skip
    assert code == 0


def test_the_torch_backend_gives_the_same_values() -> None:
    pytest.importorskip("torch")
    for name, options in (("trl", {}), ("areal", {"use_decoupled_loss": True, "rejection_sampling": {"upper": 2}})):
        numpy = rcdiag.analyze(OUTLIERS, framework=name, framework_options=options)
        torch = rcdiag.analyze(OUTLIERS, framework=name, framework_options=options, device="torch-cpu")
        keys = numpy.sections["framework"].to_dict()["keys"]
        assert [(numpy.metrics | numpy.extras)[k] for k in keys] == [(torch.metrics | torch.extras)[k] for k in keys]
