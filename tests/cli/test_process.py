"""The process itself, through real subprocesses: a closed stdout never changes the exit code and never stops a
file from being written; Ctrl-C and SIGTERM end every command with ``rcdiag: aborted`` (130, 143), no partial
output file and no worker process left (docs/exit-codes.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from child_process import ENV, SLOW, has_open
from conftest import SAMPLES, require

HEALTHY = str(SAMPLES / "healthy.parquet")
def rcdiag(*args: str, cwd: Path, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rcdiag", *args], cwd=cwd, env=ENV, stdout=stdout, stderr=subprocess.PIPE, text=True
    )


def closed_pipe() -> int:
    """The write end of a pipe whose reader has gone (``| head -1`` once head has exited)."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_a_failing_gate_fails_with_a_closed_stdout_and_writes_its_files(tmp_path: Path) -> None:
    write = closed_pipe()
    try:
        done = rcdiag(
            "check", HEALTHY, "--max", "kl=1e-9", "--junit", "r.xml", "--markdown", "r.md", cwd=tmp_path, stdout=write
        )
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert "<testsuite" in (tmp_path / "r.xml").read_text() and "kl" in (tmp_path / "r.md").read_text()


def test_a_failing_gate_fails_under_pipefail_with_head() -> None:
    shell = f"set -o pipefail; {sys.executable} -m rcdiag check {HEALTHY} --max kl=1e-9 --format json | head -c 1"
    done = subprocess.run(["bash", "-c", shell], env=ENV, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "{" and done.stderr == ""


@pytest.mark.parametrize("output_format", ["table", "json"])
def test_analyze_with_a_closed_stdout_exits_0_and_writes_every_file(tmp_path: Path, output_format: str) -> None:
    write = closed_pipe()
    files = ("--html", "r.html", "--png", "d.png", "--save-state", "s.json", "--sequences", "q.parquet")
    try:
        done = rcdiag("analyze", HEALTHY, "--format", output_format, *files, cwd=tmp_path, stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"rcdiag: wrote r.html ({(tmp_path / 'r.html').stat().st_size:,} bytes)",
        f"rcdiag: wrote d.png ({(tmp_path / 'd.png').stat().st_size:,} bytes)",
    ]
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "d.png").read_bytes().startswith(b"\x89PNG")
    assert pq.read_metadata(tmp_path / "q.parquet").num_rows == 384
    assert '"rcdiag-state"' in (tmp_path / "s.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "q.parquet", "r.html", "s.json"]


def test_a_full_stdout_is_a_write_error(tmp_path: Path) -> None:
    for args in (("analyze", HEALTHY), ("analyze", HEALTHY, "--format", "json"), ("presets",), ("--help",),
                 ("analyze", "--help")):  # fmt: skip
        with open("/dev/full", "w") as full:
            done = rcdiag(*args, cwd=tmp_path, stdout=full.fileno())
        assert (done.returncode, done.stderr) == (2, "rcdiag: error: cannot write stdout: No space left on device\n")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def interrupt(
    args: list[str], cwd: Path, dump: Path, signum: int
) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    """Start ``rcdiag ARGS``, wait until it is reading ``dump`` (its file is open) and a little more, send
    ``signum``; the finished process and the child processes it had."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rcdiag", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while not has_open(process.pid, dump) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    assert process.poll() is None, "the run ended before it could be interrupted"
    children = _children(process.pid)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, out.decode(), err.decode()), children


SIGNAL_CASES = {
    "analyze": [
        "analyze",
        "{dump}",
        "--explain",
        "--sequences",
        "seq.parquet",
        "--save-state",
        "s.json",
        "-o",
        "r.txt",
    ],
    "analyze --workers 2": ["analyze", "{dump}", "--workers", "2", "--sequences", "seq.parquet", "-o", "r.txt"],
    "sweep": ["sweep", "{dump}", "--save-state", "s.json", "-o", "r.txt"],
    "compare": ["compare", "{dump}", "{dump}", "-o", "r.txt"],
    "check": ["check", "{dump}", "--max", "kl=1", "--junit", "r.xml", "-o", "r.txt"],
    "analyze --ray": ["analyze", "{dump}", "--ray", "-o", "r.txt"],
}


@pytest.mark.parametrize(
    ("case", "signum", "code"),
    [(case, signal.SIGINT, 130) for case in SIGNAL_CASES]
    + [(case, signal.SIGTERM, 143) for case in ("analyze", "analyze --workers 2")],
)
def test_a_signal_mid_run_aborts_cleanly(tmp_path: Path, big_dump: Path, case: str, signum: int, code: int) -> None:
    """Linux: the test watches the process through /proc (its open files, its children)."""
    if "--ray" in case:
        require("ray", "ray")  # a local Ray instance of the subprocess's own, stopped with it
    args = [str(big_dump) if a == "{dump}" else a for a in SIGNAL_CASES[case]] + list(SLOW)
    (tmp_path / "r.txt").write_text("the previous report\n")
    done, children = interrupt(args, tmp_path, big_dump, signum)
    assert (done.returncode, done.stdout, done.stderr) == (code, "", "rcdiag: aborted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.txt"]  # no partial file, no temporary
    assert (tmp_path / "r.txt").read_text() == "the previous report\n"
    deadline = time.monotonic() + 10
    while any(_alive(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [child for child in children if _alive(child)], "a worker process outlived the run"
    if case == "analyze --workers 2":
        assert len(children) >= 2  # the workers were running when the signal came


def test_an_exception_a_signal_turned_into_is_an_abort(tmp_path: Path) -> None:
    """A Ctrl-C while a nogil numba kernel runs surfaces as numba's SystemError; the recorded signal decides."""
    code = (
        "import signal, rcdiag.api, rcdiag.runtime.interrupts as i\n"
        "def analyze(*a, **k):\n"
        "    i._received = signal.SIGINT\n"
        "    raise SystemError('CPUDispatcher(<function scan>) returned a result with an exception set')\n"
        "rcdiag.api.analyze = analyze\n"
        "from rcdiag.cli import main\n"
        f"main(['analyze', {HEALTHY!r}, '-o', 'r.txt'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "rcdiag: aborted\n")
    assert list(tmp_path.iterdir()) == []


def test_a_signal_whose_exception_was_swallowed_still_aborts_before_any_file(tmp_path: Path) -> None:
    """A signal that lands in a callback from C (llvmlite's, while numba compiles) has its exception printed as
    "Exception ignored" and dropped by Python; the run must still end as an abort, writing nothing."""
    code = (
        "import ctypes, signal, rcdiag.api, rcdiag.runtime.interrupts as i\n"
        "real = rcdiag.api.analyze\n"
        "def analyze(*a, **k):\n"
        "    ctypes.CFUNCTYPE(None)(lambda: i.handle(signal.SIGTERM, None))()  # raised in a C callback: swallowed\n"
        "    return real(*a, **k)\n"
        "rcdiag.api.analyze = analyze\n"
        "from rcdiag.cli import main\n"
        f"main(['analyze', {HEALTHY!r}, '-o', 'r.txt', '--save-state', 's.json'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (143, "", "rcdiag: aborted\n")
    assert list(tmp_path.iterdir()) == []
