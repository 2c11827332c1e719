"""The bias detectors by default (issue 34 item 1): a default ``analyze`` that runs them, against the plain analyze
of the code before (``--baseline TREE``, e.g. ``git archive main | tar -x -C /tmp/main``), in one run.

    python benchmarks/default_detectors.py --tokens 20M,100M --rounds 5 --baseline /tmp/main

Budget: the default analyze with the detectors at most 1.3x the baseline's plain analyze, wall and CPU time, at each
size. Each tree runs in a process of its own (kept for the whole run, so neither pays its imports or numba's cache
load per run); rounds are interleaved (every method once per round, in turn), after one untimed warm-up run of each
(page cache, numba's cache); medians over rounds. CPU time is the worker process's (``time.process_time``: all its
threads, the reader's included). The methods, each ``rcdiag.analyze(path, config)`` in its tree:

* ``baseline``: the baseline tree's plain analyze (what "today's plain analyze" was);
* ``baseline, no signatures``: the same with the signature statistics taken out of every batch (the analyze before
  issue 34 added them; ``benchmarks/signatures.py`` measures that cost alone), for the record;
* ``detectors``: this tree's default analyze (the detectors' sums taken by the explain pass without its breakdowns);
* ``no detectors``: this tree's analyze with the detectors' section left out (what they cost here).

The machine's load average is printed before the run and after each round: on a shared machine read the ratios,
which interleaving protects, not the seconds.

``--kernels``: the pass alone, in this process, over the first 5,000 responses of the smallest dump held in memory
(blocks of 512 responses): the detectors' sums (``DetectorState.update``) against ``--explain``'s whole pass
(``ExplainState``'s, without the worst list), CPU ns per valid token, the least of ``--rounds`` runs each,
interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _data import dump, parse_tokens

BENCH = Path(__file__).resolve().parent

WORKER = r"""
import contextlib, json, sys, time
import rcdiag
from rcdiag.metrics import batch

CONFIGS = {"default": rcdiag.CorrectionConfig(),
           "is_rs": rcdiag.CorrectionConfig(rollout_is="sequence", rollout_is_threshold=2.0,
                                            rollout_rs="token_k1,seq_mean_k1",
                                            rollout_rs_threshold="0.5_2.0,0.999_1.001")}


@contextlib.contextmanager
def without_signatures():
    groups = batch.BatchMetrics.groups
    batch.BatchMetrics.groups = lambda self: [g for g in groups(self) if g is not getattr(self, "signatures", None)]
    try:
        yield
    finally:
        batch.BatchMetrics.groups = groups


@contextlib.contextmanager
def without_detectors():
    from rcdiag.explain.detector_section import DetectorSection
    new_state = DetectorSection.new_state
    DetectorSection.new_state = lambda self: None  # the section keeps no state: nothing is taken
    try:
        yield
    finally:
        DetectorSection.new_state = new_state


MODES = {"plain": contextlib.nullcontext, "no signatures": without_signatures, "no detectors": without_detectors}

for line in sys.stdin:
    mode, path, config = json.loads(line)
    with MODES[mode]():
        wall, cpu = time.perf_counter(), time.process_time()
        report = rcdiag.analyze(path, CONFIGS[config])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    codes = sorted(f.code for f in report.findings)
    print(json.dumps([wall, cpu, report.input.tokens, codes]), flush=True)
"""
"""A tree's worker: ``[mode, path, config]`` per line in, ``[wall s, CPU s, tokens, finding codes]`` out."""

METHODS = {
    "baseline": ("base", "plain"),
    "baseline, no signatures": ("base", "no signatures"),
    "detectors": ("new", "plain"),
    "no detectors": ("new", "no detectors"),
}
"""Each method: (tree, the worker's mode)."""


class Worker:
    """One tree's process."""

    def __init__(self, root: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(root))
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root
        )

    def run(self, mode: str, path: Path, config: str) -> tuple[float, float, int, list[str]]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps([mode, str(path), config]) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"a worker stopped (exit {self.process.wait()})")
        wall, cpu, tokens, codes = json.loads(line)
        return wall, cpu, tokens, codes

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def measure(path: Path, rounds: int, config: str, workers: dict[str, Worker]) -> None:
    print(f"\n{path.name} ({path.stat().st_size / 1e6:.0f} MB), config {config}; load average before: {load()}")
    for name, (tree, mode) in METHODS.items():  # warm-up: page cache, numba's cache
        _, _, tokens, codes = workers[tree].run(mode, path, config)
        print(f"  warm-up {name:24s} {tokens:,} tokens, findings {codes}")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in METHODS}
    for round_ in range(rounds):
        for name, (tree, mode) in METHODS.items():
            wall, cpu, _, _ = workers[tree].run(mode, path, config)
            times[name].append((wall, cpu))
        print(f"  round {round_ + 1}: " + ", ".join(f"{n} {t[-1][0]:.2f} s" for n, t in times.items())
              + f"; load average {load()}")  # fmt: skip
    median = {name: [statistics.median(t[i] for t in values) for i in (0, 1)] for name, values in times.items()}
    print("  median (wall s, CPU s): " + ", ".join(f"{n} {w:.2f}/{c:.2f}" for n, (w, c) in median.items()))
    base = median["baseline"]
    for name in ("detectors", "no detectors", "baseline, no signatures"):
        wall, cpu = median[name]
        per_round = [a[0] / b[0] for a, b in zip(times[name], times["baseline"], strict=True)]
        print(f"  {name} / baseline: wall {wall / base[0]:.3f}, CPU {cpu / base[1]:.3f} (wall per round: "
              f"{', '.join(f'{r:.2f}' for r in per_round)})")  # fmt: skip
    bare = median["baseline, no signatures"]
    wall, cpu = median["detectors"]
    print(f"  detectors / baseline without signatures: wall {wall / bare[0]:.3f}, CPU {cpu / bare[1]:.3f}")


def kernels(path: Path, rounds: int) -> None:
    """``--kernels`` (see the module's docstring)."""
    import time

    import numpy as np
    import pyarrow.parquet as pq

    from rcdiag.explain.detector_state import DetectorState
    from rcdiag.explain.state import ExplainState
    from rcdiag.metrics.backend import NumpyBackend
    from rcdiag.metrics.block import Block

    table = pq.read_table(path, columns=["old_log_prob", "rollout_log_prob", "response_mask"]).slice(0, 5000)
    lists = [table.column(i).combine_chunks() for i in range(3)]
    old, rollout = (np.asarray(lists[i].values, dtype=np.float32) for i in (0, 1))
    mask = np.asarray(lists[2].values).astype(bool)
    offsets = np.asarray(lists[0].offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    valid = np.add.reduceat(mask.astype(np.int64), offsets[:-1])
    blocks = []
    for a in range(0, lengths.shape[0], 512):
        b = min(a + 512, lengths.shape[0])
        t0, t1 = offsets[a], offsets[b]
        blocks.append(Block(NumpyBackend(), old[t0:t1], rollout[t0:t1], valid[a:b], mask=mask[t0:t1],
                            raw_lengths=lengths[a:b]))  # fmt: skip
    passes = {
        "detectors": lambda: [DetectorState().update(block) for block in blocks],
        "explain": lambda: [ExplainState()._fold_sums(block) for block in blocks],
    }
    best = dict.fromkeys(passes, float("inf"))
    for run in passes.values():  # compiles, warms
        run()
    for _ in range(rounds):
        for name, run in passes.items():
            start = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - start)
    tokens = int(valid.sum())
    print(f"{tokens:,} valid tokens; load average {load()}")
    for name, seconds in best.items():
        print(f"  {name:9s} {seconds / tokens * 1e9:.2f} CPU ns a valid token (least of {rounds})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="20M,100M", help="dump sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--config", default="default", choices=("default", "is_rs"))
    parser.add_argument("--baseline", help="a source tree of the code before (git archive); needed but for --kernels")
    parser.add_argument("--kernels", action="store_true", help="time the detectors' pass alone (see above)")
    args = parser.parse_args()
    paths = [dump(parse_tokens(size)) for size in args.tokens.split(",")]
    if args.kernels:
        kernels(paths[0], args.rounds)
        return
    if not args.baseline:
        parser.error("--baseline TREE is needed (git archive main | tar -x -C TREE)")
    workers = {"base": Worker(Path(args.baseline).resolve()), "new": Worker(BENCH.parent)}
    try:
        for path in paths:
            measure(path, args.rounds, args.config, workers)
    finally:
        for worker in workers.values():
            worker.close()


if __name__ == "__main__":
    main()
