"""The signature statistics' cost (issue 34's budget: a default analyze with its judgement at most 1.3x the plain
analyze it replaced), measured in one run against the same analyze without them.

    python benchmarks/signatures.py --tokens 20M --rounds 3

``without`` is ``rcdiag.analyze`` with ``SignatureMetrics`` taken out of every batch (what analyze computed before
issue 34), ``with`` is today's analyze; both verl's default configuration and the realistic IS/RS one. Rounds are
interleaved (load on a shared machine hits both), medians reported, and the ratio with / without, wall and CPU time
of this process.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from _data import dump, parse_tokens
from _methods import CONFIG

import rcdiag
from rcdiag.metrics import batch


@contextlib.contextmanager
def without_signatures() -> Iterator[None]:
    groups = batch.BatchMetrics.groups

    def fewer(self: batch.BatchMetrics) -> list:
        return [g for g in groups(self) if g is not self.signatures]

    batch.BatchMetrics.groups = fewer  # type: ignore[method-assign]
    try:
        yield
    finally:
        batch.BatchMetrics.groups = groups  # type: ignore[method-assign]


def timed(path: Path, config: rcdiag.CorrectionConfig, signatures: bool) -> tuple[float, float]:
    context = contextlib.nullcontext() if signatures else without_signatures()
    with context:
        wall, cpu = time.perf_counter(), time.process_time()
        rcdiag.analyze(path, config)
        return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="20M")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = dump(parse_tokens(args.tokens))
    configs = {"default": rcdiag.CorrectionConfig(), "is_rs": CONFIG}
    for config in configs.values():  # warm-up: page cache, numba's cache
        timed(path, config, True)
    times: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name, config in configs.items():
            for signatures in (False, True):
                times.setdefault((name, signatures), []).append(timed(path, config, signatures))
    print(f"{args.tokens} tokens, {args.rounds} rounds (medians)")
    for name in configs:
        off = [statistics.median(t[i] for t in times[(name, False)]) for i in (0, 1)]
        on = [statistics.median(t[i] for t in times[(name, True)]) for i in (0, 1)]
        print(
            f"{name:8s} without {off[0]:6.2f} s wall {off[1]:6.2f} s CPU   with {on[0]:6.2f} s wall {on[1]:6.2f} s CPU"
            f"   ratio {on[0] / off[0]:.3f} wall, {on[1] / off[1]:.3f} CPU"
        )


if __name__ == "__main__":
    main()
