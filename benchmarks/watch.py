"""``rcdiag watch`` live: how long after DumpWriter's ``write`` returns the step's line arrives, and the watch's
memory (RSS) as steps accumulate.

This process writes ``--steps`` steps of about ``--tokens-per-step`` tokens each with ``DumpWriter``, one every
``--interval`` seconds, while ``rcdiag watch DIR --format json --poll P`` runs in a subprocess; each line's arrival
is timed against its write and the watch's VmRSS read from /proc at that moment.

    python benchmarks/watch.py --tokens-per-step 1M --steps 20 --interval 2
    python benchmarks/watch.py --tokens-per-step 2k --steps 1000 --interval 0   # memory over 1,000 steps
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import parse_tokens

ROOT = Path(__file__).resolve().parents[1]


def step_rows(rng: np.random.Generator, tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows of about 1,000 tokens (lognormal lengths) summing to about ``tokens``; rollout = old + N(0, 0.02)."""
    lengths = np.clip(rng.lognormal(np.log(1000), 0.9, max(1, tokens // 1000 * 2)), 16, 16384).astype(np.int64)
    lengths = lengths[: max(1, int(np.searchsorted(np.cumsum(lengths), tokens)) + 1)]
    old = [-np.abs(rng.normal(0, 1.5, n)).astype(np.float32) for n in lengths]
    rollout = [np.minimum(o + rng.normal(0, 0.02, o.size).astype(np.float32), 0) for o in old]
    return old, rollout


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens-per-step", default="1M")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between steps")
    parser.add_argument("--poll", type=float, default=0.1)
    args = parser.parse_args()
    tokens = parse_tokens(args.tokens_per_step)

    from rcdiag.writer import DumpWriter

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="rcdiag-watch-bench-") as scratch:
        run = Path(scratch) / "run"
        writer = DumpWriter(run)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "rcdiag", "watch", str(run), "--state", f"{scratch}/state.json", "--format",
                   "json", "--poll", str(args.poll), "--max-idle", str(max(5.0, 3 * args.interval))]  # fmt: skip
        watch = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        arrived: dict[int, tuple[float, float]] = {}

        def read() -> None:
            assert watch.stdout is not None
            for line in watch.stdout:
                arrived[json.loads(line)["step"]] = (time.monotonic(), rss_mib(watch.pid))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(3.0)  # the watch's start-up (imports, kernels from numba's cache)
        written: dict[int, float] = {}
        for step in range(args.steps):
            old, rollout = step_rows(rng, tokens)
            writer.write(step=step, old_log_prob=old, rollout_log_prob=rollout)
            written[step] = time.monotonic()
            time.sleep(args.interval)
        watch.wait()
        reader.join()
    latency = np.array([arrived[s][0] - written[s] for s in written if s in arrived])
    rss = [arrived[s][1] for s in sorted(arrived)]
    print(f"steps written {len(written)}, reported {len(arrived)}; ~{tokens:,} tokens per step, poll {args.poll} s")
    print(
        f"latency (write returned -> line read): median {np.median(latency):.3f} s, p90 "
        f"{np.percentile(latency, 90):.3f} s, max {latency.max():.3f} s"
    )
    marks = sorted({0, len(rss) // 10, len(rss) // 2, len(rss) - 1})
    print("watch RSS (MiB) at step " + ", ".join(f"{m}: {rss[m]:.0f}" for m in marks))


if __name__ == "__main__":
    main()
