"""What the exact match (issue 35: JSON ``exact``, verdict ``identical``) costs every analyze, measured in one run.

    git archive BASE | tar -x -C /tmp/base      # the code before exact match (BASE: the commit this branch left)
    python benchmarks/exact.py --tokens 20M --rounds 5 --baseline /tmp/base

Every figure is CPU time of all threads (``time.process_time``: it hardly moves with other load on a shared
machine, unlike wall time), the least of ``--repeats`` runs, in a fresh process per source tree and round; the
trees alternate within each round, and the table gives medians over rounds and the median of each round's ratio.

* ``engine``: the engine alone over the dump's screened chunks held in memory, verl's default configuration (what
  the counting adds where nothing else hides it). This tree feeds the exact-match accumulator as every analyze
  does (``rcdiag.sections.exact.ExactState``: rows numbered, each block's per-row counts added up); the token
  pass counts each row's differing bits, ulps and first position in every tree of this code, so the ``engine,
  no section`` row (this tree without the accumulator) shows the section's own share and the baseline tree the
  whole cost, the kernel's counting included.
* ``analyze``: ``rcdiag.analyze(dump)`` end to end (decode, screen, engine, report), as a user runs it.

Without ``--baseline`` only this tree's rows are printed.
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

CHILD = r"""
import json, sys, time
import rcdiag
from rcdiag.engine.stream import Engine
from rcdiag.io import open_dump
from rcdiag.io.screen import Screen

path, repeats = sys.argv[1], int(sys.argv[2])
try:
    from rcdiag.sections.exact import ExactState
except ImportError:  # the baseline: no exact match
    ExactState = None
chunks = list(Screen()(open_dump(path).chunks(1 << 20)))
tokens = sum(c.n_tokens for c in chunks)
resolved = rcdiag.CorrectionConfig().resolve()

def fresh():  # chunks numbered by the engine itself when a whole-dump accumulator reads them
    for c in chunks:
        c.rows = None
    return chunks

def best(run):
    run()  # untimed: kernels loaded, pages touched
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times) / tokens * 1e9

out = {"tokens": tokens, "engine, no section": best(lambda: Engine(resolved).run(fresh()))}
if ExactState is not None:
    out["engine"] = best(lambda: Engine(resolved, wholes=[ExactState()]).run(fresh()))
    report = rcdiag.analyze(path)
    assert "exact" in report.to_dict()
else:
    out["engine"] = out.pop("engine, no section")
out["analyze"] = best(lambda: rcdiag.analyze(path))
print(json.dumps(out))
"""

ROWS = ("engine", "engine, no section", "analyze")


def measure(tree: Path, path: Path, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(repeats)], capture_output=True, text=True, env=env, cwd=tree
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="20M", help="dump size (default 20M; its chunks are held in memory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure in each process (the least counts)")
    parser.add_argument("--baseline", default="", help="a source tree of the code before exact match (git archive)")
    args = parser.parse_args()
    path = dump(parse_tokens(args.tokens))
    trees = {"new": Path(__file__).resolve().parent.parent}
    if args.baseline:
        trees["old"] = Path(args.baseline).resolve()
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            rounds[name].append(measure(tree, path, args.repeats))
    tokens = rounds["new"][0]["tokens"]
    print(
        f"{tokens / 1e6:.1f}M tokens; CPU ns per token, least of {args.repeats} runs, median of {args.rounds} rounds\n"
    )
    print("| figure | this tree | baseline | ratio, median of rounds (min-max) |\n|---|---|---|---|")
    for row in ROWS:
        new = [r[row] for r in rounds["new"] if row in r]
        if row == "engine, no section":  # this tree's own share of the section: the engine with it against this
            ratios = [r["engine"] / r[row] for r in rounds["new"]]
            print(f"| {row} | {statistics.median(new):.2f} | | engine / this: {_spread(ratios)} |")
            continue
        old = [r[row] for r in rounds.get("old", []) if row in r]
        ratios = [a / b for a, b in zip(new, old, strict=True)]
        base = f"{statistics.median(old):.2f}" if old else ""
        print(f"| {row} | {statistics.median(new):.2f} | {base} | {_spread(ratios) if ratios else ''} |")


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


if __name__ == "__main__":
    main()
