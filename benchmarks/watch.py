"""``rcdiag watch`` live: how long after DumpWriter's ``write`` returns the step's line arrives, and the watch's
memory (RSS) as steps accumulate.

This process writes ``--steps`` steps of about ``--tokens-per-step`` tokens each with ``DumpWriter``, one every
``--interval`` seconds, while ``rcdiag watch DIR --format json --poll P`` runs in a subprocess; each line's arrival
is timed against its write and the watch's VmRSS read from /proc at that moment. With ``--catch-up`` every step is
written first, then ``watch --once`` reads them: the time between two lines is the watch's work between them, a
file (read, step line, commit) or a whole report (rebuilt every 5 s while catching up, after every file when live).

    python benchmarks/watch.py --tokens-per-step 1M --steps 20 --interval 2    # latency at 1M-token steps
    python benchmarks/watch.py --tokens-per-step 2k --row-tokens 250 --steps 1000 --catch-up  # per file, memory
    python benchmarks/watch.py ... --root /path/to/another/rcdiag              # the same run on another checkout
"""

from __future__ import annotations

import argparse
import itertools
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


def step_rows(
    rng: np.random.Generator, tokens: int, row_tokens: int = 1000
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows of about ``row_tokens`` tokens (lognormal lengths) summing to about ``tokens``; rollout = old +
    N(0, 0.02)."""
    draws = max(1, tokens // row_tokens * 2)
    lengths = np.clip(rng.lognormal(np.log(row_tokens), 0.9, draws), 16, 16384).astype(np.int64)
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
    parser.add_argument("--catch-up", action="store_true", help="write every step first, then watch --once")
    parser.add_argument("--row-tokens", type=int, default=1000, help="a row's typical length (lognormal)")
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--root", type=Path, default=ROOT, help="the rcdiag source tree the watch runs (default: this)")
    args = parser.parse_args()
    tokens = parse_tokens(args.tokens_per_step)

    from rcdiag.io.dump_writer import DumpWriter

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="rcdiag-watch-bench-") as scratch:
        run = Path(scratch) / "run"
        writer = DumpWriter(run)
        written: dict[int, float] = {}

        def write(step: int) -> None:
            old, rollout = step_rows(rng, tokens, args.row_tokens)
            writer.write(step=step, old_log_prob=old, rollout_log_prob=rollout)
            written[step] = time.monotonic()

        if args.catch_up:
            for step in range(args.steps):
                write(step)
        env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
        command = [sys.executable, "-m", "rcdiag", "watch", str(run), "--state", f"{scratch}/state.json", "--format",
                   "json", "--poll", str(args.poll), "--settle", "0",
                   *(["--once"] if args.catch_up else ["--max-idle", str(max(5.0, 3 * args.interval))])]  # fmt: skip
        watch = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=scratch)  # not ours: --root
        lines: list[tuple[str, int, float, float]] = []
        """Each line: its kind, step, arrival and the watch's RSS then."""

        def read() -> None:
            assert watch.stdout is not None
            for line in watch.stdout:
                event = json.loads(line)
                lines.append((event["kind"], event["step"], time.monotonic(), rss_mib(watch.pid)))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if not args.catch_up:
            time.sleep(3.0)  # the watch's start-up (imports, kernels from numba's cache)
            for step in range(args.steps):
                write(step)
                time.sleep(args.interval)
        watch.wait()
        reader.join()
    steps = {step: (at, rss) for kind, step, at, rss in lines if kind == "step"}
    rss = [steps[s][1] for s in sorted(steps)]
    print(f"rcdiag from {args.root}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print(
        f"steps written {len(written)}, reported {len(steps)}; ~{tokens:,} tokens per step in rows of ~"
        f"{args.row_tokens:,}, poll {args.poll} s"
    )
    if not args.catch_up:
        latency = np.array([steps[s][0] - written[s] for s in written if s in steps])
        print(
            f"latency (write returned -> line read): median {np.median(latency):.3f} s, p90 "
            f"{np.percentile(latency, 90):.3f} s, max {latency.max():.3f} s (step 0, loading the kernels: "
            f"{latency[0]:.3f} s)"
        )
    else:  # each gap between two lines is the work between them: a file (read, lines, commit) or a whole report
        gaps = [(kind, step, at - prior[2]) for prior, (kind, step, at, _) in itertools.pairwise(lines)]
        files = [(step, gap) for kind, step, gap in gaps if kind == "step"]
        reports = [(step, gap) for kind, step, gap in gaps if kind == "report"]
        for name, part in (("first", files[:100]), ("last", files[-100:])):
            cost = np.array([gap for _, gap in part])
            print(
                f"per file, {name} 100 (steps {part[0][0]}-{part[-1][0]}): median {np.median(cost) * 1e3:.1f} ms, "
                f"p90 {np.percentile(cost, 90) * 1e3:.1f} ms"
            )
        print("whole report (every 5 s while catching up), s at step: " + ", ".join(
            f"{step}: {gap:.2f}" for step, gap in reports))  # fmt: skip
    marks = sorted({0, len(rss) // 10, len(rss) // 4, len(rss) // 2, 3 * len(rss) // 4, len(rss) - 1})
    print("watch RSS (MiB) at step " + ", ".join(f"{m}: {rss[m]:.0f}" for m in marks))
    if len(rss) > 200:
        late = slice(len(rss) // 10, None)
        slope = np.polyfit(np.arange(len(rss))[late], np.array(rss)[late], 1)[0]
        print(f"RSS growth from step {len(rss) // 10} on: {slope * 1024:.1f} KiB per step (least squares)")


if __name__ == "__main__":
    main()
