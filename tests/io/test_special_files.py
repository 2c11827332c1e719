"""FIFOs, sockets, devices and dangling symlinks (issue 32), and signals while a run is blocked, through the real
command line in subprocesses.

A path rcdiag is to read is checked with ``os.stat`` before it is opened (``rcdiag.io.paths.regular_file``):
opening a FIFO blocks until a writer comes, inside pyarrow's C++ (which retries EINTR, so neither SIGINT nor SIGTERM
ended it: only SIGKILL did). Each case runs under a time cap, so a regression fails instead of hanging. In a
directory or a glob such entries are named in the ``left out`` note. SIGINT and SIGTERM end a run within a second
wherever it is: waiting for files, reading, or blocked in a system call (an output FIFO without a reader, a full
stdout).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from child_process import ENV, SLOW, has_open
from conftest import SAMPLES, require, write_dump
from hostile import run_capped

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo") or sys.platform != "linux", reason="FIFOs and /proc: Linux")

HEALTHY = SAMPLES / "healthy.parquet"
CAP = 60
"""Seconds a refused special file may take (the imports, on a busy machine); a FIFO that is opened never ends."""
DUMP = "give a dump file, a directory or a glob"


def refused(*args: str | Path, cwd: Path | None = None) -> str:
    """Exit 2 with one line and no traceback, within ``CAP`` seconds; the line."""
    done = run_capped(*args, cwd=cwd, timeout=CAP)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("rcdiag: error: "), done.stderr
    return done.stderr.rstrip("\n")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl", ".pt", ".npz"])
def test_a_fifo_as_the_dump_is_refused_without_opening_it(tmp_path: Path, suffix: str) -> None:
    dump = fifo(tmp_path / f"f{suffix}")
    assert refused("analyze", dump) == f"rcdiag: error: {dump}: is a FIFO, not a regular file; {DUMP}"


def test_a_fifo_as_either_side_of_compare_or_sweep_is_refused(tmp_path: Path) -> None:
    dump = fifo(tmp_path / "f.parquet")
    line = f"rcdiag: error: {dump}: is a FIFO, not a regular file; {DUMP}"
    assert refused("compare", HEALTHY, dump) == line
    assert refused("compare", dump, HEALTHY) == line
    assert refused("sweep", dump) == line


def test_a_fifo_as_check_baseline_rules_or_pyproject_is_refused(tmp_path: Path) -> None:
    dump = fifo(tmp_path / "f.parquet")
    line = f"rcdiag: error: {dump}: is a FIFO, not a regular file; {DUMP}"
    assert refused("check", HEALTHY, "--max", "kl=1", "--baseline", dump) == line
    rules = tmp_path / "rules.toml"
    rules.write_text('baseline = "f.parquet"\n[max]\nkl = 1\n')  # relative to the rules file
    assert refused("check", HEALTHY, "--rules", rules) == line
    pipe = fifo(tmp_path / "pipe.toml")
    assert refused("check", HEALTHY, "--rules", pipe) == (
        f"rcdiag: error: {pipe}: is a FIFO, not a regular file; give a rules file"
    )
    project = tmp_path / "project"
    project.mkdir()
    fifo(project / "pyproject.toml")  # not passed over as "no [tool.rcdiag.check] table": it is named
    assert refused("check", HEALTHY, "--max", "kl=1", cwd=project) == (
        "rcdiag: error: pyproject.toml: is a FIFO, not a regular file; give a rules file"
    )
    done = run_capped("check", HEALTHY, "--max", "kl=1", "--no-pyproject", "-q", cwd=project, timeout=CAP)
    assert done.returncode == 0, done.stderr


def test_a_fifo_as_the_tokenizer_is_named_not_missing(tmp_path: Path) -> None:
    require("tokenizers", "tokens")
    pipe = fifo(tmp_path / "tok")
    assert refused("analyze", HEALTHY, "--explain", "--tokenizer", pipe) == (
        f"rcdiag: error: {pipe}: is a FIFO, not a regular file; give a tokenizer.json or a directory holding one"
    )
    model = tmp_path / "model"
    model.mkdir()
    inner = fifo(model / "tokenizer.json")
    assert refused("analyze", HEALTHY, "--explain", "--tokenizer", model) == (
        f"rcdiag: error: {inner}: is a FIFO, not a regular file; give a tokenizer.json"
    )
    assert refused("analyze", HEALTHY, "--explain", "--tokenizer", tmp_path / "none") == (
        f"rcdiag: error: {tmp_path / 'none'}: has no tokenizer.json (give the file, or a directory holding one)"
    )


def test_a_fifo_as_a_state_file_is_refused_by_merge_and_watch(tmp_path: Path) -> None:
    state = fifo(tmp_path / "s.json")
    assert refused("merge", state) == f"rcdiag: error: {state}: is a FIFO, not a regular file; give a state file"
    run = tmp_path / "run"
    run.mkdir()
    assert refused("watch", run, "--state", state, "--once") == (
        f"rcdiag: error: {state}: is a FIFO, not a regular file; give a state file"
    )


def test_a_device_a_socket_and_a_dangling_symlink_as_the_dump(tmp_path: Path) -> None:
    assert (
        refused("analyze", "/dev/zero")
        == f"rcdiag: error: /dev/zero: is a character device, not a regular file; {DUMP}"
    )
    sock = tmp_path / "s.parquet"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock))
        assert refused("analyze", sock) == f"rcdiag: error: {sock}: is a socket, not a regular file; {DUMP}"
    link = tmp_path / "gone.parquet"
    link.symlink_to("missing.parquet")
    assert refused("analyze", link) == f"rcdiag: error: {link}: is a dangling symlink to missing.parquet"


def special_directory(root: Path) -> socket.socket:
    """``root`` holding a dump, a FIFO, a socket (the bound socket returned: it lives as long as it) and a dangling
    symlink, each with a dump suffix."""
    root.mkdir()
    shutil.copy(HEALTHY, root / "a.parquet")
    fifo(root / "f.parquet")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "s.parquet"))
    (root / "gone.parquet").symlink_to("missing.parquet")
    return server


def test_a_directory_names_its_fifo_socket_and_dangling_symlink(tmp_path: Path) -> None:
    root = tmp_path / "d"
    with special_directory(root):
        done = run_capped("analyze", root, "-q", "--format", "json", timeout=CAP)
        assert done.returncode == 0, done.stderr
        assert done.stderr == (
            f"rcdiag: {root}: left out 3 files: f.parquet (a FIFO, not a regular file), gone.parquet (a dangling "
            "symlink to missing.parquet), s.parquet (a socket, not a regular file)\n"
        )
        assert '"rows": 384' in done.stdout
        pattern = f"{root}/*.parquet"
        done = run_capped("analyze", pattern, "-q", "--format", "json", timeout=CAP)
        assert done.returncode == 0, done.stderr
        assert done.stderr == (
            f"rcdiag: {pattern}: left out 3 files: {root}/f.parquet (a FIFO, not a regular file), {root}/gone.parquet "
            f"(a dangling symlink to missing.parquet), {root}/s.parquet (a socket, not a regular file)\n"
        )


def test_a_directory_or_glob_of_only_a_fifo_says_so_in_its_error(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    fifo(root / "f.parquet")
    assert refused("analyze", root).startswith(f"rcdiag: error: {root}: is a directory without dump files (")
    assert refused("analyze", root).endswith("); left out 1 file: f.parquet (a FIFO, not a regular file)")
    assert refused("analyze", f"{root}/*") == (
        f"rcdiag: error: {root}/*: matches no file; left out 1 file: {root}/f.parquet (a FIFO, not a regular file)"
    )


def test_merge_names_a_fifo_in_a_directory_of_states_once(tmp_path: Path) -> None:
    states = tmp_path / "states"
    states.mkdir()
    saved = run_capped("analyze", HEALTHY, "-q", "--save-state", states / "a.json", timeout=CAP)
    assert saved.returncode == 0, saved.stderr
    fifo(states / "b.json")
    done = run_capped("merge", states, "--format", "json", timeout=CAP)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"rcdiag: {states}: left out 1 file: b.json (a FIFO, not a regular file)\n"
    done = run_capped("merge", f"{states}/*.json", "--format", "json", timeout=CAP)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"rcdiag: {states}/*.json: left out 1 file: {states}/b.json (a FIFO, not a regular file)\n"


# ---------------------------------------------------------------------------------------------------- signals

WITHIN = 1.0
"""Seconds from the signal to the process's end."""


def wchan(pid: int) -> str:
    """Where in the kernel the process sleeps (``""`` when the kernel does not say)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().strip().strip("0")
    except OSError:
        return ""


def blocked_in(*names: str) -> Callable[[subprocess.Popen], bool]:
    """Ready once the process sleeps in a kernel function whose name holds one of ``names`` (where the kernel does
    not say, once it has slept for 10 s)."""
    started = time.monotonic()
    return lambda process: (
        any(name in wchan(process.pid) for name in names)
        or (not wchan(process.pid) and time.monotonic() - started > 10)
    )


def signalled(
    args: list[str | Path], cwd: Path, ready: Callable[[subprocess.Popen], bool], signum: int, stdout: int | None = None
) -> tuple[int, str, float]:
    """Start ``rcdiag ARGS``, send ``signum`` once ``ready``; its exit code, stderr and seconds from the signal to
    its end (killed, and a failure, past 30 s)."""
    err = cwd / "stderr.txt"
    with open(err, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "rcdiag", *map(str, args)],
            cwd=cwd,
            env=ENV,
            stdout=subprocess.DEVNULL if stdout is None else stdout,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + 120
        while not ready(process) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, f"the run ended before it could be interrupted: {err.read_text()}"
        sent = time.monotonic()
        process.send_signal(signum)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rcdiag {args} did not end within 30 s of {signal.Signals(signum).name}") from None
        return process.returncode, err.read_text(), time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]


@pytest.mark.parametrize(("signum", "code"), SIGNALS)
def test_a_signal_ends_a_waiting_watch_at_once(tmp_path: Path, signum: int, code: int) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(HEALTHY, run / "step_0.parquet")
    state = tmp_path / "watch.json"
    args: list[str | Path] = ["watch", run, "--state", state, "--poll", "0.05", "--settle", "0"]
    got = signalled(args, tmp_path, lambda _: state.exists() and blocked_in("nanosleep", "poll", "select")(_), signum)
    assert got[:2] == (code, "rcdiag: aborted\n") and got[2] < WITHIN, got


@pytest.mark.parametrize(("signum", "code"), SIGNALS)
def test_a_signal_ends_a_run_reading_a_large_dump_at_once(
    tmp_path: Path,
    big_dump: Path,
    signum: int,
    code: int,
) -> None:
    opened: list[float] = []

    def reading(process: subprocess.Popen) -> bool:
        if not opened and has_open(process.pid, big_dump):
            opened.append(time.monotonic())
        return bool(opened) and time.monotonic() - opened[0] > 0.5

    got = signalled(["analyze", big_dump, "--explain", "-o", "r.txt", *SLOW], tmp_path, reading, signum)
    assert got[:2] == (code, "rcdiag: aborted\n") and got[2] < WITHIN, got
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr.txt"]


@pytest.mark.parametrize(("signum", "code"), SIGNALS)
def test_a_signal_ends_a_run_blocked_opening_an_output_fifo(tmp_path: Path, signum: int, code: int) -> None:
    out = fifo(tmp_path / "report.fifo")  # written in place (docs/exit-codes.md); no reader ever comes
    got = signalled(["analyze", HEALTHY, "-q", "-o", out], tmp_path, blocked_in("wait_for_partner", "fifo"), signum)
    assert got[:2] == (code, "rcdiag: aborted\n") and got[2] < WITHIN, got


@pytest.mark.parametrize(("signum", "code"), SIGNALS)
def test_a_signal_ends_a_run_blocked_writing_a_full_stdout(tmp_path: Path, signum: int, code: int) -> None:
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)  # the report (13 kB) fills it; nothing reads it
    try:
        args: list[str | Path] = ["analyze", HEALTHY, "--format", "json", "--details", "-q"]
        got = signalled(args, tmp_path, blocked_in("pipe_write"), signum, stdout=write)
    finally:
        os.close(write)
        os.close(read)
    assert got[:2] == (code, "rcdiag: aborted\n") and got[2] < WITHIN, got


def test_a_signal_ends_a_watch_blocked_writing_its_lines_to_a_full_stdout(tmp_path: Path) -> None:
    """Each step line is flushed as it is written; with nothing reading stdout the flush blocks, and the abort's own
    flush of what is left must not block again."""
    run = tmp_path / "run"
    run.mkdir()
    for step in range(40):
        columns = {"old_log_prob": [[-0.5] * 8] * 4, "rollout_log_prob": [[-0.51] * 8] * 4, "step": [step] * 4}
        write_dump(run / f"step_{step}.parquet", columns)
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    try:
        args: list[str | Path] = ["watch", run, "--state", tmp_path / "w.json", "--format", "json", "--settle", "0"]
        got = signalled(args, tmp_path, blocked_in("pipe_write"), signal.SIGTERM, stdout=write)
    finally:
        os.close(write)
        os.close(read)
    assert got[:2] == (143, "rcdiag: aborted\n") and got[2] < WITHIN, got
