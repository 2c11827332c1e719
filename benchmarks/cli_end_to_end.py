"""The command line end to end, as a user runs it (issue 26): every figure a fresh ``python -m rcdiag`` process,
timed from outside, with the bare decode in a fresh process as the floor, all in one run.

    python benchmarks/cli_end_to_end.py --tokens 30M --small 5M --rounds 3

Each round runs every command once, in turn (interleaved, so load on a shared machine hits all of them alike),
after one untimed warm-up round (which also brings the dumps into the page cache and the kernels into numba's
cache). The report gives medians over rounds of the wall time and of the CPU time (user and system, every thread
and waited-for child: where the decode already keeps every core busy, any CPU beyond it shows as wall time), their
ratios against the baseline named in each row (the median over rounds of each round's ratio: the two runs it
compares were close in time), and each command's peak RSS (``ru_maxrss`` of the child, from ``os.wait4``, in one
more run after the timed ones). Commands:

* ``decode``: python + pyarrow alone decode the dump's three list columns (the floor; no rcdiag import);
* ``analyze`` with verl's default configuration and with ``is_rs`` (sequence IS plus two RS options), on the
  benchmark dump (row groups of 512 responses) and on a copy with row groups of 64 responses;
* ``--explain`` against plain analyze; the default ``sweep`` against one ``analyze --rs token_k1``;
* ``--workers auto`` and ``--workers 2`` against one process (``is_rs``);
* ``--baseline TREE``: every rcdiag command also run from an older source tree (``git archive COMMIT | tar -x``),
  interleaved with the new one, so the table's old and new figures come from the same run;
* a 10k-token dump whose verdict is ``healthy`` and one whose verdict is ``correct`` (``rcdiag.io.synthetic``'s
  ``healthy`` and ``outliers`` scenarios), kernels cached; ``--help``; bare ``python -c pass``, typer + rich's help
  module alone (the floor for ``--help``) and the libraries a run imports alone (``RUN_IMPORTS``: the floor for
  the 10k-token run);
* peak RSS of analyze, ``--explain`` and sweep at ``--small`` tokens and at ``--tokens``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
from _data import DATA, dump, parse_tokens

import rcdiag.io.synthetic as synthetic

RCDIAG = [sys.executable, "-m", "rcdiag"]
IS_RS = ["--is", "sequence", "--is-threshold", "2.0", "--rs", "token_k1,seq_mean_k1", "--rs-threshold",
         "0.5_2.0,0.999_1.001"]  # fmt: skip
DECODE = """
import sys
import pyarrow.parquet as pq
file = pq.ParquetFile(sys.argv[1], buffer_size=1 << 20, pre_buffer=False)
for group in range(file.metadata.num_row_groups):
    table = file.read_row_group(group, columns=["old_log_prob", "rollout_log_prob", "response_mask"], use_threads=True)
    for column in table.columns:
        flat = [chunk.values.to_numpy(zero_copy_only=False) for chunk in column.chunks]
"""

RUN_IMPORTS = "import numpy, pyarrow.parquet, typer, typer._adapters, rich.console, rich.table"
"""What any small run imports whatever rcdiag does (the libraries of the design card; typer 0.29 validates every
parameter through pydantic, ``typer._adapters``): the floor of the 10k-token run."""

WRAP = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
_, status, usage = os.wait4(child.pid, 0)
sys.stderr.write(child.stderr.read().decode())
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""
"""Runs a command and prints its exit code and peak RSS (kB): a child's ``ru_maxrss`` counts the memory of the
process it was forked from, so the measured command is forked from this small interpreter, not from the
benchmark (which holds pyarrow and the dumps it wrote)."""


def _env(tree: str | None) -> dict[str, str]:
    """The environment of a measured command: ``tree`` first on ``PYTHONPATH`` when given (the baseline's source),
    byte-code caching on (as installed). The command also runs from ``tree``: ``python -m`` puts the working
    directory first on ``sys.path``, so run from this checkout a baseline would run this checkout's code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if tree:
        env["PYTHONPATH"] = tree
    return env


def _check(argv: list[str], code: int, stderr: str) -> None:
    if code not in (0, 1):  # 1: a finding at the gate; still a full run
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {stderr}")


def run(argv: list[str], tree: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, all its threads) of one fresh process (its output discarded; a failure
    is fatal)."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(tree), cwd=tree)
    assert child.stderr is not None
    stderr = child.stderr.read().decode()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    _check(argv, child.returncode, stderr)
    return wall, usage.ru_utime + usage.ru_stime


def peak_rss(argv: list[str], tree: str | None = None) -> float:
    """Peak RSS (MB) of one fresh process, forked from a small wrapper (``WRAP``)."""
    done = subprocess.run([sys.executable, "-c", WRAP, *argv], capture_output=True, text=True, env=_env(tree), cwd=tree)
    code, kb = done.stdout.split()
    _check(argv, int(code), done.stderr)
    return int(kb) / 1024


def small_groups(path: Path, rows: int) -> Path:
    """A copy of ``path`` in row groups of ``rows`` responses (generated on first use)."""
    out = path.with_name(f"{path.stem}_rg{rows}.parquet")
    if not out.exists():
        table = pq.read_table(path)
        pq.write_table(table, out.with_suffix(".tmp"), row_group_size=rows, compression="zstd")
        out.with_suffix(".tmp").replace(out)
    return out


def tiny(scenario: str, tokens: int = 10_000) -> Path:
    """A ``tokens``-token dump of a synthetic scenario (about; generated on first use)."""
    out = DATA / f"tiny_{scenario}_{tokens}.parquet"
    if not out.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        table = synthetic.generate(scenario, rows=tokens // 200, steps=2, median_length=200, max_length=400)
        synthetic.write(table, out)
    return out


def verdict(path: Path, *flags: str) -> str:
    """The verdict status ``rcdiag analyze`` gives this dump."""
    import json

    out = subprocess.run([*RCDIAG, "analyze", str(path), "-q", "--format", "json", *flags], capture_output=True)
    return str((json.loads(out.stdout).get("verdict") or {}).get("status"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="30M", help="the large dump's size (the issue's figures: 100M)")
    parser.add_argument("--small", default="5M", help="the smaller dump for peak RSS growth")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small-group-rows", type=int, default=64)
    parser.add_argument("--baseline", default="", help="a source tree of the code to compare with (git archive)")
    args = parser.parse_args()
    big, small = dump(parse_tokens(args.tokens)), dump(parse_tokens(args.small))
    big_rg = small_groups(big, args.small_group_rows)
    healthy, correct = tiny("healthy"), tiny("outliers")
    analyze = [*RCDIAG, "analyze", "-q"]
    timed = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import typer, typer.rich_utils": [sys.executable, "-c", "import typer, typer.rich_utils"],
        "imports of a run": [sys.executable, "-c", RUN_IMPORTS],
        "rcdiag --help": [*RCDIAG, "--help"],
        "analyze 10k (healthy)": [*analyze, str(healthy)],
        "analyze 10k (correct)": [*analyze, str(correct)],
        "decode": [sys.executable, "-c", DECODE, str(big)],
        "analyze": [*analyze, str(big)],
        "analyze is_rs": [*analyze, str(big), *IS_RS],
        f"analyze, rg {args.small_group_rows}": [*analyze, str(big_rg)],
        f"analyze is_rs, rg {args.small_group_rows}": [*analyze, str(big_rg), *IS_RS],
        "analyze --explain": [*analyze, str(big), "--explain"],
        "analyze --rs token_k1": [*analyze, str(big), "--rs", "token_k1", "--rs-threshold", "0.5_2.0"],
        "sweep (default)": [*RCDIAG, "sweep", "-q", str(big)],
        "analyze is_rs --workers 2": [*analyze, str(big), *IS_RS, "--workers", "2"],
        "analyze is_rs --workers auto": [*analyze, str(big), *IS_RS, "--workers", "auto"],
    }
    memory_small = {
        "analyze": [*analyze, str(small)],
        "analyze --explain": [*analyze, str(small), "--explain"],
        "sweep (default)": [*RCDIAG, "sweep", "-q", str(small)],
    }
    here = str(Path(__file__).resolve().parents[1])
    trees = {"new": here} | ({"old": str(Path(args.baseline).resolve())} if args.baseline else {})
    plain = ("decode", "python -c pass", "import typer, typer.rich_utils", "imports of a run")  # no rcdiag: run once
    jobs = [(name, version) for name in timed for version in trees
            if version == "new" or (name not in plain and "auto" not in name)]  # fmt: skip
    load = os.getloadavg()[0]
    for name, version in jobs:  # warm-up: page cache, kernel cache
        run(timed[name], trees[version])
    wall: dict[tuple[str, str], list[float]] = {job: [] for job in jobs}
    cpu: dict[tuple[str, str], list[float]] = {job: [] for job in jobs}
    for _ in range(args.rounds):
        for job in jobs:
            seconds, cpu_seconds = run(timed[job[0]], trees[job[1]])
            wall[job].append(seconds)
            cpu[job].append(cpu_seconds)
    rss = {job: peak_rss(timed[job[0]], trees[job[1]]) for job in jobs}
    small_rss = {(name, v): peak_rss(argv, trees[v]) for name, argv in memory_small.items() for v in trees}
    med = {job: statistics.median(times) for job, times in wall.items()}
    print(f"{big.name}, {big_rg.name}, small {small.name}; {args.rounds} interleaved rounds after a warm-up;")
    print(f"1-minute load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {os.cpu_count()} CPUs")
    print(f"new: {trees['new']}" + (f"; old: {trees['old']}" if "old" in trees else "") + "\n")
    print("| command | version | wall s, median (min-max) | CPU s, median | peak RSS MB |\n|---|---|---|---|---|")
    for job in jobs:
        times = wall[job]
        print(f"| {job[0]} | {job[1]} | {med[job]:.2f} ({min(times):.2f}-{max(times):.2f}) | "
              f"{statistics.median(cpu[job]):.2f} | {rss[job]:.0f} |")  # fmt: skip
    rg = f"rg {args.small_group_rows}"
    ratios = [
        ("decode / analyze (default)", "decode", "analyze", True, ">= 0.85"),
        ("decode / analyze is_rs", "decode", "analyze is_rs", True, ">= 0.85"),
        (f"decode / analyze, {rg}", "decode", f"analyze, {rg}", True, ">= 0.85"),
        (f"decode / analyze is_rs, {rg}", "decode", f"analyze is_rs, {rg}", True, ">= 0.85"),
        ("--explain / plain analyze", "analyze --explain", "analyze", False, "<= 1.3"),
        ("sweep / analyze --rs token_k1", "sweep (default)", "analyze --rs token_k1", False, "<= 2.5"),
        ("--workers 2 / one process (is_rs)", "analyze is_rs --workers 2", "analyze is_rs", False, ""),
        ("--workers auto / one process (is_rs)", "analyze is_rs --workers auto", "analyze is_rs", False, "<= 1.0"),
    ]
    seconds = [
        ("10k healthy analyze, s", "analyze 10k (healthy)", "<= 0.35"),
        ("10k correct analyze, s", "analyze 10k (correct)", "<= 0.35"),
        ("--help, s", "rcdiag --help", "<= 0.15"),
    ]
    versions = list(trees)
    columns = " | ".join(f"{v}: wall | {v}: CPU" for v in versions)
    head = f"\n| ratio (same run; median of per-round ratios) | {columns} | target (wall) |"
    print(head + "\n|---|" + "---|---|" * len(versions) + "---|")
    for title, top, bottom, floor, target in ratios:
        cells = []
        for v in versions:
            a, b = (top, "new" if floor else v), (bottom, v)
            for times in (wall, cpu):
                per_round = [x / y for x, y in zip(times.get(a, []), times.get(b, []), strict=False)]
                cells.append(f"{statistics.median(per_round):.2f}" if per_round else "-")
        print(f"| {title} | " + " | ".join(cells) + f" | {target} |")
    for title, name, target in seconds:
        cells = [f"{med[(name, v)]:.2f}" if (name, v) in med else "-" for v in versions]
        print(f"| {title} | " + " | ".join(cells) + f" | {target} |")
    for name in ("python -c pass", "import typer, typer.rich_utils", "imports of a run"):
        print(f"| {name}, s | {med[(name, 'new')]:.2f} | |")
    for name in memory_small:
        cells = [f"{small_rss[(name, v)]:.0f} -> {rss[(name, v)]:.0f} MB ({rss[(name, v)] / small_rss[(name, v)]:.2f}x)"
                 for v in versions]  # fmt: skip
        print(f"| peak RSS {name}, small -> large | " + " | ".join(cells) + " | <= 350 MB, <= 1.1x |")
    print(f"\nverdicts: 10k healthy {verdict(healthy)}, 10k correct {verdict(correct)}, large dump {verdict(big)}")


if __name__ == "__main__":
    main()
