"""The slices section's cost: every analyze keeps each response's numbers for the ``replica`` test (issue 34), and
``--by`` adds the per-slice table (issue 35), measured in one run against the same analyze without the section.

    python benchmarks/slices.py --tokens 20M --rounds 3

``without`` is ``rcdiag.analyze`` with the slices section replaced by one that keeps nothing (what analyze
computed before), ``with`` today's analyze, and ``--by step`` the table by the dump's step column (one value per
512 responses); verl's default configuration. Rounds are interleaved (load on a shared machine hits all three),
medians reported, and the ratios against ``without``, wall and CPU time of this process.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, ClassVar

from _data import dump, parse_tokens

import rcdiag
from rcdiag.sections.base import PlainSection


class NoSlices(PlainSection):
    """Takes the slices section's place and keeps nothing."""

    KEY: ClassVar[str] = "slices"

    def new_state(self) -> None:
        return None

    def record(self, state: Any, run: Any) -> None:
        return None


def timed(path: Path, how: str) -> tuple[float, float]:
    options: dict[str, Any] = {"without": {"sections": [NoSlices()]}, "with": {}}.get(how, {})
    if how == "by":
        options = {"columns": rcdiag.ColumnMap(by=("step",))}
    wall, cpu = time.perf_counter(), time.process_time()
    rcdiag.analyze(path, **options)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="20M")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = dump(parse_tokens(args.tokens))
    ways = ("without", "with", "by")
    for how in ways:  # warm-up: page cache, numba's cache
        timed(path, how)
    times: dict[str, list[tuple[float, float]]] = {how: [] for how in ways}
    for _ in range(args.rounds):
        for how in ways:
            times[how].append(timed(path, how))
    medians = {how: [statistics.median(t[i] for t in times[how]) for i in (0, 1)] for how in ways}
    base = medians["without"]
    print(f"{args.tokens} tokens, {args.rounds} rounds (medians)")
    for how in ways:
        wall, cpu = medians[how]
        ratios = f"ratio {wall / base[0]:.3f} wall, {cpu / base[1]:.3f} CPU"
        print(f"{how:8s} {wall:6.2f} s wall {cpu:6.2f} s CPU   {ratios}")


if __name__ == "__main__":
    main()
