"""The sweep's cost against one ``rcdiag analyze --rs token_k1`` in the same run, and its peak memory.

    python benchmarks/sweep.py --tokens 100M --rounds 3

Each round times, in turn: ``analyze --rs token_k1``, the default sweep (every option, default grids,
recommendations) and the same with ``--no-recommend``; the report gives medians over rounds and the ratios to
analyze (target: the default sweep at most 3x). Peak RSS (``ru_maxrss``) of each sweep is measured
in a fresh process, on this dump and, with ``--small``, on a smaller one, to show it stays flat.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _data import dump, parse_tokens
from _methods import analyze_token_k1, sweep_default
from memory import peak

from rcdiag.constants import DEFAULT_CHUNK_TOKENS


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
    times: dict[str, list[float]] = {name: [] for name in methods}
    tokens = 0
    for _ in range(args.rounds):
        for name, run in methods.items():
            start = time.perf_counter()
            tokens = run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["analyze --rs token_k1"])
    print(f"{tokens / 1e6:.1f}M tokens, chunk {chunk:,}, {args.rounds} rounds (median seconds, ratio to analyze)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:26s} {median:7.2f} s  {median / base:5.2f}x")
    paths = [dump(parse_tokens(args.small))] if args.small else []
    for where in [*paths, path]:
        for method, extra in (("sweep_default", ", False"), ("sweep_default", "")):
            read, mb = peak(method, where, chunk, extra)
            what = "--no-recommend" if extra else "default"
            print(f"  peak RSS, sweep {what:21s} {read / 1e6:6.1f}M tokens: {mb:6.0f} MB")


if __name__ == "__main__":
    main()
