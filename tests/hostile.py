"""Builders of hostile and corrupt dumps for tests/io/test_hostile_*.py, and the capped subprocess that reads them.

Every file is built in the test's tmp_path from a valid one (written by pyarrow) whose bytes are then patched, so no
binary that could hurt a reader is ever committed. ``run_capped`` runs the real CLI in a subprocess under an
address-space limit: a crash, a runaway allocation or a hang shows up as an exit code, never takes the test
process down.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

MEMORY_CAP = 2 << 30
"""Address space of a capped run: a normal analyze (numba's JIT included, ``--workers 2`` too) runs under 1 GiB."""
TIME_CAP = 120
"""Seconds before a capped run counts as a hang."""
LENGTHS = (7, 11, 13)
"""Response lengths of a patched dump: its offsets (0, 7, 18, 31) are a byte pattern found nowhere else."""
COLUMNS = ("old_log_prob", "rollout_log_prob", "response_mask")


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(
    *args: str | Path, cwd: Path | None = None, python: tuple[str, ...] = ("-m", "rcdiag"), timeout: float = TIME_CAP
) -> Result:
    """``python -m rcdiag ARGS`` (or ``python PYTHON ARGS``) under ``MEMORY_CAP`` of address space and ``timeout``
    seconds (killed after them: a hang fails the test)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    try:
        done = subprocess.run(
            [sys.executable, *python, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_cap,
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"rcdiag {' '.join(map(str, args))} ran over {timeout} s") from exc
    return Result(done.returncode, done.stdout, done.stderr)


def list_table(lengths: tuple[int, ...] = LENGTHS, *, large: bool = False) -> pa.Table:
    """A valid dump: old/rollout log-probs and a mask with ``lengths`` tokens per response."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64 if large else np.int32)
    n = int(offsets[-1])
    make = pa.LargeListArray if large else pa.ListArray
    old = -np.linspace(0.1, 2.0, n, dtype=np.float32)
    columns = {
        "old_log_prob": make.from_arrays(pa.array(offsets), pa.array(old)),
        "rollout_log_prob": make.from_arrays(pa.array(offsets), pa.array(old - np.float32(0.01))),
        "response_mask": make.from_arrays(pa.array(offsets), pa.array(np.ones(n, dtype=np.int8))),
    }
    return pa.table(columns)


def write_ipc(path: Path, table: pa.Table, *, stream: bool = False) -> Path:
    """``table`` as an Arrow IPC file (or stream), uncompressed."""
    open_writer = ipc.new_stream if stream else ipc.new_file
    with open_writer(str(path), table.schema) as writer:
        writer.write_table(table)
    return path


def patch_offsets(path: Path, offsets: tuple[int, ...], *, large: bool = False) -> Path:
    """Replace the offsets of every list column of a dump written with ``LENGTHS`` by ``offsets`` (same count), so
    the columns still agree with each other and only the offsets themselves are wrong."""
    dtype = np.int64 if large else np.int32
    valid = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(dtype).tobytes()
    data = path.read_bytes()
    if data.count(valid) != len(COLUMNS):
        raise AssertionError(f"{path}: expected the offsets pattern once per column, found {data.count(valid)}")
    path.write_bytes(data.replace(valid, np.asarray(offsets, dtype=dtype).tobytes()))
    return path


def corrupt_ipc(path: Path, offsets: tuple[int, ...], *, large: bool = False, stream: bool = False) -> Path:
    """An Arrow IPC file (or stream) whose list offsets are ``offsets`` (e.g. decreasing, or past the values)."""
    return patch_offsets(write_ipc(path, list_table(large=large), stream=stream), offsets, large=large)


def parquet_with_row_groups(path: Path, groups: int, rows_per_group: int = 1) -> Path:
    """A valid Parquet dump of ``groups`` row groups (each ``rows_per_group`` short responses)."""
    lengths = (3,) * (groups * rows_per_group)
    pq.write_table(list_table(lengths), path, row_group_size=rows_per_group)
    return path


def repeated_row_group(path: Path, times: int, *, num_rows: int | None = None) -> Path:
    """A Parquet file of 64 rows whose footer lists its one row group ``times`` times (built with pyarrow's own
    metadata writer: the data pages once, then a footer with the row group appended ``times - 1`` times more),
    saying ``num_rows`` rows (default: what the listed groups add up to)."""
    pq.write_table(list_table((3,) * 64), path, row_group_size=64)
    data = path.read_bytes()
    body = data[: len(data) - 8 - int.from_bytes(data[-8:-4], "little")]
    metadata = pq.read_metadata(path)
    one = pq.read_metadata(path)
    for _ in range(times - 1):
        metadata.append_row_groups(one)
    sink = pa.BufferOutputStream()
    metadata.write_metadata_file(sink)
    footer = sink.getvalue().to_pybytes()[4:-8]  # b"PAR1" + footer + length + b"PAR1"
    if num_rows is not None:
        footer = _with_num_rows(footer, metadata.num_rows, num_rows)
    path.write_bytes(body + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    return path


def _with_num_rows(footer: bytes, old: int, new: int) -> bytes:
    """The Thrift (compact protocol) footer with ``FileMetaData.num_rows`` (field 3, an i64 right after the
    schema list and before field 4, the row groups list) changed from ``old`` to ``new``."""

    def field(value: int) -> bytes:
        zigzag, out = (value << 1) ^ (value >> 63), bytearray()
        while True:
            byte, zigzag = zigzag & 0x7F, zigzag >> 7
            out.append(byte | (0x80 if zigzag else 0))
            if not zigzag:
                return b"\x16" + bytes(out) + b"\x19"  # field 3 (delta 1) of type i64, then field 4: a list

    if footer.count(field(old)) != 1:
        raise AssertionError("num_rows not found once in the footer")
    return footer.replace(field(old), field(new))


def random_damage(directory: Path, kind: str, count: int, seed: int = 0) -> dict[str, int]:
    """Analyse ``count`` copies of a valid dump (``kind``: "parquet" or "arrow", uncompressed), each with 1-4 random
    bytes overwritten, in this process: how many were read ("ok") or refused with an ``RcdiagError`` ("error"), and
    any other outcome by its exception type (a crash ends the process instead)."""
    import random

    import rcdiag
    from rcdiag.runtime.errors import RcdiagError

    source = directory / f"valid.{kind}"
    table = list_table(LENGTHS * 20)
    if kind == "parquet":
        pq.write_table(table, source, compression="none", row_group_size=20)
    else:
        write_ipc(source, table)
    data = source.read_bytes()
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    for _ in range(count):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        path = directory / f"damaged.{kind}"
        path.write_bytes(bytes(damaged))
        try:
            rcdiag.analyze(path)
            outcome = "ok"
        except RcdiagError:
            outcome = "error"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"[:200]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


if __name__ == "__main__":  # python tests/hostile.py DIRECTORY KIND COUNT SEED: random_damage's outcomes as JSON
    import json

    print(json.dumps(random_damage(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
