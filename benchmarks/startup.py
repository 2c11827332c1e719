"""Start-up time of the CLI: what a user waits for ``rcdiag --help`` or a small run, measured as it is run (a fresh
process).

    python benchmarks/startup.py --repeats 5 [--baseline TREE] [--small]

Each command runs ``--repeats`` times in a fresh ``python -m rcdiag`` subprocess, the commands in turn (interleaved,
so load on a shared machine hits all of them alike), after one untimed warm-up round; the report gives the median
and the range, next to a bare ``python -c pass`` (the interpreter's own start-up, which rcdiag cannot go below) and
``import typer, typer.rich_utils`` (what typer's help needs before rcdiag does anything), with the CPU time each
process spent beside its wall time. ``--baseline TREE`` (a
``git archive COMMIT | tar -x`` of older code) runs every rcdiag command from that tree too, interleaved with this
one. Each command runs with its tree as the working directory and first on ``PYTHONPATH`` (``python -m`` puts the
working directory first on ``sys.path``: run from this checkout, the baseline would run this code), with byte-code
caching on, as installed. ``--small`` adds a cached ``rcdiag analyze`` of a 10k-token dump (the issue's small run;
generated on first use, kernels warmed by the warm-up round), and the same run split in one process where the
command calls the library (``PHASES``), in more interleaved rounds.
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
    "import typer": ["-c", "import typer"],
    "import typer, typer.rich_utils": ["-c", "import typer, typer.rich_utils"],
    "import typer, typer._adapters": ["-c", "import typer, typer._adapters"],
}
"""Reference points that import no rcdiag: run once, not per tree. ``typer._adapters`` is what typer 0.29 imports to
validate an option's value (pydantic): a run pays it, help no longer does."""
PHASES = """
import sys, time
start = time.perf_counter()
marks = {}


class Handover:
    def find_spec(self, name, path=None, target=None):
        if name in ("rcdiag.api", "numpy", "pyarrow"):
            marks.setdefault("library", time.perf_counter())
        return None


sys.meta_path.insert(0, Handover())
import rcdiag.cli.output as output
emit = output.Output.emit


def timed(*args, **kwargs):
    marks.setdefault("render", time.perf_counter())
    return emit(*args, **kwargs)


output.Output.emit = timed
sys.argv = ["rcdiag", *sys.argv[1:]]
from rcdiag.cli import main
try:
    main()
except SystemExit:
    pass
end = time.perf_counter()
print(marks["library"] - start, marks["render"] - marks["library"], end - marks["render"], file=sys.stderr)
"""
"""``rcdiag analyze`` in one process, split where the command first imports the library (``rcdiag.api``, or numpy or
pyarrow, which reading the flags into a ``ReadOptions`` loads) and where it starts writing the report: the command
line before (typer, the option checks, rcdiag's CLI modules), the library (its imports, the dump read, the kernels,
the analysis), and the report rendered and written. The interpreter's own start-up (``python -c pass``) precedes
all three."""
COMMANDS = {
    "rcdiag --version": ["-m", "rcdiag", "--version"],
    "rcdiag --help": ["-m", "rcdiag", "--help"],
    "rcdiag analyze --help": ["-m", "rcdiag", "analyze", "--help"],
    "rcdiag presets": ["-m", "rcdiag", "presets"],
}


def measured(args: list[str], tree: Path = HERE) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one ``python *args`` from ``tree`` (a failure is fatal). CPU
    time moves less than wall time with the load of a shared machine."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(tree)}
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, cwd=tree, env=env)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def run(args: list[str], tree: Path = HERE) -> float:
    """Wall seconds of one ``python *args`` from ``tree``."""
    return measured(args, tree)[0]


def timings(args: list[str], repeats: int) -> list[float]:
    """Wall time of ``repeats`` runs of ``python *args``, seconds."""
    return [run(args) for _ in range(repeats)]


def startup(args: list[str], repeats: int = 5) -> float:
    """Median wall time of ``rcdiag *args``, seconds."""
    return statistics.median(timings(["-m", "rcdiag", *args], repeats))


def phases(args: list[str], tree: Path, repeats: int) -> list[tuple[float, float, float]]:
    """``repeats`` runs of ``rcdiag *args`` from ``tree``, each split into ``PHASES``' three parts, seconds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(tree)}
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", PHASES, *args], capture_output=True, text=True, cwd=tree, env=env)
        cli, library, after = (float(x) for x in done.stderr.split()[-3:])
        runs.append((cli, library, after))
    return runs


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
    cpu: dict[tuple[str, str], list[float]] = {(name, version): [] for name, _, version, _ in jobs}
    for _ in range(args.repeats):
        for name, argv, version, tree in jobs:
            seconds, cpu_seconds = measured(argv, tree)
            wall[(name, version)].append(seconds)
            cpu[(name, version)].append(cpu_seconds)
    print(f"median of {args.repeats} fresh processes (min-max), seconds, interleaved after a warm-up round;")
    print(f"1-minute load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; {os.cpu_count()} CPUs")
    print("\n".join(f"  {version}: {tree}" for version, tree in trees.items()))
    print(f"  {'command':36s} {'wall':20s} cpu (user + system)")
    for job, times in wall.items():
        label = f"{job[0]} ({job[1]})" if job[1] and len(trees) > 1 else job[0]
        spent = cpu[job]
        print(f"  {label:36s} {statistics.median(times):.3f} ({min(times):.3f}-{max(times):.3f})"
              f"  {statistics.median(spent):.3f} ({min(spent):.3f}-{max(spent):.3f})")  # fmt: skip
    if args.small:
        print("\n  rcdiag analyze 10k tokens, split (medians, seconds): before the library call | the call | after")
        argv = commands["rcdiag analyze 10k tokens"][2:]
        split: dict[str, list[tuple[float, float, float]]] = {version: [] for version in trees}
        for _ in range(args.repeats):
            for version, tree in trees.items():
                split[version] += phases(argv, tree, 1)
        for version, runs in split.items():
            cli, library, after = (statistics.median(part) for part in zip(*runs, strict=True))
            print(f"  {version:36s} {cli:.3f} | {library:.3f} | {after:.3f}")


if __name__ == "__main__":
    main()
