"""``--ray`` on a real local Ray instance (``ray.init(num_cpus=2)``, see conftest): a task per row group or shard,
reading from disk or from the S3 server, gives the single-process report to 1e-12 with the same skipped rows; a
failing part is retried by Ray and then named in one line; without Ray, exit 2 naming the extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run
from shard_reports import analyze_json, same_report

import rcdiag
from rcdiag.engine.parallel import RAY_RETRIES, Job, PartFailedError, on_ray
from rcdiag.io import Part


def test_ray_on_local_shards_equals_one_process(capsys: pytest.CaptureFixture, ray_local, local_run: Path) -> None:
    one = analyze_json(capsys, str(local_run))
    assert one["input"]["skipped_rows"] == 2
    same_report(analyze_json(capsys, str(local_run), "--ray"), one)
    # one file: a task per row group (4 of them), bad row included
    shard = str(local_run / "shard-1.parquet")
    assert pq.ParquetFile(shard).num_row_groups == 5
    same_report(analyze_json(capsys, shard, "--ray"), analyze_json(capsys, shard))


def test_ray_on_an_s3_prefix_equals_one_process(capsys: pytest.CaptureFixture, ray_local, local_run: Path,
                                                s3_run: str) -> None:  # fmt: skip
    same_report(analyze_json(capsys, s3_run, "--ray"), analyze_json(capsys, str(local_run)))


def test_progress_over_parts(ray_local, local_run: Path) -> None:
    events = []
    report = rcdiag.analyze(local_run / "shard-1.parquet", on_bad_row="skip", ray=True, on_chunk=events.append)
    assert [e.parts for e in events] == [1, 2, 3, 4, 5] and {e.total_parts for e in events} == {5}
    assert events[-1].rows == report.input.rows + report.input.skipped_rows == 36


def test_bad_rows_stop_the_run_as_in_one_process(capsys: pytest.CaptureFixture, ray_local, local_run: Path) -> None:
    code, _, one = run(capsys, "analyze", str(local_run))
    code_ray, out, err = run(capsys, "analyze", str(local_run), "--ray")
    assert code == code_ray == 2 and err == one and err.count("\n") == 1 and out == ""
    assert "shard-0.parquet, row 4, column 'old_log_prob'" in err and "2 row(s) of the dump are bad" in err


def test_an_unreadable_part_is_one_line_naming_the_file(
    capsys: pytest.CaptureFixture, ray_local, local_run: Path, tmp_path: Path
) -> None:
    for name in ("shard-0.parquet", "shard-1.parquet"):
        (tmp_path / name).write_bytes((local_run / name).read_bytes())
    data = (local_run / "shard-2.parquet").read_bytes()
    (tmp_path / "shard-2.parquet").write_bytes(data[:4] + b"\0" * 400 + data[404:])  # column chunks destroyed
    code, _, err = run(capsys, "analyze", str(tmp_path), "--ray", "--on-bad-row", "skip")
    assert code == 2 and err.count("\n") == 1 and f"{tmp_path / 'shard-2.parquet'}: cannot be read" in err, err


def test_a_failing_task_is_retried_then_named(ray_local, local_run: Path) -> None:
    """A part that raises something other than an rcdiag error (here: a format no registry knows) is tried
    1 + RAY_RETRIES times by Ray, then the run stops with one line naming the part."""
    part = Part(str(local_run), (("no-such-format", str(local_run / "shard-1.parquet")),), (2, 3))
    with pytest.raises(PartFailedError) as info:
        on_ray([part], Job(rcdiag.CorrectionConfig(), rcdiag.ReadOptions()))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"part 1 of 1 ({local_run / 'shard-1.parquet'} row groups 2-3) failed "
                              f"{RAY_RETRIES + 1} times; the last error: KeyError")  # fmt: skip


def test_without_ray_the_flag_names_the_extra(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, local_run: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as when it is not installed
    code, out, err = run(capsys, "analyze", str(local_run), "--ray")
    assert code == 2 and out == ""
    assert err == "rcdiag: error: --ray needs Ray, which is not installed: pip install 'rcdiag[ray]'\n"


def test_ray_options(capsys: pytest.CaptureFixture, local_run: Path) -> None:
    assert rcdiag.ReadOptions(ray_address="auto").ray
    for kwargs, message in (
        ({"ray": True, "workers": 2}, "use one"),
        (
            {"ray_address": " "},
            r"^ray_address must be a Ray address \(host:port, ray://host:port or auto; empty: an unset variable\?\), got ' '$",
        ),
    ):
        with pytest.raises(rcdiag.ConfigError, match=message):
            rcdiag.ReadOptions(**kwargs)
    code, _, err = run(capsys, "analyze", str(local_run), "--ray", "--device", "torch-cpu")
    assert code == 2 and "ray reads on CPUs" in err
    code, _, err = run(capsys, "compare", str(local_run), str(local_run), "--ray", "--workers", "2")
    assert code == 2 and "use one" in err


def test_compare_and_check_take_ray(capsys: pytest.CaptureFixture, ray_local, local_run: Path, s3_run: str) -> None:
    args = ("compare", str(local_run / "shard-1.parquet"), f"{s3_run}shard-2.parquet", "--on-bad-row", "skip",
            "--format", "json")  # fmt: skip
    one, many = (json.loads(run(capsys, *args, *flag)[1]) for flag in ((), ("--ray",)))
    for a, b in zip(one["metrics"], many["metrics"], strict=True):
        assert a["key"] == b["key"]
        for side in ("a", "b"):  # a metric the dump cannot give (e.g. a correlation of one value) is null in both
            assert (a[side] is None) == (b[side] is None), (a["key"], side)
            if a[side] is not None:
                assert a[side] == pytest.approx(b[side], rel=1e-12, abs=1e-12), (a["key"], side)
    code, out, err = run(capsys, "check", s3_run, "--max", "kl=10", "--on-bad-row", "skip", "--ray", "--no-pyproject")
    assert code == 0 and "PASSED" in out, err


def test_run_facts_from_columns_survive_the_split(ray_local, tmp_path: Path) -> None:
    """A ``temperature`` column read in parts gives the report the same run facts as one process reading it."""
    import pyarrow as pa

    rows = 40
    table = pa.table({
        "old_log_prob": pa.array([[-1.0, -0.5]] * rows, pa.list_(pa.float32())),
        "rollout_log_prob": pa.array([[-1.1, -0.4]] * rows, pa.list_(pa.float32())),
        "temperature": pa.array([0.7] * 30 + [1.0] * 10, pa.float64()),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    one = rcdiag.analyze(tmp_path / "t.parquet")
    assert one.input.metadata["temperature"] == "0.7, 1.0"
    for options in ({"ray": True}, {"workers": 2}):
        assert rcdiag.analyze(tmp_path / "t.parquet", **options).input.metadata == one.input.metadata


def approx_equal(a: object, b: object, path: str = "") -> None:
    """Two JSON values equal, numbers to 1e-12."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for key in a:
            approx_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            approx_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-12, nan_ok=True), path
    else:
        assert a == b, path


def test_explain_with_ray_equals_one_process(capsys: pytest.CaptureFixture, ray_local, local_run: Path,
                                             tmp_path: Path) -> None:  # fmt: skip
    one = analyze_json(capsys, str(local_run), "--explain")
    many = analyze_json(capsys, str(local_run), "--explain", "--ray")
    assert one["worst_sequences"] and one["breakdowns"]
    for key in ("breakdowns", "worst_sequences", "findings"):
        approx_equal(many[key], one[key], key)
    code, _, err = run(capsys, "analyze", str(local_run), "--ray", "--sequences", str(tmp_path / "s.parquet"))
    assert code == 2 and "--sequences" in err and "without --ray" in err and not (tmp_path / "s.parquet").exists()


def sweep_json(capsys: pytest.CaptureFixture, path: str, *flags: str) -> dict:
    code, out, err = run(capsys, "sweep", path, "--is", "token", "--rs", "token_k1,seq_mean_k3", "--on-bad-row",
                         "skip", "--format", "json", "-q", *flags)  # fmt: skip
    assert code == 0, err
    return json.loads(out)


def same_sweep(a: dict, b: dict) -> None:
    assert [(r["option"], r["threshold"]) for r in a["sweep"]] == [(r["option"], r["threshold"]) for r in b["sweep"]]
    for x, y in zip(a["sweep"], b["sweep"], strict=True):
        for key, value in x["metrics"].items():
            assert value == pytest.approx(y["metrics"][key], rel=1e-12, abs=1e-12), (x["option"], key)
    for key in ("rows", "tokens", "valid_tokens", "skipped_rows", "skipped_by_reason"):
        assert a["input"][key] == b["input"][key], key
    assert a["recommendations"] == b["recommendations"]


def test_sweep_takes_urls_and_ray(capsys: pytest.CaptureFixture, ray_local, local_run: Path, s3_run: str) -> None:
    local = sweep_json(capsys, str(local_run))
    assert local["input"]["skipped_rows"] == 2
    same_sweep(sweep_json(capsys, s3_run), local)
    same_sweep(sweep_json(capsys, s3_run, "--ray"), local)
    same_sweep(sweep_json(capsys, str(local_run), "--ray"), local)
    states = [f"s3://dumps/sweep-states/s{k}.json" for k in range(3)]
    for k, state in enumerate(states):
        sweep_json(capsys, f"{s3_run}shard-{k}.parquet", "--save-state", state)
    code, out, err = run(capsys, "merge", "s3://dumps/sweep-states/", "--format", "json")
    assert code == 0, err
    merged = json.loads(out)
    for x, y in zip(merged["sweep"], local["sweep"], strict=True):
        for key, value in x["metrics"].items():
            assert value == pytest.approx(y["metrics"][key], rel=1e-12, abs=1e-12), (x["option"], key)


def test_ray_keeps_the_slices_of_one_process(ray_local) -> None:
    """The slices section's per-response numbers travel with each task's state: ``--by``'s table and the replica
    the verdict names are those of one process (tests/realmodel's replica defect, one task per file)."""
    from shape_dumps import defect_dump

    for name, by in (("replica_column", ("replica",)), ("replica", ())):
        path = defect_dump(name, 1)
        one = rcdiag.analyze(path, columns=rcdiag.ColumnMap(by=by))
        tasks = rcdiag.analyze(path, columns=rcdiag.ColumnMap(by=by), ray=True)
        assert one.to_dict().get("breakdowns") == tasks.to_dict().get("breakdowns")
        assert [c.evidence for c in tasks.verdict.causes] == [c.evidence for c in one.verdict.causes]  # type: ignore[union-attr]
        assert tasks.verdict.causes[0].cls == "replica"  # type: ignore[union-attr]
