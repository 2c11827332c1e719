"""Throughput: rcdiag end to end against the I/O floor and the padded approach, measured side by side.

    python benchmarks/throughput.py --tokens 100M --rounds 3

Each round times every method once, in turn (interleaved, so load on a shared machine hits all of them); the
report gives medians over rounds, in million tokens per second, and the ratios within the same run. The padded
baseline is slow, so it reads only the first ``--padded-tokens`` of the dump (throughput does not depend on
file size). A GPU row is added when torch sees a CUDA device.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

from _data import dump, parse_tokens
from _methods import io_floor, padded, rcdiag_e2e

from rcdiag.constants import DEFAULT_CHUNK_TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="100M", help="dump size (default 100M)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    parser.add_argument("--padded-tokens", default="10M", help="tokens the padded baseline reads (0 = skip it)")
    args = parser.parse_args()
    path = dump(parse_tokens(args.tokens))
    padded_tokens = parse_tokens(args.padded_tokens)
    methods = {
        "io_floor": lambda: io_floor(path, args.chunk_tokens),
        "rcdiag": lambda: rcdiag_e2e(path, args.chunk_tokens),
    }
    if padded_tokens:
        methods["padded"] = lambda: padded(path, args.chunk_tokens, padded_tokens)
    if _cuda():
        methods["rcdiag_cuda"] = lambda: rcdiag_e2e(path, args.chunk_tokens, device="cuda")
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB, chunk {args.chunk_tokens:,} tokens, {args.rounds} rounds")
    print(f"machine: {platform.processor() or platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}")
    medians = interleaved(methods, args.rounds)
    print("\nratios (same run):")
    print(f"  rcdiag / io_floor = {medians['rcdiag'] / medians['io_floor']:.2f}   (target >= 0.7)")
    if "padded" in medians:
        print(f"  rcdiag / padded   = {medians['rcdiag'] / medians['padded']:.1f}x  (target >= 10x)")
    if "rcdiag_cuda" in medians:
        print(f"  cuda / cpu        = {medians['rcdiag_cuda'] / medians['rcdiag']:.2f}")


def interleaved(methods: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Time every method (returning the tokens it read) once per round, in turn; print each time and the medians
    (M tokens/s), and return the medians."""
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for round_ in range(rounds):
        for name, method in methods.items():
            start = time.perf_counter()
            tokens = method()
            seconds = time.perf_counter() - start
            rates[name].append(tokens / seconds / 1e6)
            print(f"  round {round_ + 1}: {name:12s} {tokens / seconds / 1e6:7.1f} M tok/s ({seconds:.1f} s)")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print("\nmedian M tok/s (min-max):")
    for name, values in rates.items():
        print(f"  {name:12s} {medians[name]:7.1f} ({min(values):.1f}-{max(values):.1f})")
    return medians


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    main()
