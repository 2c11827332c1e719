"""Start-up time of the CLI: what a user waits for ``rcdiag --help``, measured as it is run (a fresh process).

    python benchmarks/startup.py --repeats 5

Each command runs ``--repeats`` times in a fresh ``python -m rcdiag`` subprocess; the report gives the median and
the range, next to a bare ``python -c pass`` in the same run (the interpreter's own start-up, which rcdiag cannot
go below). Nothing is warmed up beyond what the previous run left in the OS page cache, as for a user typing the
commands one after another.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "rcdiag --version": ["-m", "rcdiag", "--version"],
    "rcdiag --help": ["-m", "rcdiag", "--help"],
    "rcdiag analyze --help": ["-m", "rcdiag", "analyze", "--help"],
}


def timings(args: list[str], repeats: int) -> list[float]:
    """Wall time of ``repeats`` runs of ``python *args``, seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def startup(args: list[str], repeats: int = 5) -> float:
    """Median wall time of ``rcdiag *args``, seconds."""
    return statistics.median(timings(["-m", "rcdiag", *args], repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"median of {args.repeats} fresh processes (min-max), seconds")
    for name, argv in COMMANDS.items():
        times = timings(argv, args.repeats)
        print(f"  {name:24s} {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f})")


if __name__ == "__main__":
    main()
