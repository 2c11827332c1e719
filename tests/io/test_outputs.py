"""Output files, through real subprocesses: never written over an input (refused before reading), written whole or
not at all (a temporary renamed when complete), every write checked (``cannot write PATH: REASON``, exit 2),
devices and FIFOs written in place and never replaced, state files 0600, a path that looks like a flag refused
(rcdiag/io/outputs.py, docs/exit-codes.md)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SAMPLES

HEALTHY = SAMPLES / "healthy.parquet"
ENV = os.environ | {"PYTHONPATH": str(ROOT)}
NOT_A_DUMP = b"PAR1 this is not a dump: a command that read it first would say so\n"
FULL = "No space left on device"


def rcdiag(*args: str, cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``rcdiag ARGS``; ``limit``: files it writes may not grow past that many bytes (a full disk)."""

    def file_size_limit() -> None:
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "rcdiag", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        preexec_fn=file_size_limit if limit is not None else None,
    )


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A file named like a dump that is not one: a command that reads it before refusing its outputs says so."""
    path = tmp_path / "in.parquet"
    path.write_bytes(NOT_A_DUMP)
    return path


OVER_THE_INPUT = {
    "-o": ("analyze", "in.parquet", "-o", "in.parquet"),
    "--output, json": ("analyze", "in.parquet", "--format", "json", "--output", "in.parquet"),
    "--html": ("analyze", "in.parquet", "--html", "in.parquet"),
    "--png": ("analyze", "in.parquet", "--png", "in.parquet"),
    "--save-state": ("analyze", "in.parquet", "--save-state", "in.parquet"),
    "--sequences": ("analyze", "in.parquet", "--sequences", "in.parquet"),
    "../ spelling": ("analyze", "in.parquet", "-o", "../{dir}/in.parquet"),
    "./ spelling": ("analyze", "./in.parquet", "-o", "in.parquet"),
    "hard link": ("analyze", "in.parquet", "-o", "hard.parquet"),
    "symlink": ("analyze", "in.parquet", "-o", "link.parquet"),
    "sweep -o": ("sweep", "in.parquet", "-o", "in.parquet"),
    "sweep --save-state": ("sweep", "in.parquet", "--save-state", "in.parquet"),
    "compare -o B": ("compare", "other.parquet", "in.parquet", "-o", "in.parquet"),
    "check --junit": ("check", "in.parquet", "--max", "kl=1", "--junit", "in.parquet"),
    "check --markdown": ("check", "in.parquet", "--max", "kl=1", "--markdown", "in.parquet"),
    "check --baseline": (
        "check",
        "other.parquet",
        "--baseline",
        "in.parquet",
        "--max-increase",
        "kl=50%",
        "-o",
        "in.parquet",
    ),
    "merge": ("merge", "in.parquet", "-o", "in.parquet"),
}


@pytest.mark.parametrize("case", list(OVER_THE_INPUT))
def test_an_output_over_an_input_is_refused_before_reading(tmp_path: Path, dump: Path, case: str) -> None:
    os.link(dump, tmp_path / "hard.parquet")
    (tmp_path / "link.parquet").symlink_to("in.parquet")
    (tmp_path / "other.parquet").write_bytes(NOT_A_DUMP)
    args = [arg.replace("{dir}", tmp_path.name) for arg in OVER_THE_INPUT[case]]
    flag, given = {"-o": "--output"}.get(args[-2], args[-2]), args[-1]
    done = rcdiag(*args, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rcdiag: error: {flag} {Path(given)} is "), done.stderr
    assert "in.parquet; rcdiag never writes over an input: give another file name." in lines[0]
    assert dump.read_bytes() == NOT_A_DUMP and (tmp_path / "link.parquet").is_symlink()
    assert listing(tmp_path) == ["hard.parquet", "in.parquet", "link.parquet", "other.parquet"]


def test_an_output_inside_an_input_directory_or_glob_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(HEALTHY, runs / "a.parquet")
    outside = tmp_path / "outside.parquet"
    os.link(runs / "a.parquet", outside)
    cases = {
        ("analyze", "runs", "-o", "runs/report.txt"): "--output runs/report.txt is inside the input directory runs",
        (
            "analyze",
            "runs/",
            "--save-state",
            "runs/sub/../s.json",
        ): "--save-state runs/sub/../s.json is inside the input directory runs/",
        ("analyze", "runs", "-o", "outside.parquet"): "--output outside.parquet is the same file (a hard link) as one "
        "inside the input directory runs",
        ("analyze", "runs/*.parquet", "-o", "runs/b.parquet"): "--output runs/b.parquet is matched by the input glob "
        "runs/*.parquet",
        ("merge", "runs/*.json", "-o", "runs/merged.json"): "--output runs/merged.json is matched by the input glob "
        "runs/*.json",
    }
    (runs / "sub").mkdir()
    for args, message in cases.items():
        done = rcdiag(*args, cwd=tmp_path)
        assert (done.returncode, done.stdout) == (2, ""), args
        assert done.stderr == f"rcdiag: error: {message}; rcdiag never writes over an input: give another file name.\n"
    assert listing(runs) == ["a.parquet", "sub"] and listing(runs / "sub") == []


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    done = rcdiag("analyze", str(HEALTHY), "-o", "r.txt", "--save-state", "./r.txt", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == "rcdiag: error: --save-state r.txt names the same file as --output; give each output its own file.\n"
    )
    assert listing(tmp_path) == []


def test_an_output_path_that_looks_like_a_flag_is_refused(tmp_path: Path) -> None:
    for flag in ("--html", "-o", "--save-state", "--sequences", "--png"):
        done = rcdiag("analyze", str(HEALTHY), flag, "-q", cwd=tmp_path)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (
            f"rcdiag: error: {'--output' if flag == '-o' else flag} was given '-q', which looks like a flag: was the "
            "file name left out? To write a file of that name, give it as ./-q\n"
        )
    assert listing(tmp_path) == []
    done = rcdiag("analyze", str(HEALTHY), "--format", "json", "-o", "./-q", "-q", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr.startswith("rcdiag: wrote -q (")
    assert listing(tmp_path) == ["-q"] and (tmp_path / "-q").read_text().startswith("{")


FULL_DEVICE = {
    "-o": ("analyze", "-o"),
    "--html": ("analyze", "--html"),
    "--png": ("analyze", "--png"),
    "--save-state": ("analyze", "--save-state"),
    "sweep --save-state": ("sweep", "--save-state"),
    "--junit": ("check", "--junit"),
    "--markdown": ("check", "--markdown"),
}


@pytest.mark.parametrize("case", list(FULL_DEVICE))
def test_a_full_device_is_a_write_error_and_stays_a_device(tmp_path: Path, case: str) -> None:
    command, flag = FULL_DEVICE[case]
    rules = ("--max", "kl=1") if command == "check" else ()
    done = rcdiag(command, str(HEALTHY), *rules, flag, "/dev/full", "-q", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"rcdiag: error: cannot write /dev/full: {FULL}\n"  # and no 'wrote' line
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # written in place, never replaced (even as root)
    assert listing(tmp_path) == []


def test_a_full_disk_leaves_the_previous_files_and_no_temporary(tmp_path: Path) -> None:
    warm = rcdiag(
        "analyze",
        str(HEALTHY),
        "--sequences",
        "warm.parquet",
        "-q",
        "-o",
        "warm.json",
        "--format",
        "json",
        cwd=tmp_path,
    )
    assert warm.returncode == 0, warm.stderr  # the kernels' cache is written before the disk 'fills'
    for name in ("warm.parquet", "warm.json"):
        (tmp_path / name).unlink()
    old = {"r.json": "the previous report\n", "s.json": "the previous state\n", "q.parquet": "the previous rows\n"}
    for name, text in old.items():
        (tmp_path / name).write_text(text)
    cases = {
        ("--format", "json", "-o", "r.json"): "r.json",
        ("--save-state", "s.json"): "s.json",
        ("--sequences", "q.parquet"): "q.parquet",
    }
    for args, name in cases.items():
        done = rcdiag("analyze", str(HEALTHY), "-q", *args, cwd=tmp_path, limit=4096)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rcdiag: error: cannot write {name}: "), done.stderr
        assert listing(tmp_path) == sorted(old)  # no temporary file or directory left
        assert {n: (tmp_path / n).read_text() for n in old} == old


def test_files_are_replaced_whole_with_their_modes(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text("old")
    (tmp_path / "r.json").chmod(0o640)
    (tmp_path / "s.json").write_text("old")
    (tmp_path / "s.json").chmod(0o644)
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    done = rcdiag(
        "analyze", str(HEALTHY), "-q", "--format", "json", "-o", "r.json", "--save-state", "s.json", "--html",
        "link.txt", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.json").read_text().startswith("{") and stat.S_IMODE(
        (tmp_path / "r.json").stat().st_mode
    ) == 0o640
    assert stat.S_IMODE((tmp_path / "s.json").stat().st_mode) == 0o600  # a state file: its owner only
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text().startswith("<!DOCTYPE html>")
    assert listing(tmp_path) == ["link.txt", "r.json", "real.txt", "s.json"]
    done = rcdiag("analyze", str(HEALTHY), "-q", "--save-state", "new.json", "-o", "new.txt", cwd=tmp_path)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o666 & ~umask


def test_a_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    done = rcdiag("analyze", str(HEALTHY), "-q", "--format", "json", "-o", str(fifo), cwd=tmp_path)
    reader.join(timeout=60)
    assert done.returncode == 0, done.stderr
    assert received and received[0].startswith(b"{") and stat.S_ISFIFO(fifo.stat().st_mode)
    assert listing(tmp_path) == ["report.fifo"]


def test_sequences_are_written_through_a_temporary(tmp_path: Path) -> None:
    done = rcdiag("analyze", str(HEALTHY), "-q", "--sequences", "q.parquet", "--workers", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert pq.read_metadata(tmp_path / "q.parquet").num_rows == 384
    assert listing(tmp_path) == ["q.parquet"]
