"""Dumps in object storage, against a real S3 API server (moto's server mode on 127.0.0.1, see conftest): a prefix,
a glob or one object reads exactly as the local files; every format streams from S3; state files go to S3 and merge
from there; a missing bucket, key or prefix is exit 2 with one line naming the URL, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
from conftest import BUCKET, SAMPLES, random_batch, run, shard_columns
from shard_reports import FLAGS, analyze_json, close, same_report

import rcdiag
from rcdiag.io.storage import filesystem


def test_a_prefix_a_glob_and_an_object_read_as_the_local_files(
    capsys: pytest.CaptureFixture, local_run: Path, s3_run: str
) -> None:
    local = analyze_json(capsys, str(local_run))
    assert local["input"]["skipped_rows"] == 2 and local["input"]["files"] == 3  # the bad rows are there to count
    remote = analyze_json(capsys, s3_run)
    same_report(remote, local)
    assert remote["input"]["path"] == s3_run
    for path in (f"{s3_run}shard-*.parquet", f"s3://{BUCKET}/**/shard-[0-2].parquet", s3_run.rstrip("/")):
        same_report(analyze_json(capsys, path), local)
    one = analyze_json(capsys, f"{s3_run}shard-1.parquet")
    same_report(one, analyze_json(capsys, str(local_run / "shard-1.parquet")))
    # a small chunk size reads many ranges of the objects and changes nothing
    same_report(analyze_json(capsys, s3_run, "--chunk-tokens", "50"), local)


def test_every_format_streams_from_s3(s3_server, s3_run: str, tmp_path: Path) -> None:
    """Arrow IPC (file and stream), JSONL and .npz objects give the metrics of the same rows on disk."""
    columns = shard_columns()[1]
    del columns["step"]
    table = pa.table(
        {
            "old_log_prob": pa.array(columns["old_log_prob"], pa.list_(pa.float32())),
            "rollout_log_prob": pa.array(columns["rollout_log_prob"], pa.list_(pa.float32())),
            "response_mask": pa.array(columns["response_mask"], pa.list_(pa.int8())),
        }
    )
    feather.write_feather(table, tmp_path / "x.arrow", compression="uncompressed")
    with pa.OSFile(str(tmp_path / "x.arrows"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    old, rollout, mask = random_batch(np.random.default_rng(5), rows=10, width=12)
    np.savez(tmp_path / "step_4.npz", old_log_probs=old, rollout_log_probs=rollout, response_mask=mask)
    config = rcdiag.CorrectionConfig(rollout_is="token")
    for name in ("x.arrow", "x.arrows", "x.jsonl", "step_4.npz"):
        s3_server.upload_file(str(tmp_path / name), BUCKET, f"formats/{name}")
        local = rcdiag.analyze(tmp_path / name, config, on_bad_row="skip")
        remote = rcdiag.analyze(f"s3://{BUCKET}/formats/{name}", config, on_bad_row="skip")
        close(remote.metrics, local.metrics)
        assert (remote.input.rows, remote.input.skipped_rows) == (local.input.rows, local.input.skipped_rows), name
    assert remote.steps[0].step == 4  # the step in an object's name is read as in a file's


def test_missing_key_prefix_or_bucket_is_one_line_and_writes_nothing(
    capsys: pytest.CaptureFixture, s3_run: str, tmp_path: Path
) -> None:
    out, state = tmp_path / "report.json", tmp_path / "state.json"
    cases = (
        (f"{s3_run}shard-9.parquet", f"rcdiag: error: {s3_run}shard-9.parquet: not found"),
        (f"s3://{BUCKET}/no-such-run/", f"rcdiag: error: s3://{BUCKET}/no-such-run/: not found"),
        ("s3://no-such-bucket/run1/", "rcdiag: error: s3://no-such-bucket/run1/: bucket 'no-such-bucket' does not "
                                      "exist"),
        (f"{s3_run}*.arrow", f"rcdiag: error: {s3_run}*.arrow: matches no file"),
    )  # fmt: skip
    for url, expected in cases:
        code, stdout, err = run(capsys, "analyze", url, "-o", str(out), "--save-state", str(state))
        assert code == 2 and err.startswith(expected) and err.count("\n") == 1, err
        assert stdout == "" and not out.exists() and not state.exists()


def test_compare_check_and_merge_take_urls(
    capsys: pytest.CaptureFixture, local_run: Path, s3_run: str, tmp_path: Path
) -> None:
    code, out, err = run(capsys, "compare", f"{s3_run}shard-0.parquet", str(local_run / "shard-0.parquet"),
                         "--on-bad-row", "skip", "--format", "json")  # fmt: skip
    assert code == 0, err
    assert all(d["a"] == d["b"] for d in json.loads(out)["metrics"])
    code, _, err = run(capsys, "check", s3_run, "--max", "kl=10", "--baseline", f"{s3_run}shard-2.parquet",
                       "--max-increase", "kl=1000%", "--on-bad-row", "skip", "--no-pyproject")  # fmt: skip
    assert code == 0, err
    # states written to S3 by each shard's job, merged from S3: the report of one run over the prefix
    states = []
    for k in range(3):
        state = f"s3://{BUCKET}/states/s{k}.json"
        assert run(capsys, "analyze", f"{s3_run}shard-{k}.parquet", *FLAGS, "--save-state", state, "-q")[0] == 0
        states.append(state)
    local = analyze_json(capsys, str(local_run))
    for given in (states, [f"s3://{BUCKET}/states/s*.json"], [f"s3://{BUCKET}/states/"]):  # a URL glob is ours to expand
        code, out, err = run(capsys, "merge", *given, "--format", "json")
        assert code == 0, err
        same_report(json.loads(out), local)
    code, _, err = run(capsys, "merge", states[0], f"s3://{BUCKET}/states/missing.json")
    assert code == 2 and f"s3://{BUCKET}/states/missing.json: not found" in err and err.count("\n") == 1


def test_file_urls_are_local_paths(capsys: pytest.CaptureFixture, local_run: Path) -> None:
    same_report(analyze_json(capsys, f"file://{local_run}/"), analyze_json(capsys, str(local_run)))
    same_report(analyze_json(capsys, f"file://{local_run}/shard-*.parquet"), analyze_json(capsys, str(local_run)))
    code, _, err = run(capsys, "analyze", "file://elsewhere/x.parquet")
    assert code == 2 and "a file:// URL reads the local disk only" in err


def test_a_scheme_pyarrow_lacks_goes_through_fsspec(capsys: pytest.CaptureFixture) -> None:
    fsspec = pytest.importorskip("fsspec")  # installed with torch; the fallback is optional
    memory = fsspec.filesystem("memory")
    memory.pipe("/samples/healthy.parquet", (SAMPLES / "healthy.parquet").read_bytes())
    local = analyze_json(capsys, str(SAMPLES / "healthy.parquet"))
    same_report(analyze_json(capsys, "memory://samples/healthy.parquet"), local)
    code, _, err = run(capsys, "analyze", "nosuchscheme://x/y.parquet")
    assert code == 2 and "nosuchscheme://x/y.parquet: uses 'nosuchscheme://'" in err and err.count("\n") == 1


def test_a_refused_permission_is_one_line(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that checks credentials (moto with authentication on) refuses the test keys."""
    from conftest import free_port, moto_server

    port = free_port()
    with moto_server(port, INITIAL_NO_AUTH_ACTION_COUNT="2") as client:  # two unchecked calls to set it up
        client.create_bucket(Bucket="locked")
        client.put_object(Bucket="locked", Key="run/a.parquet", Body=(SAMPLES / "healthy.parquet").read_bytes())
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        try:
            for url in ("s3://locked/run/a.parquet", "s3://locked/run/"):
                code, out, err = run(capsys, "analyze", url)
                assert code == 2 and out == "" and err.count("\n") == 1
                assert err.startswith(f"rcdiag: error: {url}: access denied; check the credentials"), err
        finally:
            filesystem.cache_clear()  # the bucket's filesystem points at this server
