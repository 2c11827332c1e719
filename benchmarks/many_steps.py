"""The cost of a distinct training step (issue 32): the same rows as one step each and all in one step, measured in
one run:

    python benchmarks/many_steps.py --rows 100k --length 10 --rounds 3 [--format table|json] [--baseline TREE]

Two dumps of ``--rows`` responses of ``--length`` tokens each (the same log-probs, seeded; zstd Parquet) differ only
in their ``step`` column: ``many`` gives every response its own step, ``one`` gives them all step 0. Each round runs
a fresh ``python -m rcdiag analyze -q DUMP --format FORMAT`` (stdout to /dev/null) on both, interleaved (load on a
shared machine hits both alike), after one untimed warm-up of each (kernels cached, files in the page cache). The table
gives the medians, the ratio many / one (issue 32's target: within 3x) and the cost per distinct step, (many - one)
/ rows. ``--baseline TREE`` (a ``git archive COMMIT | tar -x`` of older code) runs the same commands from that tree
too, interleaved with this one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _data import DATA, parse_tokens

ROOT = Path(__file__).resolve().parents[1]


def dumps(rows: int, length: int, seed: int = 0) -> dict[str, Path]:
    """The ``many`` (a step per row) and ``one`` (one step) dumps of the same rows, cached under ``DATA``."""
    out = {name: DATA / f"steps_{name}_{rows}x{length}_{seed}.parquet" for name in ("many", "one")}
    if all(path.exists() for path in out.values()):
        return out
    DATA.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = rows * length
    old = -np.abs(rng.normal(0, 1.5, n)).astype(np.float32)
    rollout = np.minimum(old + rng.normal(0, 0.02, n).astype(np.float32), 0.0)
    offsets = pa.array(np.arange(0, n + 1, length, dtype=np.int32))
    columns = {
        "old_log_prob": pa.ListArray.from_arrays(offsets, pa.array(old)),
        "rollout_log_prob": pa.ListArray.from_arrays(offsets, pa.array(rollout)),
        "response_mask": pa.ListArray.from_arrays(offsets, pa.array(np.ones(n, np.int8))),
    }
    for name, steps in (("many", np.arange(rows, dtype=np.int64)), ("one", np.zeros(rows, dtype=np.int64))):
        tmp = out[name].with_suffix(".tmp")
        pq.write_table(pa.table({**columns, "step": pa.array(steps)}), tmp, compression="zstd")
        tmp.replace(out[name])
    return out


def fresh(argv: list[str], tree: str | None) -> float:
    """Wall seconds of one fresh process run from ``tree`` (default: this checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = tree or str(ROOT)
    env["RCDIAG_COMPILE_NOTICE"] = "0"
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tree or ROOT)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="100k", help="responses in each dump (steps in the many-step dump)")
    parser.add_argument("--length", type=int, default=10, help="tokens per response")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--format", default="table", choices=("table", "json"), help="the report rendered")
    parser.add_argument("--baseline", default="", help="a source tree of older code, run interleaved")
    args = parser.parse_args()
    rows = parse_tokens(args.rows)
    paths = dumps(rows, args.length)
    trees = {"new": None, **({"old": args.baseline} if args.baseline else {})}

    def argv(path: Path) -> list[str]:
        return [sys.executable, "-m", "rcdiag", "analyze", "-q", str(path), "--format", args.format]

    for tree in trees.values():
        for path in paths.values():
            fresh(argv(path), tree)  # warm-up
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            for name, path in paths.items():
                times.setdefault((label, name), []).append(fresh(argv(path), tree))
    med = {key: statistics.median(values) for key, values in times.items()}
    load = os.getloadavg()[0]
    print(
        f"{rows:,} responses of {args.length} tokens, --format {args.format}, {args.rounds} rounds, "
        f"load average {load:.1f}\n"
    )
    print("| tree | one step | a step per row | many / one | per distinct step |")
    print("|---|---|---|---|---|")
    for label in trees:
        one, many = med[(label, "one")], med[(label, "many")]
        per_step = (many - one) / rows * 1e3
        print(f"| {label} | {one:.2f} s | {many:.2f} s | {many / one:.2f}x | {per_step:.3f} ms |")


if __name__ == "__main__":
    main()
