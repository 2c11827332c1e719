"""Micro-batches: the split against verl's own seqlen_balancing, and both per-micro-batch paths against verl's own
functions run on the micro-batches of that split (verl 0.7.1's off-policy call on the RS-modified mask, and the
whole pipeline per micro-batch as bypass mode runs it, with verl's metric reductions); crashes where verl raises.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, padded_chunk, ragged_lists, random_batch, run, write_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verl_oracle import load_modules, require_verl

from rcdiag import CorrectionConfig, MicroBatchSettings, analyze, merge_states, preset
from rcdiag.engine.stream import Engine
from rcdiag.microbatch.partition import (
    SplitRefusedError,
    balance_batch_order,
    balanced_partitions,
    rearrange_micro_batches,
    workload,
)
from rcdiag.microbatch.plan import plan
from rcdiag.microbatch.rows import MicroBatchRows
from rcdiag.microbatch.simulate import StepMicroBatches, simulate_step
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.versions import VERSIONS

pytestmark = pytest.mark.verl
try:
    import torch
except ImportError:
    torch = None

P = "rollout_corr/"


def verl(version: str = "0.9.0") -> dict:
    require_verl(VERSIONS[version].semantics)
    loaded = load_modules(VERSIONS[version].semantics)
    assert loaded is not None
    return loaded


# ------------------------------------------------------------------------------------------------ the split


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
    k=st.integers(1, 8),
    equal=st.booleans(),
    version=st.sampled_from(["0.7.1", "0.9.0"]),
)
def test_balanced_partitions_are_verls(values: list[int], k: int, equal: bool, version: str) -> None:
    balancing = verl(version)["balancing"]
    try:
        theirs = balancing.get_seqlen_balanced_partitions(values, k, equal_size=equal)
    except AssertionError:
        with pytest.raises(SplitRefusedError):
            balanced_partitions(values, k, equal)
        return
    assert balanced_partitions(values, k, equal) == theirs


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=48),
    budget=st.integers(500, 20000),
    version=st.sampled_from(["0.7.1", "0.9.0"]),
)
def test_dynamic_micro_batches_are_verls(lengths: list[int], budget: int, version: str) -> None:
    """rearrange_micro_batches on a padded batch whose attention-mask sums are the sequence lengths."""
    balancing = verl(version)["balancing"]
    width = max(lengths)
    attention = torch.zeros((len(lengths), width), dtype=torch.int64)
    for i, n in enumerate(lengths):
        attention[i, :n] = 1
    batch = {"input_ids": torch.zeros_like(attention), "attention_mask": attention}
    try:
        _, theirs = balancing.rearrange_micro_batches(batch, max_token_len=budget)
    except AssertionError as exc:
        message = str(exc)
        with pytest.raises(SplitRefusedError) as ours:
            rearrange_micro_batches(np.array(lengths), budget, width)
        assert str(ours.value) == message
        return
    assert rearrange_micro_batches(np.array(lengths), budget, width) == theirs


def test_dynamic_micro_batch_count_after_a_sync_is_verls() -> None:
    """verl's min_num_micro_batch forces the count the way the DP all-reduce does."""
    balancing = verl()["balancing"]
    lengths = [300, 20, 50, 700, 90, 10, 400]
    attention = torch.zeros((7, 700), dtype=torch.int64)
    for i, n in enumerate(lengths):
        attention[i, :n] = 1
    batch = {"input_ids": attention, "attention_mask": attention}
    _, theirs = balancing.rearrange_micro_batches(batch, max_token_len=1000, min_num_micro_batch=5)
    assert rearrange_micro_batches(np.array(lengths), 1000, 700, count=5) == theirs


def test_balance_batch_order_by_hand() -> None:
    """verl's _balance_batch: equal-size KK parts of the workloads (verl's function), each sorted by (workload,
    index) and laid out even positions then odd positions reversed, concatenated."""
    balancing = verl()["balancing"]
    seqlens = np.array([100, 900, 40, 300, 300, 70, 500, 20])
    loads = (24576 * seqlens + seqlens**2).tolist()
    assert workload(seqlens) == loads
    expected = []
    for part in balancing.get_seqlen_balanced_partitions(loads, 2, equal_size=True):
        part = sorted(part, key=lambda i: (loads[i], i))
        expected += part[::2] + part[1::2][::-1]
    assert balance_batch_order(seqlens, 2) == expected
    assert sorted(expected) == list(range(8))


def test_static_layout_by_hand() -> None:
    """8 rows, 2 ranks, mini-batches of 2 rows per rank, micro-batches of 1: rank 0 holds rows 0-3."""
    layout = plan(MicroBatchSettings(micro_batch_size=1, mini_batch_size=2, dp_size=2), VERSIONS["0.9.1"],
                  np.ones(8, np.int64), np.ones(8, np.int64))  # fmt: skip
    assert layout.mini_batches == [[[[0], [1]], [[4], [5]]], [[[2], [3]], [[6], [7]]]]


@pytest.mark.parametrize(
    ("settings", "version", "message"),
    [
        (MicroBatchSettings(micro_batch_size=2, dp_size=3), "0.9.1",
         "only support equal chunk. Got size of DataProto 8 and chunk 3."),
        (MicroBatchSettings(micro_batch_size=3), "0.9.1",
         "data size must be divisible by force_group_size * micro_batch_size_per_gpu"),
        (MicroBatchSettings(micro_batch_size=3), "0.7.1",
         "normalized ppo_mini_batch_size 8 should be divisible by ppo_micro_batch_size_per_gpu 3"),
        (MicroBatchSettings(micro_batch_size=1, mini_batch_size=3), "0.9.1", "8 % 3 != 0"),
        (MicroBatchSettings(max_token_len=10, prompt_len=2), "0.9.1",
         "max_token_len must be greater than the sequence length. Got max_token_len=10 and max_seq_len=11"),
    ],
)  # fmt: skip
def test_splits_verl_refuses(settings: MicroBatchSettings, version: str, message: str) -> None:
    with pytest.raises(SplitRefusedError) as refused:
        plan(settings, VERSIONS[version], np.array([1, 2, 3, 9, 5, 6, 7, 8]), np.full(8, 9))
    assert str(refused.value) == message


def test_without_a_micro_batch_size_each_mini_batch_is_one_micro_batch() -> None:
    layout = plan(MicroBatchSettings(dp_size=2, mini_batch_size=2), VERSIONS["0.9.1"], np.ones(8, np.int64),
                  np.ones(8, np.int64))  # fmt: skip
    assert layout.mini_batches == [[[[0, 1]], [[4, 5]]], [[[2, 3]], [[6, 7]]]]


def test_a_short_last_mini_batch_under_0_7_1() -> None:
    """v0.7.1's DataProto.split leaves a short last mini-batch (and micro-batch); later releases refuse it."""
    layout = plan(MicroBatchSettings(micro_batch_size=2, mini_batch_size=4), VERSIONS["0.7.1"], np.ones(6, np.int64),
                  np.ones(6, np.int64))  # fmt: skip
    assert layout.mini_batches == [[[[0, 1], [2, 3]]], [[[4, 5]]]]


@pytest.mark.parametrize(
    "fields",
    [{"micro_batch_size": 2, "max_token_len": 100, "prompt_len": 1}, {"max_token_len": 100},
     {"micro_batch_size": 2, "prompt_len": 5}, {"micro_batch_size": 2, "sync_micro_num": True},
     {"micro_batch_size": 0}, {"micro_batch_size": 2, "balance_batch": True}],
)  # fmt: skip
def test_settings_that_mean_nothing_are_refused(fields: dict) -> None:
    with pytest.raises(ConfigError):
        MicroBatchSettings(**fields)


# ---------------------------------------------------------------------------------------- the two paths


def _dump(seed: int, rows: int = 16, empty: int = 1, noise: float = 0.3) -> tuple[np.ndarray, ...]:
    old, rollout, mask = random_batch(np.random.default_rng(seed), rows=rows, width=12, noise=noise, empty_rows=empty)
    return old, rollout, mask


def _simulate(arrays: tuple[np.ndarray, ...], config: CorrectionConfig, micro: MicroBatchSettings) -> StepMicroBatches:

    collector = MicroBatchRows(micro)  # the micro-batch section's state, fed by the engine as analyze feeds it
    Engine(config.resolve(), wholes=[collector]).run([padded_chunk(*arrays)])
    rows = collector.steps()[None]
    return simulate_step(None, rows, config.resolve(), micro)


def _assert_close(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    bad = [
        (k, ours[k], v)
        for k, v in theirs.items()
        if not (ours[k] is None and not math.isfinite(v))
        and not (ours[k] is not None and math.isclose(ours[k], v, rel_tol=2e-4, abs_tol=2e-5))
    ]
    assert not bad, bad


RS_CONFIGS = [
    {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.7_1.4"},
    {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.02},
    {"rollout_rs": "seq_sum_k1,token_k2", "rollout_rs_threshold": "0.3_3.0,0.3"},
    {},
]


@pytest.mark.parametrize("config", RS_CONFIGS)
@pytest.mark.parametrize(
    "micro",
    [MicroBatchSettings(micro_batch_size=1), MicroBatchSettings(micro_batch_size=4, mini_batch_size=8, dp_size=2),
     MicroBatchSettings(max_token_len=30, prompt_len=5, dp_size=2, balance_batch=True)],
)  # fmt: skip
def test_legacy_actor_path_is_verl_0_7_1s(config: dict, micro: MicroBatchSettings) -> None:
    """verl 0.7.1: RS on the whole batch (driver), then compute_rollout_corr_metrics_from_logprobs per
    micro-batch on the modified mask, reduce_metrics over all of them; AssertionError where we predict it."""
    modules = verl("0.7.1")
    helper, reduce_metrics = modules["helper"], modules["metric"].reduce_metrics
    arrays = _dump(11)
    result = _simulate(arrays, CorrectionConfig(verl_version="0.7.1", **config), micro)
    old, rollout, mask = (torch.from_numpy(a) for a in arrays)
    _, modified, _ = helper.compute_rollout_correction_and_rejection_mask(old, rollout, mask, **config)
    collected: dict[str, list] = {}
    crashed = []
    for where, mb in result.each():
        index = torch.tensor(mb.rows)
        try:
            values = helper.compute_rollout_corr_metrics_from_logprobs(old[index], rollout[index], modified[index])
        except AssertionError as exc:
            crashed.append((where, str(exc)))
            continue
        for key, value in values.items():
            collected.setdefault(key, []).append(value)
    assert crashed == [
        (where, "Expected at least one valid token in response_mask") for where, _ in result.legacy_crashes
    ]
    if crashed:
        assert result.legacy_metrics is None
    else:
        _assert_close(result.legacy_metrics, reduce_metrics(collected))


@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
@pytest.mark.parametrize(
    "config", [*RS_CONFIGS, {"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": 1.5},
               # every key of a seq_max_* option contains "max": verl reduces even its _mean and _min by np.max
               {"rollout_rs": "seq_max_k3", "rollout_rs_threshold": 0.5},
               {"rollout_is": "sequence", "rollout_is_threshold": 5.0}]
)  # fmt: skip
@pytest.mark.parametrize(
    "micro",
    [MicroBatchSettings(micro_batch_size=2, mini_batch_size=4, dp_size=2),
     MicroBatchSettings(max_token_len=40, prompt_len=3, dp_size=2)],
)  # fmt: skip
def test_bypass_path_is_verls(config: dict, micro: MicroBatchSettings, version: str) -> None:
    """Bypass mode: the pipeline per micro-batch on the original mask; v0.8.0 on: Metric(MEAN).aggregate_dp per
    mini-batch over ranks and micro-batches, then reduce_metrics over mini-batches; v0.7.1: reduce_metrics over
    every micro-batch."""
    modules = verl(version)
    helper, metric = modules["helper"], modules["metric"]
    arrays = _dump(5, rows=16, empty=0)
    result = _simulate(arrays, CorrectionConfig(verl_version=version, bypass_mode=True, **config), micro)
    old, rollout, mask = (torch.from_numpy(a) for a in arrays)
    flat: dict[str, list] = {}
    per_mini: dict[str, list] = {}
    for ranks in result.mini_batches:
        lists: dict[str, list] = {}
        for micros in ranks:
            rank_lists: dict[str, object] = {}
            for mb in micros:
                index = torch.tensor(mb.rows)
                _, _, values = helper.compute_rollout_correction_and_rejection_mask(
                    old[index], rollout[index], mask[index], **config
                )
                for key, value in values.items():
                    flat.setdefault(key, []).append(value)
                    rank_lists.setdefault(key, metric.Metric("mean")).append(value)
            for key, value in rank_lists.items():
                lists.setdefault(key, []).append(value)
        for key, value in lists.items():
            per_mini.setdefault(key, []).append(metric.Metric.aggregate_dp(value))
    expected = metric.reduce_metrics(flat if version == "0.7.1" else per_mini)
    assert result.bypass_crashes == []
    _assert_close(result.bypass_metrics, expected)


def test_bypass_valueerror_where_a_micro_batch_has_no_valid_token() -> None:
    modules = verl("0.9.0")
    arrays = _dump(7, rows=8, empty=2)
    result = _simulate(arrays, CorrectionConfig(bypass_mode=True), MicroBatchSettings(micro_batch_size=1))
    old, rollout, mask = (torch.from_numpy(a) for a in arrays)
    raised = []
    for where, mb in result.each():
        index = torch.tensor(mb.rows)
        try:
            modules["helper"].compute_rollout_correction_and_rejection_mask(old[index], rollout[index], mask[index])
        except ValueError as exc:
            raised.append((where, str(exc)))
    assert len(raised) == 2
    assert [(w, "ValueError: " + m) for w, m in raised] == [(w, mb.bypass_crash) for w, mb in result.bypass_crashes]
    assert result.bypass_metrics is None


# ------------------------------------------------------------------------------------------ end to end


def test_worked_example_crashes_at_micro_batch_size_1_not_8(capsys: pytest.CaptureFixture) -> None:
    """docs/verl-differences.md's example: outliers.parquet under verl 0.7.1 with decoupled_k3_rs. Independently of
    rcdiag: verl 0.7.1's own RS mask leaves some row with no valid token (a micro-batch of 1 row asserts), while
    every 8 consecutive rows keep one."""
    import pyarrow.parquet as pq

    modules = verl("0.7.1")
    path = ROOT / "sample_data" / "outliers.parquet"
    table = pq.read_table(path).to_pydict()
    steps = np.array(table["step"])
    kept_rows = []
    for step in sorted(set(steps.tolist())):
        idx = np.flatnonzero(steps == step)
        width = max(len(table["old_log_prob"][i]) for i in idx)
        arrays = [np.zeros((len(idx), width), np.float32) for _ in range(2)] + [np.zeros((len(idx), width), np.int64)]
        for j, i in enumerate(idx):
            n = len(table["old_log_prob"][i])
            arrays[0][j, :n], arrays[1][j, :n] = table["old_log_prob"][i], table["rollout_log_prob"][i]
            arrays[2][j, :n] = table["response_mask"][i]
        _, modified, _ = modules["helper"].compute_rollout_correction_and_rejection_mask(
            *(torch.from_numpy(a) for a in arrays), rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01
        )
        kept_rows.append(modified.sum(dim=1).numpy())
    assert any((kept == 0).any() for kept in kept_rows)
    assert all((kept.reshape(-1, 8).sum(axis=1) > 0).all() for kept in kept_rows)
    base = ("analyze", str(path), "--verl-version", "0.7.1", "--preset", "decoupled_k3_rs", "--format", "json")
    one = json.loads(run(capsys, *base, "--micro-batch-size", "1")[1])
    eight = json.loads(run(capsys, *base, "--micro-batch-size", "8")[1])
    assert one["microbatch"]["legacy_actor_assert_would_fire"] is True
    assert eight["microbatch"]["legacy_actor_assert_would_fire"] is False
    assert "verl_crash_microbatch_all_rejected" in {f["code"] for f in one["findings"]}
    assert "verl_crash_microbatch_all_rejected" not in {f["code"] for f in eight["findings"]}
    assert eight["microbatch"]["steps"][0]["legacy_metrics"] is not None
    # the Python form in the docs
    report = analyze(path, preset("decoupled_k3_rs", "0.7.1"), microbatch=MicroBatchSettings(micro_batch_size=1))
    assert report.microbatch is not None and report.microbatch.to_dict()["legacy_actor_assert_would_fire"] is True
    assert [f.code for f in report.findings if f.severity == "error"] == ["verl_crash_microbatch_all_rejected"]


def test_cli_json_schema_and_table(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    arrays = _dump(3, rows=8, empty=1)
    path = write_dump(tmp_path / "d.parquet", ragged_lists(*arrays))
    code, out, err = run(capsys, "analyze", str(path), "--preset", "bypass_ppo_clip", "--micro-batch-size", "2",
                         "--dp-size", "2", "--format", "json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)["microbatch"]
    assert data["settings"]["micro_batch_size"] == 2 and data["path"] == "bypass"
    assert set(data) >= {"legacy_actor_assert_would_fire", "bypass_valueerror_would_fire", "legacy_metrics",
                         "bypass_metrics", "mini_batches"}  # fmt: skip
    ranks = data["mini_batches"][0]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["rows"] for r in ranks] == [4, 4]
    micro = ranks[0]["micro_batches"][0]
    assert micro["rows"] == [0, 1]
    assert micro["n_valid_tokens"] == int(arrays[2][:2].sum())
    table = run(capsys, "analyze", str(path), "--preset", "bypass_ppo_clip", "--micro-batch-size", "1")[1]
    assert "Micro-batches that would crash" in table and "ValueError" in table


def test_cli_refused_split_is_a_finding_not_a_crash(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = write_dump(tmp_path / "d.parquet", ragged_lists(*_dump(3, rows=8)))
    code, out, err = run(capsys, "analyze", str(path), "--micro-batch-size", "3", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    finding = next(f for f in data["findings"] if f["code"] == "verl_refuses_microbatch_setup")
    assert "data size must be divisible" in finding["message"] and finding["severity"] == "error"
    assert data["microbatch"]["refused"] == "data size must be divisible by force_group_size * micro_batch_size_per_gpu"
    code, out, _ = run(capsys, "analyze", str(path), "--max-token-len", "5", "--prompt-len", "4")
    assert code == 0 and "max_token_len must be greater than the sequence length" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [(("--max-token-len", "100"), "add --prompt-len P"), (("--micro-batch-size", "2", "--max-token-len", "9"), "not both"),
     (("--micro-batch-size", "2", "--workers", "2"), "without --workers or --ray")],
)  # fmt: skip
def test_cli_bad_micro_batch_flags_are_exit_2(
    capsys: pytest.CaptureFixture, tmp_path: Path, flags: tuple, message: str
) -> None:
    path = write_dump(tmp_path / "d.parquet", ragged_lists(*_dump(3, rows=8)))
    code, _, err = run(capsys, "analyze", str(path), *flags)
    assert code == 2 and message in err and "Traceback" not in err


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 1000), chunk=st.integers(1, 200))
def test_chunking_does_not_change_the_split(seed: int, chunk: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("c") / "d.parquet"
    columns = ragged_lists(*_dump(seed, rows=12, empty=2))
    columns["step"] = [i % 2 for i in range(12)]
    write_dump(path, columns)
    config = CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold=1.3, verl_version="0.7.1")
    micro = MicroBatchSettings(micro_batch_size=2, dp_size=2)
    whole = analyze(path, config, microbatch=micro).to_dict()["microbatch"]
    assert analyze(path, config, microbatch=micro, chunk_tokens=chunk).to_dict()["microbatch"] == whole


def test_the_micro_batches_are_a_section_kept_out_of_saved_states(tmp_path: Path) -> None:
    """``microbatch=`` is a shim for the section: the same report given as ``sections=``; ``--save-state`` leaves
    its rows out (every valid token), so the state merges into the report of a plain analyze; its state itself
    still round-trips through the table of kinds."""
    from rcdiag.microbatch.section import MicroBatchSection
    from rcdiag.sections.registry import KNOWN

    path = ROOT / "sample_data" / "outliers.parquet"
    config = preset("decoupled_k3_rs", "0.7.1")
    micro = MicroBatchSettings(micro_batch_size=8)
    shim = analyze(path, config, microbatch=micro, save_state=tmp_path / "s.json").to_dict()
    assert analyze(path, config, sections=[MicroBatchSection(micro)]).to_dict() == shim
    assert shim["microbatch"]["settings"]["micro_batch_size"] == 8
    saved = json.loads((tmp_path / "s.json").read_text())
    assert sorted(saved["state"]["whole_dump"]) == ["detectors", "exact", "slices"]
    merged = merge_states([tmp_path / "s.json"]).to_dict()
    assert "microbatch" not in merged and merged["metrics"] == shim["metrics"]
    rows = MicroBatchRows(micro)
    Engine(config.resolve(), wholes=[rows]).run([padded_chunk(*_dump(3))])
    back = KNOWN.whole_dump(MicroBatchRows.KEY).from_state_dict(json.loads(json.dumps(rows.state_dict())))
    assert json.dumps(back.state_dict()) == json.dumps(rows.state_dict())


def test_table_per_step_section(capsys: pytest.CaptureFixture) -> None:
    path = str(ROOT / "sample_data" / "outliers.parquet")
    out = run(capsys, "analyze", path, "--verl-version", "0.7.1", "--preset", "decoupled_k3_rs", "--micro-batch-size",
              "8")[1]  # fmt: skip
    data = json.loads(run(capsys, "analyze", path, "--verl-version", "0.7.1", "--preset", "decoupled_k3_rs",
                          "--micro-batch-size", "8", "--format", "json")[1])  # fmt: skip
    assert "Per step: micro-batches, crashes" in out and "No micro-batch would crash either path (48" in out
    assert "verl 0.7.1 logged the actor's values" in out
    first = data["microbatch"]["steps"][0]["legacy_metrics"]["rollout_corr/kl"]
    assert f"{first:.6g}" in out


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    dp=st.integers(1, 4),
    mini=st.none() | st.integers(1, 12),
    micro=st.none() | st.integers(1, 6),
    budget=st.none() | st.integers(50, 2000),
    balance=st.booleans(),
    version=st.sampled_from(list(VERSIONS)),
)
def test_every_row_lands_in_exactly_one_micro_batch_of_its_rank(
    lengths: list[int], dp: int, mini: int | None, micro: int | None, budget: int | None, balance: bool, version: str
) -> None:
    """Whatever the setup, a split verl accepts places each row once, on one rank, with equal rows per rank; a
    rank's mini-batches follow its rows in order; under a token budget the counts are equal across ranks from
    v0.8.0 (verl's all-reduce)."""
    if micro is not None and budget is not None:
        budget = None
    prompt = 7 if budget is not None or balance else None
    settings = MicroBatchSettings(micro_batch_size=micro, mini_batch_size=mini, dp_size=dp, max_token_len=budget,
                                  prompt_len=prompt, balance_batch=balance)  # fmt: skip
    response = np.array(lengths)
    try:
        layout = plan(settings, VERSIONS[version], response, response)
    except SplitRefusedError:
        return
    placed = [row for ranks in layout.mini_batches for micros in ranks for mb in micros for row in mb]
    assert sorted(placed) == list(range(len(lengths)))
    assert len({len(rows) for rows in layout.rank_rows}) == 1
    size = mini or len(layout.rank_rows[0])
    for rank, rows in enumerate(layout.rank_rows):
        for index, ranks in enumerate(layout.mini_batches):
            held = sorted(row for mb in ranks[rank] for row in mb)
            assert held == sorted(rows[index * size : (index + 1) * size])
            assert all(ranks[rank])
    if budget is not None and not VERSIONS[version].legacy_actor:
        assert all(len({len(micros) for micros in ranks}) == 1 for ranks in layout.mini_batches)


@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_cli_dynamic_balanced_split_is_verls(capsys: pytest.CaptureFixture, tmp_path: Path, version: str) -> None:
    """End to end through the CLI: balance_batch over 2 ranks, then rearrange_micro_batches per rank with the
    counts synced, against verl's own functions fed the sequence lengths (prompt + last valid position + 1)."""
    balancing = verl(version)["balancing"]
    old, rollout, mask = _dump(21, rows=12, empty=1)
    mask[2, 9:] = 0  # a response that ends early (trailing mask 0 is padding, not response)
    mask[4, 3] = 0  # a masked token inside a response still counts in its length
    path = write_dump(tmp_path / "d.parquet", ragged_lists(old, rollout, mask))
    prompt, budget = 20, 70
    args = ("--max-token-len", str(budget), "--prompt-len", str(prompt), "--balance-batch", "--dp-size", "2",
            "--sync-micro-num", "--verl-version", version, "--format", "json")  # fmt: skip
    code, out, err = run(capsys, "analyze", str(path), *args)
    assert code == 0, err
    ranks = json.loads(out)["microbatch"]["mini_batches"][0]["ranks"]
    valid = mask.astype(bool)
    response = np.array([np.flatnonzero(row).max() + 1 if row.any() else 0 for row in valid])
    seqlens = prompt + response
    loads = (24576 * seqlens + seqlens**2).tolist()
    order = []
    for part in balancing.get_seqlen_balanced_partitions(loads, 2, equal_size=True):
        part = sorted(part, key=lambda i: (loads[i], i))
        order += part[::2] + part[1::2][::-1]
    chunks = [order[:6], order[6:]]
    counts = [min(6, -(-int(seqlens[c].sum()) // budget)) for c in chunks]
    for rank, rows in enumerate(chunks):
        width = int(seqlens[rows].max()) if version != "0.7.1" else prompt + mask.shape[1]
        attention = torch.zeros((6, width), dtype=torch.int64)
        for i, row in enumerate(rows):
            attention[i, : seqlens[row]] = 1
        batch = {"input_ids": attention, "attention_mask": attention}
        _, parts = balancing.rearrange_micro_batches(batch, max_token_len=budget, min_num_micro_batch=max(counts))
        expected = [[rows[i] for i in part] for part in parts]
        assert [mb["rows"] for mb in ranks[rank]["micro_batches"]] == expected
