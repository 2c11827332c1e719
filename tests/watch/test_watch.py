"""``rcdiag watch`` end to end, in real processes: a writer process producing steps while the watch follows them,
a kill and a restart, a slow writer's half-written file, a planted regime change with its alerts (a command on
stdin, a webhook on 127.0.0.1 that fails once), ``--exit-on`` and Ctrl-C."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from rcdiag.watch import Watch

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
POLL = "0.05"

STEPS_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from rcdiag.io import synthetic
    from rcdiag.io.dump_writer import DumpWriter

    PLANTED_FROM = 6
    def step_table(step, planted):
        noise = 0.02
        if planted and step >= PLANTED_FROM:
            noise = 0.02 * np.sqrt(1 + 0.5 * (step - PLANTED_FROM + 1))  # k3_kl grows linearly from here
        scenario = synthetic.with_overrides("healthy", noise=noise)
        table = synthetic.generate(scenario, rows=32, steps=1, seed=100 + step, median_length=60, max_length=200,
                                   empty_rows=0)
        import pyarrow as pa
        return table.set_column(3, "step", pa.array(np.full(table.num_rows, step, dtype=np.int64)))

    def rows(table, name, dtype):
        return [np.asarray(v, dtype=dtype) for v in table.column(name).to_pylist()]

    if __name__ == "__main__":
        directory, first, count, delay, planted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
        writer = DumpWriter(directory, metadata={"temperature": 1.0})
        for step in range(first, first + count):
            table = step_table(step, planted)
            writer.write(step=step, old_log_prob=rows(table, "old_log_prob", np.float32),
                         rollout_log_prob=rows(table, "rollout_log_prob", np.float32),
                         response_mask=rows(table, "response_mask", np.int8))
            time.sleep(delay)
    """
)

SLOW_SCRIPT = textwrap.dedent(
    """
    import io, sys, time
    import pyarrow.parquet as pq
    sys.path.insert(0, sys.argv[3])
    from steps import step_table
    import pyarrow as pa
    table = pa.concat_tables([step_table(1, False), step_table(2, False)])
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    data = buffer.getvalue()
    with open(sys.argv[1], "wb") as handle:  # the final name from the first byte: no rename
        for k in range(6):
            handle.write(data[k * len(data) // 6 : (k + 1) * len(data) // 6])
            handle.flush()
            time.sleep(float(sys.argv[2]))
    """
)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scripts")
    (folder / "steps.py").write_text(STEPS_SCRIPT)
    (folder / "slow.py").write_text(SLOW_SCRIPT)
    return folder


def write_steps(scripts: Path, directory: Path, first: int, count: int, delay: float, planted: bool = False) -> list:
    return [sys.executable, str(scripts / "steps.py"), str(directory), str(first), str(count), str(delay),
            "1" if planted else "0"]  # fmt: skip


def rcdiag(*args: str) -> list[str]:
    return [sys.executable, "-m", "rcdiag", *args]


def watch(directory: Path, state: Path, *args: str, **popen: Any) -> subprocess.Popen:
    command = rcdiag("watch", str(directory), "--state", str(state), "--format", "json", "--poll", POLL, *args)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, **popen)


def analyze_steps(directory: Path) -> dict[int, dict[str, Any]]:
    done = subprocess.run(
        rcdiag("analyze", str(directory), "--format", "json"), capture_output=True, text=True, env=ENV
    )
    assert done.returncode == 0, done.stderr
    return {s["step"]: s for s in json.loads(done.stdout)["steps"]}


def parsed(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The step lines and the report lines of a watch's JSON output (complete lines only)."""
    lines = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
    assert {line["kind"] for line in lines} <= {"step", "report"}
    return [line for line in lines if line["kind"] == "step"], [line for line in lines if line["kind"] == "report"]


def next_step(stream: Any) -> dict[str, Any]:
    """The next step line a running watch writes (report lines skipped)."""
    while (line := json.loads(stream.readline()))["kind"] != "step":
        pass
    return line


def same_numbers(line: dict[str, Any], step: dict[str, Any]) -> None:
    assert (line["rows"], line["valid_tokens"]) == (step["rows"], step["valid_tokens"])
    assert line["metrics"] == step["metrics"]  # number for number: both JSON texts of the same float64s
    assert line["extras"] == step["extras"]


def test_a_live_writer_every_step_once_in_order_with_analyze_numbers(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = tmp_path / "watch.json"
    follower = watch(run, state, "--max-idle", "5")
    writer = subprocess.run(write_steps(scripts, run, 0, 8, 0.25), env=ENV, capture_output=True, text=True)
    assert writer.returncode == 0, writer.stderr
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    lines, reports = parsed(out)
    assert [line["step"] for line in lines] == list(range(8))
    assert not any(line["revised"] for line in lines)
    assert reports[-1]["step"] == 7 and reports[-1]["files"] == 8 and reports[-1]["steps"] == 8
    assert reports[-1]["verdict"]["status"] == "healthy"
    assert [line["files"] for line in lines] == list(range(1, 9))
    expected = analyze_steps(run)
    for line in lines:
        same_numbers(line, expected[line["step"]])
    saved = json.loads(state.read_text())
    assert saved["format"] == "rcdiag-state"
    from rcdiag.engine.state_files import encode_state, load_state
    from rcdiag.sections.registry import KNOWN

    assert saved["state"] == encode_state(load_state(state, KNOWN)[0].state_dict())  # the per-step cache, written whole
    assert sorted(item["name"] for item in saved["watch"]["consumed"]) == sorted(p.name for p in run.iterdir())
    again = subprocess.run(rcdiag("watch", str(run), "--state", str(state), "--format", "json", "--once"),
                           capture_output=True, text=True, env=ENV)  # fmt: skip
    assert (again.returncode, again.stdout) == (0, "")  # resumed: nothing read twice


def test_sigkill_and_restart_loses_and_repeats_nothing(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = tmp_path / "watch.json"
    writer = subprocess.Popen(write_steps(scripts, run, 0, 10, 0.2), env=ENV)
    first = watch(run, state)
    assert first.stdout is not None
    seen = [next_step(first.stdout) for _ in range(3)]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    rest = first.stdout.read()  # what it wrote before the kill, still in the pipe
    seen += parsed(rest)[0]
    assert writer.wait(timeout=120) == 0
    second = watch(run, state, "--once")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    seen += parsed(out)[0]
    steps = [line["step"] for line in seen]
    assert sorted(steps) == list(range(10)) and len(set(steps)) == 10, steps
    expected = analyze_steps(run)
    for line in seen:
        same_numbers(line, expected[line["step"]])
    merged = subprocess.run(rcdiag("merge", str(state), "--format", "json"), capture_output=True, text=True, env=ENV)
    assert merged.returncode == 0, merged.stderr
    assert {s["step"]: s["metrics"] for s in json.loads(merged.stdout)["steps"]} == {
        k: v["metrics"] for k, v in expected.items()
    }  # the state counted every file once


def test_a_slow_writers_half_written_file_is_never_read(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = tmp_path / "watch.json"
    started = subprocess.run(write_steps(scripts, run, 0, 1, 0.0), env=ENV)
    assert started.returncode == 0
    follower = watch(run, state, "--settle", "0.8", "--max-idle", "6")
    assert follower.stdout is not None
    assert next_step(follower.stdout)["step"] == 0  # the watch is polling now
    slow = subprocess.run([sys.executable, str(scripts / "slow.py"), str(run / "slow.parquet"), "0.25", str(scripts)],
                          env=ENV, capture_output=True, text=True)  # fmt: skip
    assert slow.returncode == 0, slow.stderr
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err  # a half-written Parquet file would have been exit 2
    lines = parsed(out)[0]
    assert [line["step"] for line in lines] == [1, 2]
    assert {line["file"] for line in lines} == {"slow.parquet"}
    expected = analyze_steps(run)
    for line in lines:
        same_numbers(line, expected[line["step"]])


class Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]
    answers: list[int]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        code = self.answers.pop(0) if self.answers else 200
        self.received.append({"code": code, "type": self.headers["Content-Type"], "alert": json.loads(body)})
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, type[Hook]]]:
    """An HTTP server on 127.0.0.1 that answers 500 to the first POST and 200 after."""
    handler = type("RecordingHook", (Hook,), {"received": [], "answers": [500]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()
    server.server_close()


LIMIT = 1e-3


@pytest.fixture(scope="module")
def planted(scripts: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """20 steps: flat to step 5, then k3_kl growing linearly; and the first step analyze finds above ``LIMIT``."""
    run = tmp_path_factory.mktemp("planted") / "run"
    assert subprocess.run(write_steps(scripts, run, 0, 20, 0.0, planted=True), env=ENV).returncode == 0
    values = {step: s["metrics"]["rollout_corr/k3_kl"] for step, s in analyze_steps(run).items()}
    crossing = min(step for step, value in values.items() if value > LIMIT)
    assert 10 < crossing < 20, values
    return run, crossing


def test_a_planted_regime_change_alerts_at_its_step_forecasts_it_and_reaches_command_and_webhook(
    planted: tuple[Path, int], tmp_path: Path, webhook: tuple[str, type[Hook]]
) -> None:
    run, crossing = planted
    url, hook = webhook
    received = tmp_path / "alerts.jsonl"
    follower = watch(run, tmp_path / "watch.json", "--once", "--max", f"k3_kl={LIMIT}", "--fail-on", "error",
                     "--on-alert", f"cat >> '{received}'", "--webhook", url)  # fmt: skip
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    lines, reports = parsed(out)
    assert [line["step"] for line in lines] == list(range(20))
    assert reports and reports[-1]["step"] == 19
    alerts = [alert for line in lines + reports for alert in line["alerts"]]
    rule = [a for a in alerts if a["kind"] == "rule"]
    assert [(a["step"], a["severity"], a["metric"]) for a in rule] == [(crossing, "error", "rollout_corr/k3_kl")]
    forecast = [a for a in alerts if a["kind"] == "forecast"]
    assert len(forecast) == 1 and forecast[0]["step"] < crossing, forecast  # before the crossing
    said = forecast[0]["message"]
    assert said.startswith(f"at the current rate, k3_kl crosses {LIMIT:g} between steps "), said
    assert forecast[0]["step"] < forecast[0]["detail"]["earliest"] <= forecast[0]["detail"]["latest"]
    assert all(line["forecasts"] for line in lines if forecast[0]["step"] <= line["step"] < crossing)
    recent = [line["forecasts"][0] for line in lines[crossing - 5 : crossing]]  # each step's forecast, refitted
    # k3_kl climbs linearly here; the log scale's line (rcdiag.core.forecast) bends up, so it is early, never late
    assert all(crossing - 4 <= f["expected"] <= crossing + 1 for f in recent), recent
    assert any(f["earliest"] <= crossing <= f["latest"] for f in recent), recent
    assert not lines[crossing]["forecasts"]  # crossed: the rule says so
    piped = [json.loads(line) for line in received.read_text().splitlines()]
    assert sorted(a["key"] for a in piped) == sorted(a["key"] for a in alerts)  # each new alert once, on stdin
    assert all(a["watch"] == str(run) and a["verdict"]["status"] and a["rcdiag_version"] for a in piped)
    posted = hook.received
    assert [p["code"] for p in posted] == [500] + [200] * len(alerts)  # the first retried after the 500
    assert posted[0]["alert"] == posted[1]["alert"] == piped[0]
    assert {p["type"] for p in posted} == {"application/json"}


def test_exit_on_error_stops_at_the_failing_step_with_exit_1(planted: tuple[Path, int], tmp_path: Path) -> None:
    run, crossing = planted
    state = tmp_path / "watch.json"
    follower = watch(run, state, "--once", "--max", f"k3_kl={LIMIT}", "--exit-on", "error")
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 1, err
    steps = [line["step"] for line in parsed(out)[0]]
    assert steps == list(range(crossing + 1))
    assert len(json.loads(state.read_text())["watch"]["consumed"]) == crossing + 1  # saved through that step


def test_on_alert_failure_is_reported_not_fatal(planted: tuple[Path, int], tmp_path: Path) -> None:
    run, _ = planted
    follower = watch(run, tmp_path / "watch.json", "--once", "--max", f"k3_kl={LIMIT}", "--on-alert", "exit 7")
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert len(parsed(out)[0]) == 20
    assert f"rcdiag: alert rule:rollout_corr/k3_kl <= {LIMIT:g} (every step): on-alert failed: 'exit 7' exited 7" in err


def test_ctrl_c_exits_130_with_the_state_saved(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = tmp_path / "watch.json"
    assert subprocess.run(write_steps(scripts, run, 0, 2, 0.0), env=ENV).returncode == 0
    follower = watch(run, state)
    assert follower.stdout is not None
    assert [next_step(follower.stdout)["step"] for _ in range(2)] == [0, 1]
    time.sleep(0.3)
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=30)
    assert (follower.returncode, parsed(out)[0], err) == (130, [], "rcdiag: aborted\n")  # (the report line may follow)
    assert len(Watch(str(run), state_path=state).consumed) == 2  # the state file and its log


def test_a_state_inside_the_watched_directory_or_of_another_watch_is_refused(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert subprocess.run(write_steps(scripts, run, 0, 1, 0.0), env=ENV).returncode == 0
    inside = subprocess.run(rcdiag("watch", str(run), "--state", str(run / "s.json"), "--once"),
                            capture_output=True, text=True, env=ENV)  # fmt: skip
    assert inside.returncode == 2
    assert inside.stderr == (
        f"rcdiag: error: --state {run / 's.json'} is inside the input directory {run}; rcdiag never writes over an "
        "input: give another file name.\n"
    )
    other = tmp_path / "other"
    other.mkdir()
    state = tmp_path / "watch.json"
    assert subprocess.run(rcdiag("watch", str(run), "--state", str(state), "--once"), env=ENV).returncode == 0
    wrong = subprocess.run(rcdiag("watch", str(other), "--state", str(state), "--once"),
                           capture_output=True, text=True, env=ENV)  # fmt: skip
    assert wrong.returncode == 2
    assert wrong.stderr == (
        f"rcdiag: error: {state}: is the state of a watch of {run}, not of {other}: give another --state file\n"
    )


def test_the_default_state_sits_beside_the_directory(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert subprocess.run(write_steps(scripts, run, 0, 1, 0.0), env=ENV).returncode == 0
    done = subprocess.run(rcdiag("watch", str(run), "--once"), capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("step 0: 32 rows, ")
    assert (tmp_path / ".rcdiag-watch" / "run.json").is_file()


def test_an_object_store_prefix_is_followed(scripts: Path, tmp_path: Path, s3_server: Any) -> None:
    local = tmp_path / "run"
    assert subprocess.run(write_steps(scripts, local, 0, 3, 0.0), env=ENV).returncode == 0
    s3_server.create_bucket(Bucket="watched")
    parts = sorted(local.iterdir())
    for part in parts[:2]:
        s3_server.upload_file(str(part), "watched", f"run/{part.name}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # with the S3 server's variables
    state = tmp_path / "watch.json"
    command = rcdiag("watch", "s3://watched/run/", "--state", str(state), "--format", "json", "--once")
    first = subprocess.run(command, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    s3_server.upload_file(str(parts[2]), "watched", f"run/{parts[2].name}")
    second = subprocess.run(command, capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stderr
    steps = parsed(first.stdout)[0] + parsed(second.stdout)[0]
    assert [line["step"] for line in steps] == [0, 1, 2]
    assert [line["file"] for line in steps] == [part.name for part in parts]
    expected = analyze_steps(local)
    for line in steps:
        same_numbers(line, expected[line["step"]])


def test_a_second_part_of_a_step_revises_it_to_analyzes_numbers(scripts: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = tmp_path / "watch.json"
    once = rcdiag("watch", str(run), "--state", str(state), "--format", "json", "--once")
    assert subprocess.run(write_steps(scripts, run, 0, 2, 0.0), env=ENV).returncode == 0
    first = subprocess.run(once, capture_output=True, text=True, env=ENV)
    assert subprocess.run(write_steps(scripts, run, 1, 1, 0.0), env=ENV).returncode == 0  # step 1's second part
    second = subprocess.run(once, capture_output=True, text=True, env=ENV)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    lines = parsed(second.stdout)[0]
    assert [(line["step"], line["revised"], line["file"]) for line in lines] == [
        (1, True, "step-000000001-0001.parquet")
    ]
    assert lines[0]["rows"] == 64
    same_numbers(lines[0], analyze_steps(run)[1])


def test_a_file_that_cannot_be_read_stops_the_watch_with_one_line_and_keeps_the_state(
    scripts: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    state = tmp_path / "watch.json"
    assert subprocess.run(write_steps(scripts, run, 0, 1, 0.0), env=ENV).returncode == 0
    (run / "zz-broken.parquet").write_bytes(b"PAR1 not really a parquet file")
    done = subprocess.run(rcdiag("watch", str(run), "--state", str(state), "--format", "json", "--settle", "0",
                                 "--once"), capture_output=True, text=True, env=ENV)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"rcdiag: error: {run / 'zz-broken.parquet'}") and done.stderr.count("\n") == 1
    assert [line["step"] for line in parsed(done.stdout)[0]] == [0]
    assert [item["name"] for item in json.loads(state.read_text())["watch"]["consumed"]] == [
        "step-000000000-0000.parquet"
    ]


def reported_steps(run: Path, state: Path) -> list[int]:
    """The steps a ``--once`` restart reports (the files the state does not hold)."""
    done = subprocess.run(rcdiag("watch", str(run), "--state", str(state), "--format", "json", "--once"),
                          capture_output=True, text=True, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line["step"] for line in parsed(done.stdout)[0]]


def merged_metrics(state: Path) -> dict[int, Any]:
    done = subprocess.run(rcdiag("merge", str(state), "--format", "json"), capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    return {s["step"]: s["metrics"] for s in json.loads(done.stdout)["steps"]}


def test_each_commit_appends_one_log_line_and_the_end_folds_it_in(scripts: Path, tmp_path: Path) -> None:
    run, state = tmp_path / "run", tmp_path / "watch.json"
    log = state.with_name("watch.json.log")
    assert subprocess.run(write_steps(scripts, run, 0, 4, 0.0), env=ENV).returncode == 0
    session = Watch(str(run), state_path=state, settle=0.0)
    assert session.poll_once()[0] == 4
    first = json.loads(state.read_text())
    assert first["watch"]["consumed"][0]["name"] == "step-000000000-0000.parquet"  # the first commit: whole
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["file"]["name"] for line in lines if "file" in line] == [
        f"step-00000000{k}-0000.parquet" for k in (1, 2, 3)
    ]
    assert {line["generation"] for line in lines} == {first["watch"]["generation"]}
    assert len(Watch(str(run), state_path=state).consumed) == 4  # state file + log
    session.close()
    assert log.read_bytes() == b"" and len(json.loads(state.read_text())["watch"]["consumed"]) == 4
    assert merged_metrics(state) == {k: v["metrics"] for k, v in analyze_steps(run).items()}


def test_a_kill_mid_append_drops_the_cut_line_and_reads_its_file_again(scripts: Path, tmp_path: Path) -> None:
    run, state = tmp_path / "run", tmp_path / "watch.json"
    log = state.with_name("watch.json.log")
    assert subprocess.run(write_steps(scripts, run, 0, 5, 0.0), env=ENV).returncode == 0
    Watch(str(run), state_path=state, settle=0.0).poll_once()  # no close: steps 1-4 are on the log
    data = log.read_bytes()
    log.write_bytes(data[: data.rindex(b'"batches"')])  # step 4's line cut where a SIGKILL would cut it
    assert reported_steps(run, state) == [4]  # read again, once; nothing else repeated
    assert merged_metrics(state) == {k: v["metrics"] for k, v in analyze_steps(run).items()}


def test_a_kill_between_compactions_two_writes_counts_nothing_twice(
    scripts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rcdiag.watch.session as session_module

    run, state = tmp_path / "run", tmp_path / "watch.json"
    log = state.with_name("watch.json.log")
    assert subprocess.run(write_steps(scripts, run, 0, 6, 0.0), env=ENV).returncode == 0
    monkeypatch.setattr(session_module, "COMPACT_BYTES", 0)
    session = Watch(str(run), state_path=state, settle=0.0)
    stale = b""
    compact = session.compact

    def keep_the_log() -> None:  # the log as a kill after the state file's write would leave it
        nonlocal stale
        stale = log.read_bytes() if log.exists() else b""
        compact()

    session.compact = keep_the_log  # type: ignore[method-assign]
    session.poll_once()
    assert stale  # the log outgrew the state file at least once
    log.write_bytes(stale + log.read_bytes())  # the stale lines (an older generation) before the current ones
    again = Watch(str(run), state_path=state)
    assert len(again.consumed) == 6 and again.state.rows == 6 * 32
    assert reported_steps(run, state) == []
    assert merged_metrics(state) == {k: v["metrics"] for k, v in analyze_steps(run).items()}


def test_a_state_of_the_earlier_format_without_a_log_is_read(scripts: Path, tmp_path: Path) -> None:
    run, state = tmp_path / "run", tmp_path / "watch.json"
    assert subprocess.run(write_steps(scripts, run, 0, 3, 0.0), env=ENV).returncode == 0
    assert reported_steps(run, state) == [0, 1, 2]
    saved = json.loads(state.read_text())
    del saved["watch"]["generation"]  # as rcdiag wrote it before the log: the whole state after every file
    state.write_text(json.dumps(saved))
    assert subprocess.run(write_steps(scripts, run, 3, 2, 0.0), env=ENV).returncode == 0
    assert reported_steps(run, state) == [3, 4]
    assert merged_metrics(state) == {k: v["metrics"] for k, v in analyze_steps(run).items()}


def test_a_damaged_log_line_is_one_error_naming_the_log_and_line(scripts: Path, tmp_path: Path) -> None:
    run, state = tmp_path / "run", tmp_path / "watch.json"
    log = state.with_name("watch.json.log")
    assert subprocess.run(write_steps(scripts, run, 0, 3, 0.0), env=ENV).returncode == 0
    Watch(str(run), state_path=state, settle=0.0).poll_once()
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join([lines[0][:40] + "\n", *lines[1:]]))
    done = subprocess.run(rcdiag("watch", str(run), "--state", str(state), "--once"), capture_output=True,
                          text=True, env=ENV)  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr.startswith(f"rcdiag: error: {log}: line 1 is damaged (JSONDecodeError")
        and done.stderr.count("\n") == 1
    )


@pytest.mark.parametrize("sample", ["outliers.parquet", "topk_offset.parquet", "train_forgot_temperature.parquet"])
def test_kept_hits_give_a_full_evaluations_findings_at_every_step(sample: str) -> None:
    from rcdiag.api import accumulate
    from rcdiag.diagnosis.health import CONTEXT_RULES, Context, could_fire_in_context, evaluate
    from rcdiag.settings.correction import CorrectionConfig
    from rcdiag.watch.session import KeptHits

    got = accumulate(str(ROOT / "sample_data" / sample), CorrectionConfig())
    results = [(step, got.state.batches[step].compute()) for step in sorted(got.state.batches)]  # type: ignore[type-var]
    kept = KeptHits()
    for n in range(1, len(results) + 1):  # the steps as they arrive: the context (steps tested) grows
        full = evaluate(results[:n], got.state.resolved)
        assert evaluate(results[:n], got.state.resolved, step_hits=kept) == full
    assert {f.code for f in full} & {"kl_k3_disagree", "kl_high", "sparse_outliers"}  # hits, kept and recomputed
    for tests in (1, 2, 10, 1000, 10**6):  # a batch said not to fire fires neither context rule
        for _, result in results:
            if not could_fire_in_context(result, tests):
                assert all(rule(result, Context(batches=tests)) == [] for rule in CONTEXT_RULES)
