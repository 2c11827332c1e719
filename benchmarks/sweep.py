"""The sweep's cost against one ``rcdiag analyze --rs token_k1`` in the same run, and its peak memory.

    python benchmarks/sweep.py --tokens 100M --rounds 3

Each round times, in turn: ``analyze --rs token_k1``, the default sweep (every option, default grids,
recommendations) and the same with ``--no-recommend``; the report gives medians over rounds of the wall time and
of the process CPU time (both threads: the reader decodes in the background), and their ratios to analyze
(target: the default sweep at most 3x). On a loaded machine the CPU-time ratio is the steadier one. Peak RSS
(``ru_maxrss``) of each sweep is measured in a fresh process, on this dump and, with ``--small``, on a smaller
one, to show it stays flat.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _data import dump, parse_tokens
from _methods import analyze_token_k1, sweep_default
from memory import peak

from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="100M", help="dump size (default 100M)")
    parser.add_argument("--small", default="", help="a smaller dump size for the memory growth (e.g. 5M)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    args = parser.parse_args()
    path, chunk = dump(parse_tokens(args.tokens)), args.chunk_tokens
    methods = {
        "analyze --rs token_k1": lambda: analyze_token_k1(path, chunk),
        "sweep (default)": lambda: sweep_default(path, chunk),
        "sweep --no-recommend": lambda: sweep_default(path, chunk, recommend=False),
    }
    wall: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    tokens = 0
    for _ in range(args.rounds):
        for name, run in methods.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens = run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    base, base_cpu = statistics.median(wall["analyze --rs token_k1"]), statistics.median(cpu["analyze --rs token_k1"])
    print(f"{tokens / 1e6:.1f}M tokens, chunk {chunk:,}, {args.rounds} rounds (medians; ratios to analyze)")
    print(f"  {'':26s} {'wall s':>8s} {'ratio':>6s} {'CPU s':>8s} {'ratio':>6s}")
    for name in methods:
        median, median_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"  {name:26s} {median:8.2f} {median / base:5.2f}x {median_cpu:8.2f} {median_cpu / base_cpu:5.2f}x")
    paths = [dump(parse_tokens(args.small))] if args.small else []
    for where in [*paths, path]:
        for method, extra in (("sweep_default", ", False"), ("sweep_default", "")):
            read, mb = peak(method, where, chunk, extra)
            what = "--no-recommend" if extra else "default"
            print(f"  peak RSS, sweep {what:21s} {read / 1e6:6.1f}M tokens: {mb:6.0f} MB")


if __name__ == "__main__":
    main()
