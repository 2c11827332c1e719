"""The small-dump path's threshold (issue 26, ``rcdiag.kernels.small.SMALL_DUMP_BYTES``), measured in one run:

    python benchmarks/small_path.py --tokens 2M --rounds 5 [--baseline TREE]

* per token, in-process: ``rcdiag.accumulate`` of the same dump on the numba kernels and on the numpy path (kernels
  loaded beforehand; rounds interleaved, medians), the decode included in both; the ratio and the difference;
* numba's fixed cost per process: a fresh ``python -m rcdiag analyze`` of a 10k-token dump forced to the kernels
  (``RCDIAG_SMALL_DUMP_BYTES=0``, cached) minus the same on the numpy path; and the same forced run on an empty numba
  cache (a fresh machine: the kernels compile);
* the break-even: the fixed cost over the per-token difference, in tokens and in bytes of this dump's Parquet;
* end to end on the 10k-token dump, cached and on an empty numba cache each run: ``analyze``, ``analyze --explain``
  and the default ``sweep``, this tree's default (the numpy path) and, with ``--baseline TREE`` (a source tree of
  older code, ``git archive COMMIT | tar -x``), the older code, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data import DATA, dump, parse_tokens

import rcdiag
import rcdiag.io.synthetic as synthetic
from rcdiag.kernels.small import SWITCH
from rcdiag.metrics.backend import NumpyBackend

ROOT = Path(__file__).resolve().parents[1]


def tiny(tokens: int = 10_000) -> Path:
    """A ``tokens``-token dump (about) of the synthetic ``healthy`` scenario (generated on first use)."""
    out = DATA / f"tiny_healthy_{tokens}.parquet"
    if not out.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        table = synthetic.generate("healthy", rows=tokens // 200, steps=2, median_length=200, max_length=400)
        synthetic.write(table, out)
    return out


def in_process(path: Path, compiled: bool) -> float:
    start = time.perf_counter()
    rcdiag.accumulate(path, device=NumpyBackend(compiled=compiled))
    return time.perf_counter() - start


def fresh(argv: list[str], tree: str | None = None, cache: str | None = None, **env: str) -> float:
    """Wall seconds of one fresh process; ``cache``: its numba cache directory (default: the usual one)."""
    full = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | env
    full["PYTHONPATH"] = tree or str(ROOT)
    full["RCDIAG_COMPILE_NOTICE"] = "0"
    if cache is not None:
        full["NUMBA_CACHE_DIR"] = cache
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=full, cwd=tree or ROOT)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return wall


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="2M", help="the dump for the per-token costs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default="", help="a source tree of older code for the end-to-end rows")
    parser.add_argument("--no-cli", action="store_true", help="leave out the end-to-end rows")
    parser.add_argument("--cli-only", action="store_true", help="only the end-to-end rows")
    args = parser.parse_args()
    if args.cli_only:
        cli(tiny(), args.rounds, args.baseline or None)
        return
    big, small = dump(parse_tokens(args.tokens)), tiny()
    tokens = rcdiag.accumulate(big).state.tokens
    in_process(big, True), in_process(big, False)  # kernels loaded, files in the page cache
    python = sys.executable
    analyze = [python, "-m", "rcdiag", "analyze", "-q", str(small)]
    fresh(analyze, **{SWITCH: "0"})  # the kernels in numba's cache
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        times.setdefault("compiled", []).append(in_process(big, True))
        times.setdefault("numpy", []).append(in_process(big, False))
        times.setdefault("10k compiled", []).append(fresh(analyze, **{SWITCH: "0"}))
        times.setdefault("10k numpy", []).append(fresh(analyze))
        with tempfile.TemporaryDirectory() as cache:
            times.setdefault("10k compiled, empty cache", []).append(fresh(analyze, cache=cache, **{SWITCH: "0"}))
    med = {k: median(v) for k, v in times.items()}
    per_compiled, per_numpy = med["compiled"] / tokens * 1e9, med["numpy"] / tokens * 1e9
    fixed, fixed_cold = med["10k compiled"] - med["10k numpy"], med["10k compiled, empty cache"] - med["10k numpy"]
    extra = per_numpy - per_compiled
    bytes_per_token = big.stat().st_size / tokens
    load = os.getloadavg()[0]
    print(f"{tokens:,} tokens ({bytes_per_token:.1f} bytes a token), {args.rounds} rounds, load average {load:.1f}\n")
    print("| what | median |")
    print("|---|---|")
    print(f"| in-process, kernels | {med['compiled']:.3f} s ({per_compiled:.1f} ns a token) |")
    print(f"| in-process, numpy path | {med['numpy']:.3f} s ({per_numpy:.1f} ns a token) |")
    print(f"| numpy path / kernels | {med['numpy'] / med['compiled']:.2f}x (+{extra:.1f} ns a token) |")
    print(f"| 10k analyze, kernels forced (cached) | {med['10k compiled']:.3f} s |")
    print(f"| 10k analyze, numpy path | {med['10k numpy']:.3f} s |")
    print(f"| 10k analyze, kernels forced, empty cache | {med['10k compiled, empty cache']:.3f} s |")
    print(f"| numba's fixed cost per process: cached, compiling | {fixed:.3f} s, {fixed_cold:.3f} s |")
    if extra > 0:
        even = fixed / (extra * 1e-9)
        print(f"| break-even (cached kernels) | {even / 1e6:.1f}M tokens, {even * bytes_per_token / 2**20:.0f} MiB |")
    else:
        print("| break-even | none: the numpy path was not slower a token in this run |")
    if not args.no_cli:
        cli(small, args.rounds, args.baseline or None)


def cli(small: Path, rounds: int, baseline: str | None) -> None:
    """End to end on the 10k-token dump: cached and empty-cache runs of analyze, --explain and sweep."""
    python = sys.executable
    commands = {
        "analyze": [python, "-m", "rcdiag", "analyze", "-q", str(small)],
        "analyze --explain": [python, "-m", "rcdiag", "analyze", "-q", "--explain", str(small)],
        "sweep": [python, "-m", "rcdiag", "sweep", "-q", str(small)],
    }
    trees = {"new": None, **({"old": baseline} if baseline else {})}
    for argv in commands.values():
        for tree in trees.values():
            fresh(argv, tree)  # warm-up: kernels cached, files in the page cache
    times: dict[tuple[str, str, str], list[float]] = {}
    for number in range(rounds):
        for name, argv in commands.items():
            for label, tree in trees.items():
                times.setdefault((name, label, "cached"), []).append(fresh(argv, tree))
                with tempfile.TemporaryDirectory() as cache:
                    times.setdefault((name, label, "empty cache"), []).append(fresh(argv, tree, cache))
        done = ", ".join(f"{' '.join(key)} {values[-1]:.2f}" for key, values in times.items())
        print(f"round {number + 1} (load average {os.getloadavg()[0]:.1f}): {done}", flush=True)
    print(f"\n10k-token dump, end to end, medians of {rounds} (load average {os.getloadavg()[0]:.1f})\n")
    kinds = ("cached", "empty cache")
    print("| command | " + " | ".join(f"{label}, {kind}" for label in trees for kind in kinds) + " |")
    print("|---|" + "---|" * (2 * len(trees)))
    for name in commands:
        cells = [f"{median(times[(name, label, kind)]):.2f} s" for label in trees for kind in kinds]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
