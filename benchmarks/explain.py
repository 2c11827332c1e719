"""The cost of ``analyze --explain``: its time and peak memory against plain ``analyze`` on the same dump.

    python benchmarks/explain.py --tokens 25M,100M --rounds 3

On the largest dump, each round times plain analyze and analyze --explain once each, in turn (interleaved, so
load on a shared machine hits both); the report gives medians over rounds and the ratio explain / plain within
the same run (target: at most 1.5), and the same ratio of CPU time (all threads of the process: the work added,
whatever the machine's load). Peak RSS (``ru_maxrss``) of both is measured in a fresh process on every dump size
(targets: explain's peak within 1.1x of plain's, and flat as the dump grows).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _data import dump, parse_tokens
from _methods import rcdiag_e2e, rcdiag_explain
from memory import peak

from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="25M,100M", help="dump sizes, comma-separated (default 25M,100M)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    args = parser.parse_args()
    paths = [dump(parse_tokens(size)) for size in args.tokens.split(",")]
    path = paths[-1]
    methods = {"plain": rcdiag_e2e, "explain": rcdiag_explain}
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB, chunk {args.chunk_tokens:,} tokens, {args.rounds} rounds")
    tokens = 0
    for round_ in range(args.rounds):
        for name, method in methods.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens = method(path, args.chunk_tokens)
            seconds[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            took = seconds[name][-1]
            print(f"  round {round_ + 1}: {name:8s} {tokens / took / 1e6:7.1f} M tok/s ({took:.1f} s)")
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    ratios = [e / p for e, p in zip(seconds["explain"], seconds["plain"], strict=True)]
    print(f"\nmedian seconds: plain {medians['plain']:.2f}, explain {medians['explain']:.2f}")
    print(
        f"explain / plain time = {medians['explain'] / medians['plain']:.2f} (per round: "
        f"{', '.join(f'{r:.2f}' for r in ratios)}; target <= 1.5)"
    )
    cpu_ratio = statistics.median(cpu["explain"]) / statistics.median(cpu["plain"])
    print(f"explain / plain CPU time (all threads) = {cpu_ratio:.2f}")
    print("\npeak RSS (fresh process each):")
    for size, dump_path in zip(args.tokens.split(","), paths, strict=True):
        _, plain_rss = peak("rcdiag_e2e", dump_path, args.chunk_tokens)
        _, explain_rss = peak("rcdiag_explain", dump_path, args.chunk_tokens)
        print(f"  {size:>6s}: plain {plain_rss:.0f} MB, explain {explain_rss:.0f} MB ({explain_rss / plain_rss:.2f}x)")


if __name__ == "__main__":
    main()
