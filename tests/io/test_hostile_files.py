"""Corrupt and hostile dump files (issue 25 items 1, 3, 14): each is read by the real CLI in a subprocess under an
address-space cap (``hostile.run_capped``) and must end in the documented exit 2 with one line naming the file,
or be read correctly, quickly and once. The files are built here, in tmp_path, by tests/hostile.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hostile
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from hostile import (
    MEMORY_CAP,
    corrupt_ipc,
    list_table,
    parquet_with_row_groups,
    repeated_row_group,
    run_capped,
    write_ipc,
)

import rcdiag

SAMPLE = ROOT / "sample_data" / "healthy.parquet"
SAMPLE_ROWS = pq.read_metadata(SAMPLE).num_rows

BAD_OFFSETS = {
    "decreasing": ((0, 18, 7, 31), 1),
    "not monotonic": ((0, 7, 3, 31), 1),
    "negative": ((0, -5, 18, 31), 0),
    "past the values": ((0, 7, 18, 100_000), 2),
    "far past the values": ((0, 7, 2_000_000_000, 2_000_000_001), 1),
}
"""Offsets written over the valid (0, 7, 18, 31) of every list column, and the first row they make invalid."""


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rcdiag: error: "), stderr
    return lines[0]


def _rows(stdout: str) -> int:
    return json.loads(stdout)["input"]["rows"]


def test_a_normal_run_fits_the_memory_cap() -> None:
    """The cap is not what fails the runs below: a real dump is analysed under it, with two workers."""
    done = run_capped("analyze", SAMPLE, "--workers", "2", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert _rows(done.stdout) == SAMPLE_ROWS and MEMORY_CAP <= 4 << 30


CASES = [("file", case) for case in sorted(BAD_OFFSETS)] + [
    (layout, case) for layout in ("stream", "large_list") for case in ("decreasing", "past the values")
]


@pytest.mark.parametrize(("layout", "case"), CASES)
def test_invalid_list_offsets_are_exit_2_naming_file_column_and_row(tmp_path: Path, case: str, layout: str) -> None:
    offsets, row = BAD_OFFSETS[case]
    suffix = ".arrows" if layout == "stream" else ".arrow"
    path = corrupt_ipc(tmp_path / f"bad{suffix}", offsets, large=layout == "large_list", stream=layout == "stream")
    done = run_capped("analyze", path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    line = _one_error_line(done.stderr)
    assert line.startswith(f"rcdiag: error: {path}, row {row}, column 'old_log_prob': is corrupt: ")
    assert "offset" in line and done.stdout == ""


@pytest.mark.parametrize("command", [("analyze", "--workers", "2"), ("analyze", "--explain"), ("sweep",)])
def test_a_corrupt_shard_fails_every_command_and_worker(tmp_path: Path, command: tuple[str, ...]) -> None:
    """The bad shard is the second file, so with two workers it is read in a worker process."""
    write_ipc(tmp_path / "a.arrow", list_table())
    bad = corrupt_ipc(tmp_path / "b.arrow", BAD_OFFSETS["past the values"][0])
    done = run_capped(command[0], tmp_path, *command[1:])
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert _one_error_line(done.stderr).startswith(f"rcdiag: error: {bad}, row 2, column 'old_log_prob': is corrupt")


def test_valid_ipc_with_the_same_shape_still_reads(tmp_path: Path) -> None:
    """The builder's valid file (before patching) is analysed: the refusals above are about the offsets alone."""
    path = write_ipc(tmp_path / "ok.arrow", list_table())
    done = run_capped("analyze", path, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert (_rows(done.stdout), json.loads(done.stdout)["input"]["tokens"]) == (3, 31)


def _dump_dir(tmp_path: Path) -> Path:
    root = tmp_path / "d"
    root.mkdir()
    (root / "a.parquet").write_bytes(SAMPLE.read_bytes())
    return root


def test_a_symlinked_file_in_a_directory_is_read_once_and_said(tmp_path: Path) -> None:
    """A directory is listed without following links to directories, so its ``loop -> .`` adds nothing."""
    root = _dump_dir(tmp_path)
    (root / "b.parquet").symlink_to("a.parquet")
    (root / "loop").symlink_to(".")
    done = run_capped("analyze", root, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert _rows(done.stdout) == SAMPLE_ROWS
    assert done.stderr.strip() == (
        f"rcdiag: note: {root}/b.parquet is the same file as {root}/a.parquet (a link); it is read once, as "
        f"{root}/a.parquet"
    )


def test_a_hard_link_reached_by_a_glob_is_read_once(tmp_path: Path) -> None:
    root = _dump_dir(tmp_path)
    os.link(root / "a.parquet", root / "c.parquet")
    done = run_capped("analyze", f"{root}/*.parquet", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert _rows(done.stdout) == SAMPLE_ROWS
    assert "c.parquet is the same file as" in done.stderr


def test_a_glob_through_a_symlink_loop_reads_each_file_once(tmp_path: Path) -> None:
    root = _dump_dir(tmp_path)
    (root / "loop").symlink_to(".")
    done = run_capped("analyze", f"{root}/**/*.parquet", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert _rows(done.stdout) == SAMPLE_ROWS
    assert done.stderr.strip() == (
        f"rcdiag: note: {root}/loop is a link back into a directory the glob is already inside (a symlink loop); "
        "not followed"
    )


def test_a_glob_through_a_linked_directory_still_follows_it(tmp_path: Path) -> None:
    """Links to directories outside the glob's path are followed, as ``glob.glob`` does; only loops are not."""
    root = _dump_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "e.parquet").write_bytes(SAMPLE.read_bytes())
    (root / "more").symlink_to(elsewhere)
    assert [p.name for p in rcdiag.io.paths.glob_files(f"{root}/**/*.parquet")] == ["a.parquet", "e.parquet"]


def test_two_self_symlinks_end_quickly_for_analyze_and_merge(tmp_path: Path) -> None:
    """``**`` through ``a -> .`` and ``b -> .`` used to walk 2^40 paths."""
    root = _dump_dir(tmp_path)
    state = root / "s.json"
    saved = run_capped("analyze", root / "a.parquet", "--save-state", state, "-q")
    assert saved.returncode == 0, saved.stderr
    (root / "a").symlink_to(".")
    (root / "b").symlink_to(".")
    start = time.monotonic()
    analyzed = run_capped("analyze", f"{root}/**/*.parquet", "--format", "json")
    merged = run_capped("merge", f"{root}/**/*.json", "--format", "json")
    assert time.monotonic() - start < 60
    assert analyzed.returncode == 0 and merged.returncode == 0, (analyzed.stderr, merged.stderr)
    assert _rows(analyzed.stdout) == SAMPLE_ROWS and _rows(merged.stdout) == SAMPLE_ROWS
    assert analyzed.stderr.count("(a symlink loop); not followed") == 2


def test_a_footer_listing_one_row_group_many_times_is_exit_2(tmp_path: Path) -> None:
    """20,001 listings of a 64-row group, the footer saying 64 rows: 1.28M rows were read."""
    path = repeated_row_group(tmp_path / "r.parquet", 20_001, num_rows=64)
    assert pq.read_metadata(path).num_rows == 64
    done = run_capped("analyze", path)
    assert done.returncode == 2, done.stderr
    assert _one_error_line(done.stderr) == (
        f"rcdiag: error: {path}: has a footer whose row group 1 (column 'old_log_prob.list.element') overlaps row "
        "group 0: the footer lists the same bytes twice (a damaged or hostile file; its rows would be counted twice)"
    )


def test_a_footer_claiming_more_rows_than_its_row_groups_is_exit_2(tmp_path: Path) -> None:
    path = repeated_row_group(tmp_path / "r.parquet", 1, num_rows=65)
    done = run_capped("analyze", path)
    assert done.returncode == 2, done.stderr
    assert _one_error_line(done.stderr) == (
        f"rcdiag: error: {path}: has a footer that says 65 rows but its row groups hold 64 (a damaged or hostile file)"
    )


def test_many_row_groups_take_time_linear_in_their_number(tmp_path: Path) -> None:
    """2,000 row groups took 23 s (quadratic: 2.4 s for 500); a linear reader takes about 8x the time of 250."""
    small = parquet_with_row_groups(tmp_path / "g250.parquet", 250)
    large = parquet_with_row_groups(tmp_path / "g2000.parquet", 2_000)
    rcdiag.analyze(small)  # compiles the kernels

    def seconds(path: Path) -> float:
        start = time.perf_counter()
        report = rcdiag.analyze(path)
        assert report.input.rows == pq.read_metadata(path).num_rows
        return time.perf_counter() - start

    ratio = seconds(large) / seconds(small)
    assert ratio < 24, f"2,000 row groups took {ratio:.1f}x the time of 250"


@pytest.mark.parametrize(("kind", "count", "seed"), [("parquet", 450, 0), ("parquet", 900, 7), ("arrow", 750, 7)])
def test_random_byte_damage_is_read_or_refused_never_a_crash(tmp_path: Path, kind: str, count: int, seed: int) -> None:
    """Among the damaged copies: column names that are not UTF-8 (``UnicodeDecodeError`` from pyarrow, exit 3); a
    size-statistics histogram of the wrong length in a footer (seed 0, copy 411), on which pyarrow's
    ``RowGroupMetaData.column(i)`` aborts the process (an uncaught C++ exception), and a footer whose pyarrow
    serialisation segfaults (seed 7, copy 860): rcdiag reads the footer's bytes itself; a list whose child has a
    negative length (seed 7, copy 709 of the Arrow run: ``SystemError`` naming the bad row)."""
    done = run_capped(tmp_path, kind, count, seed, python=(hostile.__file__,))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    outcomes = json.loads(done.stdout)
    assert set(outcomes) <= {"ok", "error"}, outcomes
    assert sum(outcomes.values()) == count and outcomes.get("error", 0) > count // 4
