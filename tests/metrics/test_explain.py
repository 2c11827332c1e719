"""``analyze --explain``: breakdowns against an independent float64 computation, planted worst responses,
mergeability (chunks, workers, state files), the per-response export and the data frames."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES, padded_chunk, random_batch, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.explain.breakdowns import LOG_PROB_THRESHOLDS, PROB_EDGES, prob_bucket
from rcdiag.io import synthetic
from rcdiag.records.report import BucketRow

# ------------------------------------------------------------------------------------------ helpers


def flat(table: pa.Table) -> dict[str, np.ndarray]:
    """Per-token float64 values, each token's position in its list, its row, and the mask."""
    offsets = table.column("old_log_prob").combine_chunks().offsets.to_numpy()
    old = table.column("old_log_prob").combine_chunks().flatten().to_numpy().astype(np.float64)
    rollout = table.column("rollout_log_prob").combine_chunks().flatten().to_numpy().astype(np.float64)
    mask = table.column("response_mask").combine_chunks().flatten().to_numpy().astype(bool)
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(old)) - offsets[:-1][row]
    return {"old": old, "rollout": rollout, "mask": mask, "row": row, "position": position, "lengths": lengths}


def doubling_index(values: np.ndarray) -> np.ndarray:
    """[0,32) -> 0, [32,64) -> 1, ... by plain float64 log2 (an independent bucketing)."""
    out = np.zeros(values.shape, dtype=np.int64)
    big = values >= 32
    out[big] = np.floor(np.log2(values[big].astype(np.float64))).astype(np.int64) - 4
    return np.minimum(out, 26)


def expected_buckets(index: np.ndarray, lr: np.ndarray, count: int) -> list[dict]:
    out = []
    for k in range(count):
        d = lr[index == k]
        if not d.size:
            out.append({"tokens": 0})
            continue
        out.append(
            {
                "tokens": d.size,
                "kl": float(np.mean(-d)),
                "k3_kl": float(np.mean(np.exp(d) - d - 1.0)),
                "chi2_token": float(np.mean(np.exp(np.clip(d, -20, 20)) ** 2) - 1.0),
                "abs_log_ratio_mean": float(np.mean(np.abs(d))),
            }
        )
    return out


def assert_buckets(got: tuple[BucketRow, ...], want: list[dict]) -> None:
    assert len(got) <= len(want)
    assert all(w["tokens"] == 0 for w in want[len(got) :])
    for g, w in zip(got, want, strict=False):
        assert g.tokens == w["tokens"]
        for key in ("kl", "k3_kl", "chi2_token", "abs_log_ratio_mean"):
            if w["tokens"] == 0:
                assert getattr(g, key) is None
            else:
                # float32 per-token maths (as verl) against float64: about 1e-7 relative per token
                assert getattr(g, key) == pytest.approx(w[key], rel=1e-6, abs=1e-7), key


def long_dump(tmp_path: Path, **kwargs) -> tuple[Path, pa.Table]:
    table = synthetic.generate("healthy", rows=160, steps=4, seed=11, median_length=400, max_length=4096, **kwargs)
    path = tmp_path / "dump.parquet"
    synthetic.write(table, path, row_group_size=40)
    return path, table


# ------------------------------------------------------------------------------------------ breakdowns


def test_breakdowns_equal_an_independent_float64_computation(tmp_path: Path) -> None:
    path, table = long_dump(tmp_path)
    report = rcdiag.analyze(path, explain=True, chunk_tokens=7000)
    data = flat(table)
    valid = data["mask"]
    lr = (data["old"] - data["rollout"])[valid]
    breakdowns = report.explain.breakdowns

    assert_buckets(breakdowns.position, expected_buckets(doubling_index(data["position"][valid]), lr, 27))
    probability = np.exp(data["rollout"][valid])
    prob_index = np.searchsorted(np.array(PROB_EDGES[1:-1]), probability, side="right")
    assert_buckets(breakdowns.rollout_prob, expected_buckets(prob_index, lr, 8))
    valid_per_row = np.bincount(data["row"][valid], minlength=len(data["lengths"]))
    assert_buckets(breakdowns.length, expected_buckets(doubling_index(valid_per_row[data["row"][valid]]), lr, 27))

    for name in ("position", "rollout_prob", "length"):
        assert sum(b.tokens for b in getattr(breakdowns, name)) == report.input.valid_tokens
    assert [(b.lo, b.hi) for b in breakdowns.position[:3]] == [(0, 32), (32, 64), (64, 128)]
    assert breakdowns.rollout_prob[-1].lo == 0.99 and breakdowns.rollout_prob[-1].hi == 1.0
    assert len(breakdowns.rollout_prob) == 8


def test_probability_buckets_agree_with_float64_exp_exactly_at_their_edges() -> None:
    edges = np.array(PROB_EDGES[1:-1])
    for t in LOG_PROB_THRESHOLDS:
        for value in (t, np.nextafter(t, np.float32(-np.inf)), np.nextafter(t, np.float32(np.inf))):
            want = int(np.searchsorted(edges, math.exp(float(value)), side="right"))
            assert int(prob_bucket(np.array([value], dtype=np.float32))[0]) == want
    assert prob_bucket(np.array([0.0, -np.inf], dtype=np.float32)).tolist() == [7, 0]  # p = 1 is in [0.99, 1]


# ------------------------------------------------------------------------------------------ worst responses


def planted(tmp_path: Path) -> tuple[Path, dict[int, float], pa.Table]:
    """A dump where rows 7, 95 and 150 get the largest |log-ratio sums| (known sizes and signs), with a uid."""
    table = synthetic.generate("healthy", rows=160, steps=4, seed=5, masked_span_rate=0.3)
    data = table.to_pydict()
    shifts = {7: 0.05, 95: -0.08, 150: 0.02}
    for row, shift in shifts.items():
        data["rollout_log_prob"][row] = [min(v - shift, 0.0) for v in data["rollout_log_prob"][row]]
    data["rollout_log_prob"][95][3] = data["old_log_prob"][95][3] - 5.0  # the largest single token, at position 3
    data["response_mask"][95][3] = 1
    data["uid"] = [f"u{r:04d}" for r in range(160)]
    out = pa.table(data).cast(
        pa.schema([*(table.schema.field(n) for n in table.column_names), pa.field("uid", pa.string())])
    )
    path = tmp_path / "planted.parquet"
    pq.write_table(out, path, row_group_size=32)
    return path, shifts, out


def brute_force_worst(table: pa.Table, n: int) -> list[tuple[int, float]]:
    data = flat(table)
    valid = data["mask"]
    sums = np.bincount(data["row"][valid], weights=(data["old"] - data["rollout"])[valid], minlength=table.num_rows)
    order = sorted(range(table.num_rows), key=lambda r: (-abs(sums[r]), r))
    return [(r, float(sums[r])) for r in order[:n]]


@pytest.mark.parametrize("workers", [1, 2])
def test_planted_worst_responses_are_found_exactly(tmp_path: Path, workers: int) -> None:
    path, _, table = planted(tmp_path)
    report = rcdiag.analyze(path, explain=True, worst=5, chunk_tokens=3000, workers=workers)
    worst = report.explain.worst_sequences
    want = brute_force_worst(table, 5)
    assert [w.row for w in worst] == [r for r, _ in want]
    assert [w.row for w in worst[:3]] == [95, 7, 150]  # planted: sizes 0.08 n + 5, 0.05 n, 0.02 n
    for got, (_, total) in zip(worst, want, strict=True):
        assert got.log_ratio_sum == pytest.approx(total, rel=1e-9)
    top = worst[0]
    assert top.id == "u0095" and top.step == 2
    assert top.position_of_max == 3
    assert top.max_abs_log_ratio is not None
    assert top.max_abs_log_ratio == pytest.approx(5.0 - 0.08, abs=1e-5) or top.max_abs_log_ratio >= 5.0
    assert top.old_log_prob_at_max is not None and top.rollout_log_prob_at_max is not None
    assert top.old_log_prob_at_max - top.rollout_log_prob_at_max == pytest.approx(5.0, abs=1e-5)
    assert top.length == sum(table.column("response_mask")[95].as_py())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(min_value=200, max_value=60_000), worst=st.integers(min_value=0, max_value=12))
def test_chunk_size_changes_nothing(tmp_path: Path, chunk: int, worst: int) -> None:
    path = SAMPLES / "outliers.parquet"
    a = rcdiag.analyze(path, explain=True, worst=worst)
    b = rcdiag.analyze(path, explain=True, worst=worst, chunk_tokens=chunk)
    assert a.explain.worst_sequences == b.explain.worst_sequences
    for (_, buckets), (_, others) in zip(a.explain.breakdowns.bucketed(), b.explain.breakdowns.bucketed(), strict=True):
        for x, y in zip(buckets, others, strict=True):
            assert x.tokens == y.tokens
            for key in ("kl", "k3_kl", "chi2_token", "abs_log_ratio_mean"):
                u, v = getattr(x, key), getattr(y, key)
                assert u == v or u == pytest.approx(v, rel=1e-9, abs=1e-15)
    assert [f.code for f in a.findings] == [f.code for f in b.findings]


# ------------------------------------------------------------------------------------------ merging


def test_save_state_and_merge_give_the_single_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, _, table = planted(tmp_path)
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(table.slice(0, 70), first)
    pq.write_table(table.slice(70), second)
    for part in (first, second):
        code, _, err = run(capsys, "analyze", part, "--explain", "--worst", "5", "--save-state", f"{part}.json", "-q")
        assert code == 0, err
    code, out, err = run(capsys, "merge", f"{first}.json", f"{second}.json", "--format", "json")
    assert code == 0, err
    whole = rcdiag.analyze(path, explain=True, worst=5).to_dict()
    data = json.loads(out)
    assert [w["row"] for w in data["worst_sequences"]] == [w["row"] for w in whole["worst_sequences"]]
    assert [w["id"] for w in data["worst_sequences"]] == [w["id"] for w in whole["worst_sequences"]]
    assert {f["code"] for f in data["findings"]} == {f["code"] for f in whole["findings"]}
    for name in ("position", "rollout_prob", "length"):
        assert [b["tokens"] for b in data["breakdowns"][name]] == [b["tokens"] for b in whole["breakdowns"][name]]
        for x, y in zip(data["breakdowns"][name], whole["breakdowns"][name], strict=True):
            assert x["k3_kl"] == y["k3_kl"] or x["k3_kl"] == pytest.approx(y["k3_kl"], rel=1e-9)


def test_merge_refuses_a_state_without_explain(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for name, flags in (("a", ["--explain"]), ("b", []), ("c", ["--worst", "3"])):
        shard = tmp_path / f"{name}.parquet"
        shard.write_bytes((SAMPLES / "healthy.parquet").read_bytes())
        assert run(capsys, "analyze", shard, *flags, "--save-state", tmp_path / f"{name}.json", "-q")[0] == 0
    code, _, err = run(capsys, "merge", tmp_path / "a.json", tmp_path / "b.json")
    assert code == 2 and "--explain" in err and "Traceback" not in err
    code, _, err = run(capsys, "merge", tmp_path / "a.json", tmp_path / "c.json")
    assert code == 2 and "--worst" in err


# ------------------------------------------------------------------------------------------ export and frames


@pytest.mark.parametrize("workers", [1, 2])
def test_sequences_file_has_one_row_per_response(tmp_path: Path, workers: int) -> None:
    path, _, table = planted(tmp_path)
    target = tmp_path / "per_response.parquet"
    report = rcdiag.analyze(
        path,
        rcdiag.CorrectionConfig(
            rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=1e-3
        ),
        sequences=target,
        workers=workers,
        chunk_tokens=4000,
    )
    frame = report.sequences_frame()
    assert frame.height == table.num_rows
    assert frame["row"].to_list() == list(range(table.num_rows))
    assert frame["id"].to_list() == table.column("uid").to_pylist()
    data = flat(table)
    valid = data["mask"]
    lr = data["old"] - data["rollout"]
    sums = np.bincount(data["row"][valid], weights=lr[valid], minlength=table.num_rows)
    counts = np.bincount(data["row"][valid], minlength=table.num_rows)
    np.testing.assert_allclose(frame["log_ratio_sum"].to_numpy(), sums, rtol=1e-9, atol=1e-9)
    assert frame["valid_tokens"].to_list() == counts.tolist()
    assert frame["length"].to_list() == data["lengths"].tolist()
    weights = np.minimum(np.exp(np.clip(sums, -20, 20)), 2.0)
    got = frame["seq_is_weight"].to_numpy()
    np.testing.assert_allclose(got[counts > 0], weights[counts > 0], rtol=1e-9)
    k3 = np.exp(np.clip(lr, -20, 20)) - 1 - np.clip(lr, -20, 20)
    row_k3 = np.bincount(data["row"][valid], weights=k3[valid], minlength=table.num_rows) / np.maximum(counts, 1)
    np.testing.assert_allclose(frame["rs_seq_mean_k3_stat"].to_numpy(), row_k3, rtol=1e-4, atol=1e-7)
    rejected = frame["rs_seq_mean_k3_rejected"].to_numpy()
    clear = np.abs(row_k3 - 1e-3) > 1e-6
    assert (rejected[clear] == ((row_k3 > 1e-3) & (counts > 0))[clear]).all()
    assert frame.filter(pl.col("row") == 95)["position_of_max"].item() == 3
    assert report.to_dict()["sequences_path"] == str(target)
    assert not list(tmp_path.glob(".rcdiag-sequences-*"))  # the scratch parts are gone


def test_steps_frame_is_a_polars_frame_of_the_step_metrics() -> None:
    report = rcdiag.analyze(SAMPLES / "step_trend.parquet")
    frame = report.steps_frame()
    assert isinstance(frame, pl.DataFrame)
    assert frame["step"].to_list() == [s.step for s in report.steps]
    assert frame["rollout_corr/kl"].to_list() == [s.metrics["rollout_corr/kl"] for s in report.steps]
    rising = frame.filter(pl.col("rollout_corr/k3_kl") > frame["rollout_corr/k3_kl"].median())
    assert rising["step"].to_list() == [3, 4, 5]
    with pytest.raises(ValueError, match="sequences"):
        report.sequences_frame()


# ------------------------------------------------------------------------------------------ CLI


def test_cli_explain_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, _, _ = planted(tmp_path)
    code, out, err = run(capsys, "analyze", path, "--explain", "--worst", "2", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data["breakdowns"]) == {"position", "rollout_prob", "length"}
    assert [w["id"] for w in data["worst_sequences"]] == ["u0095", "u0007"]
    code, out, _ = run(capsys, "analyze", path, "--explain", "-q", "--details")
    assert code == 0
    for text in ("By token position", "Worst responses", "temperature_mismatch", "u0095"):
        assert text in out
    plain = json.loads(run(capsys, "analyze", path, "--format", "json")[1])
    assert "breakdowns" not in plain and "worst_sequences" not in plain


def test_worst_given_as_its_default_still_turns_explain_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--worst 10`` is a request for ``--explain`` like any other ``--worst``: the default is no sentinel."""
    path, _, _ = planted(tmp_path)
    code, out, err = run(capsys, "analyze", path, "--worst", "10", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data["breakdowns"]) == {"position", "rollout_prob", "length"} and len(data["worst_sequences"]) == 10
    assert rcdiag.analyze(path, worst=10).explain is not None
    assert rcdiag.analyze(path).explain is None


def test_the_explain_keywords_are_a_shim_for_its_section(tmp_path: Path) -> None:
    """``analyze(worst=3)`` builds ``--explain``'s section: passed as ``sections=`` it is the same run."""
    from rcdiag.explain.section import ExplainSection

    path, _, _ = planted(tmp_path)
    shim = rcdiag.analyze(path, worst=3).to_dict()
    assert rcdiag.analyze(path, sections=[ExplainSection(worst=3)]).to_dict() == shim
    assert len(shim["worst_sequences"]) == 3 and "detectors_not_run" in shim


def test_cli_id_col_and_sequences(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, _, table = planted(tmp_path)
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(table.rename_columns([*table.column_names[:-1], "request"]), renamed)
    target = tmp_path / "seq.parquet"
    code, out, err = run(
        capsys, "analyze", renamed, "--id-col", "request", "--worst", "1", "--sequences", target, "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out)["worst_sequences"][0]["id"] == "u0095"
    assert pl.read_parquet(target)["id"][95] == "u0095"


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--id-col", "nope"], "no column 'nope'"),
        (["--sequences", "out.csv"], ".parquet suffix"),
        (["--sequences", "missing_dir/out.parquet"], "does not exist"),
    ],
)
def test_cli_explain_errors_are_one_line(
    tmp_path: Path, args: list[str], text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "analyze", SAMPLES / "healthy.parquet", "--explain", *args)
    assert code == 2
    assert text in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------ invariants


def test_row_order_changes_no_breakdown_or_detector(tmp_path: Path) -> None:
    path, table = long_dump(tmp_path)
    shuffled = tmp_path / "shuffled.parquet"
    order = np.random.default_rng(3).permutation(table.num_rows)
    pq.write_table(table.take(pa.array(order)), shuffled, row_group_size=33)
    a = rcdiag.analyze(path, explain=True)
    b = rcdiag.analyze(shuffled, explain=True, chunk_tokens=5000)
    for (_, buckets), (_, others) in zip(a.explain.breakdowns.bucketed(), b.explain.breakdowns.bucketed(), strict=True):
        for x, y in zip(buckets, others, strict=True):
            assert x.tokens == y.tokens
            assert x.kl == y.kl or x.kl == pytest.approx(y.kl, rel=1e-9, abs=1e-15)
    # the same responses are the worst, under their new row numbers
    assert [order[w.row] for w in b.explain.worst_sequences] == [w.row for w in a.explain.worst_sequences]
    assert [f.code for f in a.findings] == [f.code for f in b.findings]


def test_explain_does_not_depend_on_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's kernels and the torch backend (which runs the same explain kernel on the host) to the bit; a small
    dump's numpy path, which the CPU takes by default, agrees to float64 rounding (tests/engine/test_explain_twin.py)."""
    pytest.importorskip("torch", reason="pip install torch to compare the torch backend")
    from rcdiag.kernels.small import SWITCH

    monkeypatch.setenv(SWITCH, "0")
    path, _, _ = planted(tmp_path)
    config = rcdiag.CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    cpu = rcdiag.analyze(path, config, explain=True, sequences=tmp_path / "cpu.parquet")
    torch_cpu = rcdiag.analyze(path, config, explain=True, device="torch-cpu", sequences=tmp_path / "t.parquet")
    assert cpu.explain.breakdowns == torch_cpu.explain.breakdowns
    assert cpu.explain.worst_sequences == torch_cpu.explain.worst_sequences
    assert cpu.sequences_frame().equals(torch_cpu.sequences_frame())


def test_long_layout_names_responses_by_sequence_id(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    seq = np.repeat(np.array([30, 10, 20]), [50, 40, 60])
    old = -np.abs(rng.normal(0, 1, seq.size)).astype(np.float32)
    rollout = old.copy()
    rollout[seq == 20] -= 0.3  # sequence 20 is the worst
    order = rng.permutation(seq.size)  # tokens of a sequence anywhere in the file
    path = tmp_path / "long.parquet"
    pq.write_table(
        pa.table({"seq_id": seq[order], "old_log_prob": old[order], "rollout_log_prob": rollout[order]}), path
    )
    worst = rcdiag.analyze(path, worst=1).explain.worst_sequences[0]
    assert worst.id == 20 and worst.length == 60
    assert worst.log_ratio_sum == pytest.approx(60 * 0.3, rel=1e-5)


def test_skipped_rows_keep_their_numbers(tmp_path: Path) -> None:
    _, _, table = planted(tmp_path)
    data = table.to_pydict()
    data["old_log_prob"][2][0] = float("nan")  # row 2 is bad and skipped
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table(data, schema=table.schema), bad)
    report = rcdiag.analyze(bad, explain=True, worst=3, on_bad_row="skip")
    assert report.input.skipped_rows == 1
    assert [w.row for w in report.explain.worst_sequences] == [95, 7, 150]


@pytest.mark.parametrize(
    ("target", "changed"),
    [
        ("rcdiag.kernels.explain_encoding.SMALL", 0.3),  # the series cut-off
        ("rcdiag.kernels.explain_encoding.GOLDEN", 0x9E3779B97F4A7C13),  # the row-group hash
        ("rcdiag.explain.detector_state.SHIFT_TOL", 0.02),
    ],
)
def test_a_state_file_with_another_explain_layout_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, target: str, changed: float
) -> None:
    """A constant the --explain state depends on, changed after the state was saved: the one layout hash differs,
    so merge refuses the file (exit 2, one line naming it) instead of merging sums that mean something else."""
    shard = tmp_path / "a.parquet"
    shard.write_bytes((SAMPLES / "healthy.parquet").read_bytes())
    assert run(capsys, "analyze", shard, "--explain", "--save-state", tmp_path / "a.json", "-q")[0] == 0
    assert run(capsys, "merge", tmp_path / "a.json", "-q")[0] == 0
    saved = json.loads((tmp_path / "a.json").read_text())["layout"]
    monkeypatch.setattr(target, changed)
    code, _, err = run(capsys, "merge", tmp_path / "a.json")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"a.json: was written by rcdiag {rcdiag.__version__}, whose states have another layout" in err
    assert f"layout {saved};" in err and "re-run 'rcdiag analyze ... --save-state'" in err


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pad=st.integers(min_value=1, max_value=700), seed=st.integers(min_value=0, max_value=99))
def test_trailing_padding_changes_nothing(tmp_path: Path, pad: int, seed: int) -> None:
    """Padding after the last valid token (mask 0, any values) moves no token's position, so nothing changes."""
    table = synthetic.generate("outliers", rows=64, steps=2, seed=seed)
    data = table.to_pydict()
    for key, fill in (("old_log_prob", -3.0), ("rollout_log_prob", -0.1), ("response_mask", 0)):
        data[key] = [row + [fill] * pad for row in data[key]]
    padded = tmp_path / "padded.parquet"
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table(data, schema=table.schema), padded)
    pq.write_table(table, plain)
    a, b = rcdiag.analyze(plain, explain=True), rcdiag.analyze(padded, explain=True)
    assert a.explain.breakdowns == b.explain.breakdowns
    assert a.explain.worst_sequences == b.explain.worst_sequences
    assert [f.code for f in a.findings] == [f.code for f in b.findings]


def test_the_worst_list_keeps_raw_tokens_only_for_responses_that_may_be_plotted() -> None:
    """Each response beats every earlier one, so each enters the list at the top and pushes the others down: the
    list holds at most a few raw traces (bounded memory), and the plotted ones are the top responses' tokens."""
    from rcdiag.explain.state import RowContext
    from rcdiag.explain.worst import PLOTTED, WorstResponses, token_trace
    from rcdiag.metrics.backend import NumpyBackend
    from rcdiag.metrics.block import Block

    rng = np.random.default_rng(5)
    worst = WorstResponses(50)
    tokens = {}
    for row in range(200):
        n = int(rng.integers(1, 2000))
        old = -np.abs(rng.normal(0, 1, n)).astype(np.float32)
        rollout = (old - np.float32(row / n)).astype(np.float32)  # log-ratio sum about ``row``
        lengths = np.array([n], dtype=np.int64)
        worst.update(
            Block(NumpyBackend(), old, rollout, lengths, rows=RowContext(lengths, None, np.array([row]), None, 0))
        )
        tokens[row] = old - rollout
        assert len(worst.traces) <= 2 * PLOTTED
    top = [entry.row for entry in worst.entries()[:PLOTTED]]
    assert top == [199, 198, 197, 196, 195]
    assert worst.plotted() == [token_trace(row, tokens[row], None) for row in top]


@pytest.mark.parametrize("worst", [0, 3])
def test_explain_takes_the_device_block(monkeypatch: pytest.MonkeyPatch, worst: int) -> None:
    """``--device cuda``'s path, run on torch's CPU tensors: --explain is fed the device's own block (its sums and
    token table read the rows on the host, where they already are); only the worst list (row sums, whose rounding
    follows the device's summation order) asks for the block's host twin, once a block. The state is the one the
    numpy engine gives, bit for bit."""
    pytest.importorskip("torch", reason="pip install torch to run the device path on CPU tensors")
    from rcdiag.engine.stream import Engine
    from rcdiag.explain.state import ExplainState
    from rcdiag.metrics import block as block_module
    from rcdiag.metrics.backend import NumpyBackend, TorchBackend

    rng = np.random.default_rng(11)
    old, rollout, mask = random_batch(rng, rows=60, width=50, outliers=0.02)
    chunk = padded_chunk(old, rollout, mask)
    chunk.tokens = rng.integers(0, 300, old.size).astype(np.int64)
    backends, twins = [], []
    fed = ExplainState.update
    monkeypatch.setattr(ExplainState, "update", lambda self, block: (backends.append(type(block.b)), fed(self, block)))
    twin = block_module._host_twin
    monkeypatch.setattr(block_module, "_host_twin", lambda block: (twins.append(1), twin(block))[1])
    states = []
    for backend in (NumpyBackend(), TorchBackend("cpu")):
        engine = Engine(rcdiag.CorrectionConfig().resolve(), backend, [ExplainState(worst)])
        engine.block_tokens = 500  # several blocks
        engine.run([copy.copy(chunk)])
        states.append(json.dumps(engine.state.whole_dump["explain"].state_dict()))
    blocks = len(backends) // 2
    assert blocks > 1 and backends == [NumpyBackend] * blocks + [TorchBackend] * blocks
    assert len(twins) == (blocks if worst else 0)
    assert states[0] == states[1]
