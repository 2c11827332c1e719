"""Scale-out: ``--ray`` on a local Ray instance against ``--workers N`` and one process, measured side by side.

    python benchmarks/scale_out.py --tokens 100M --cpus 2 --rounds 3

Ray is started once (``ray.init(num_cpus=N)``) before the rounds; its start-up is printed apart, since a
cluster is started once for many runs. Each round times every method once, in turn (interleaved, so load on a
shared machine hits all of them); the report gives medians in million tokens per second and the ratio
``ray / workers`` within the same run (the issue's target: at least 0.8). Needs ``pip install "rcdiag[ray]"``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from _data import dump, parse_tokens
from _methods import CONFIG
from throughput import interleaved

import rcdiag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="100M", help="dump size (default 100M)")
    parser.add_argument("--cpus", type=int, default=2, help="Ray CPUs and --workers processes (default 2)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import ray

    path = dump(parse_tokens(args.tokens))
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB; machine: {platform.machine()}, {os.cpu_count()} CPUs")
    start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    print(f"ray.init(num_cpus={args.cpus}): {time.perf_counter() - start:.1f} s (once per cluster, not timed below)")
    methods = {
        "one_process": lambda: rcdiag.analyze(path, CONFIG).input.tokens,
        f"workers_{args.cpus}": lambda: rcdiag.analyze(path, CONFIG, workers=args.cpus).input.tokens,
        "ray": lambda: rcdiag.analyze(path, CONFIG, ray=True).input.tokens,
    }
    medians = interleaved(methods, args.rounds)
    workers = medians[f"workers_{args.cpus}"]
    print(f"\nratios (same run):\n  ray / workers_{args.cpus} = {medians['ray'] / workers:.2f}   (target >= 0.8)")
    print(f"  workers_{args.cpus} / one_process = {workers / medians['one_process']:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
