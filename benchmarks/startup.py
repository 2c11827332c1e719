"""Start-up time of the CLI: what a user waits for ``rcdiag --help`` or a small run, measured as it is run (a fresh
process).

    python benchmarks/startup.py --repeats 5 [--baseline TREE] [--small]

Each command runs ``--repeats`` times in a fresh ``python -m rcdiag`` subprocess, the commands in turn (interleaved,
so load on a shared machine hits all of them alike), after one untimed warm-up round; the report gives the median
and the range, next to a bare ``python -c pass`` (the interpreter's own start-up, which rcdiag cannot go below) and
``import typer, typer.rich_utils`` (what typer's help needs before rcdiag does anything). ``--baseline TREE`` (a
``git archive COMMIT | tar -x`` of older code) runs every rcdiag command from that tree too, interleaved with this
one. Each command runs with its tree as the working directory and first on ``PYTHONPATH`` (``python -m`` puts the
working directory first on ``sys.path``: run from this checkout, the baseline would run this code), with byte-code
caching on, as installed. ``--small`` adds a cached ``rcdiag analyze`` of a 10k-token dump (the issue's small run;
generated on first use, kernels warmed by the warm-up round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PLAIN = {
    "python -c pass": ["-c", "pass"],
    "import typer, typer.rich_utils": ["-c", "import typer, typer.rich_utils"],
}
"""Reference points that import no rcdiag: run once, not per tree."""
COMMANDS = {
    "rcdiag --version": ["-m", "rcdiag", "--version"],
    "rcdiag --help": ["-m", "rcdiag", "--help"],
    "rcdiag analyze --help": ["-m", "rcdiag", "analyze", "--help"],
    "rcdiag presets": ["-m", "rcdiag", "presets"],
}


def run(args: list[str], tree: Path = HERE) -> float:
    """Wall seconds of one ``python *args`` from ``tree`` (a failure is fatal)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, cwd=tree, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return wall


def timings(args: list[str], repeats: int) -> list[float]:
    """Wall time of ``repeats`` runs of ``python *args``, seconds."""
    return [run(args) for _ in range(repeats)]


def startup(args: list[str], repeats: int = 5) -> float:
    """Median wall time of ``rcdiag *args``, seconds."""
    return statistics.median(timings(["-m", "rcdiag", *args], repeats))


def small_dump() -> Path:
    """The 10k-token dump of ``benchmarks/cli_end_to_end.py`` (generated on first use)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cli_end_to_end import tiny

    return tiny("healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", default="", help="a source tree of older code to compare with (git archive)")
    parser.add_argument("--small", action="store_true", help="also a cached analyze of a 10k-token dump")
    args = parser.parse_args()
    commands = dict(COMMANDS)
    if args.small:
        commands["rcdiag analyze 10k tokens"] = ["-m", "rcdiag", "analyze", "-q", str(small_dump())]
    trees = {"new": HERE} | ({"old": Path(args.baseline).resolve()} if args.baseline else {})
    jobs = [(name, argv, "", HERE) for name, argv in PLAIN.items()]
    jobs += [(name, argv, version, tree) for name, argv in commands.items() for version, tree in trees.items()]
    load = os.getloadavg()[0]
    for _, argv, _, tree in jobs:  # warm-up: byte-code, page cache, numba's kernel cache
        run(argv, tree)
    wall: dict[tuple[str, str], list[float]] = {(name, version): [] for name, _, version, _ in jobs}
    for _ in range(args.repeats):
        for name, argv, version, tree in jobs:
            wall[(name, version)].append(run(argv, tree))
    print(f"median of {args.repeats} fresh processes (min-max), seconds, interleaved after a warm-up round;")
    print(f"1-minute load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {os.cpu_count()} CPUs")
    print("\n".join(f"  {version}: {tree}" for version, tree in trees.items()))
    for (name, version), times in wall.items():
        label = f"{name} ({version})" if version and len(trees) > 1 else name
        print(f"  {label:36s} {statistics.median(times):.3f} ({min(times):.3f}-{max(times):.3f})")


if __name__ == "__main__":
    main()
