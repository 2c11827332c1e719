"""The cost of token ids under ``analyze --explain``: the by-token breakdown against plain analyze.

    python benchmarks/explain_tokens.py --tokens 10M --rounds 5 [--vocab 151936] [--baseline TREE]

The benchmark dump (``_data.dump``) is copied with a ``token_ids`` column (``list<int32>``, Zipf-distributed ids
over ``--vocab`` ids, as a real vocabulary's frequencies fall off; written as ``DumpWriter`` writes: zstd,
pyarrow's defaults). Four runs of ``rcdiag.analyze`` (``is_rs``):

* ``plain``: the file with ids, the id column not read (what ``analyze`` does);
* ``plain, reading ids``: the same, the id column read and screened as ``--explain`` reads it, then unused (the
  floor of any use of the ids: their decode);
* ``explain, no ids``: ``--explain`` on the file without ids;
* ``explain, with ids``: ``--explain`` on the file with ids (the by-token breakdown).

Each source tree (this one, and ``--baseline TREE``: an older tree from ``git archive COMMIT | tar -x``) runs in a
process of its own that stays up, kernels compiled and one warm-up run of each case done before timing. Each
round runs every case in every tree in turn (interleaved, so load on a shared machine hits all alike); the report
gives medians over rounds of wall time and of CPU time of all threads, the median over rounds of each round's
ratio (the runs it compares were close in time), the load average before and after, and each case's peak RSS (a
fresh process, this tree).

``--kernels``: the ids' part of the explain pass alone, on the dump's arrays in memory (blocks of 512 rows): the
explain pass without ids, with ids added inside it (now), and without ids followed by 5ceb9b2's separate passes
over the block (the ids' range, then this tree's stand-alone scatter), interleaved, medians over rounds, the tables
checked equal bit for bit. Each tree (this one, and ``--baseline TREE``) runs in a process of its own, the trees
interleaved too; with a baseline, the last line compares what the ids add inside the explain pass in each (median
over rounds of each round's difference).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _data import dump, parse_tokens

BENCH = Path(__file__).resolve().parent
CASES = {
    "plain": ("ids", False, False),
    "plain, reading ids": ("ids", False, True),
    "explain, no ids": ("plain", True, False),
    "explain, with ids": ("ids", True, False),
}
"""Case: (which file, ``--explain``, read the id column without ``--explain``)."""
RATIOS = [
    ("explain, with ids", "plain"),
    ("explain, with ids", "plain, reading ids"),
    ("explain, with ids", "explain, no ids"),
    ("explain, no ids", "plain"),
    ("plain, reading ids", "plain"),
]

WORKER = """
import json, sys, time
sys.path.insert(0, {bench!r})
import rcdiag
from rcdiag.io.table_source import TableSource
from _methods import CONFIG

want_tokens = TableSource.want_tokens
force = [False]
TableSource.want_tokens = lambda self, wanted: want_tokens(self, wanted or force[0])
for line in sys.stdin:
    path, explain, read_ids = json.loads(line)
    force[0] = read_ids
    start, start_cpu = time.perf_counter(), time.process_time()
    tokens = rcdiag.analyze(path, CONFIG, explain=explain).input.tokens
    print(json.dumps([time.perf_counter() - start, time.process_time() - start_cpu, tokens]), flush=True)
"""
"""A tree's measuring process: one ``[path, explain, read_ids]`` per line in, ``[wall, cpu, tokens]`` out."""

PEAK = """
import resource, sys
sys.path.insert(0, {bench!r})
import rcdiag
from rcdiag.io.table_source import TableSource
from _methods import CONFIG
want_tokens = TableSource.want_tokens
TableSource.want_tokens = lambda self, wanted: want_tokens(self, wanted or {read_ids})
rcdiag.analyze({path!r}, CONFIG, explain={explain})
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def with_ids(path: Path, vocab: int, seed: int = 0) -> Path:
    """``path`` with a ``token_ids`` column (cached next to it)."""
    out = path.with_name(f"{path.stem}_ids{vocab}.parquet")
    if out.exists():
        return out
    rng = np.random.default_rng(seed)
    file = pq.ParquetFile(path)
    writer = None
    try:
        for group in range(file.num_row_groups):
            table = file.read_row_group(group)
            lists = table.column("old_log_prob").combine_chunks()
            n = len(lists.values)
            ids = (rng.zipf(1.2, n) - 1) % vocab
            offsets = pa.array(np.asarray(lists.offsets, dtype=np.int32))
            table = table.append_column("token_ids", pa.ListArray.from_arrays(offsets, pa.array(ids.astype(np.int32))))
            if writer is None:
                writer = pq.ParquetWriter(out, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=table.num_rows)
    finally:
        if writer is not None:
            writer.close()
    return out


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


class Worker:
    """A source tree's measuring process (``WORKER``)."""

    def __init__(self, tree: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER.format(bench=str(BENCH))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(tree),
            cwd=tree,
        )

    def time(self, path: Path, explain: bool, read_ids: bool) -> tuple[float, float, int]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps([str(path), explain, read_ids]) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the measuring process stopped (exit {self.process.wait()})")
        wall, cpu, tokens = json.loads(line)
        return wall, cpu, tokens

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def peak(tree: Path, path: Path, explain: bool, read_ids: bool) -> float:
    code = PEAK.format(bench=str(BENCH), path=str(path), explain=explain, read_ids=read_ids)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_env(tree))
    return float(done.stdout.strip().splitlines()[-1])


KERNELS = """
import hashlib, json, sys, time
import numpy as np
import pyarrow.parquet as pq
from rcdiag.explain.breakdowns import LOG_PROB_THRESHOLDS
from rcdiag.explain.state import ExplainState
try:  # where a tree declares the pass's constants (rcdiag.explain.state before the detectors ran by default)
    from rcdiag.explain.detector_state import _EDGES, _LOG_LIKELY, _LOG_UNLIKELY
except ImportError:
    from rcdiag.explain.state import _EDGES, _LOG_LIKELY, _LOG_UNLIKELY
from rcdiag.explain.statistics import RATIO_CAP, SHIFT_TOL
from rcdiag.kernels.explain import explain_block
from rcdiag.kernels.token_ids import scatter_token_sums, valid_range

table = pq.read_table({path!r}, columns=["old_log_prob", "rollout_log_prob", "response_mask", "token_ids"])
lists = [table.column(i).combine_chunks() for i in range(4)]
old, rollout = (np.asarray(lists[i].values, dtype=np.float32) for i in (0, 1))
mask = np.asarray(lists[2].values).astype(bool).view(np.uint8)
ids = np.asarray(lists[3].values, dtype=np.int32)
offsets = np.asarray(lists[0].offsets, dtype=np.int64)
lengths = np.diff(offsets)
valid = np.add.reduceat(mask.astype(np.int64), offsets[:-1])
vocab = int(ids.max()) + 1
no_ids, no_table = np.zeros(0, np.int64), np.zeros((0, 6))

def run(mode):
    state, sums = ExplainState(), np.zeros((vocab, 6))
    start = time.perf_counter()
    for a in range(0, lengths.shape[0], 512):
        t0, t1 = offsets[a], offsets[min(a + 512, lengths.shape[0])]
        tokens, out = (ids[t0:t1], sums) if mode == "inside" else (no_ids, no_table)
        explain_block(
            old[t0:t1], rollout[t0:t1], valid[a : a + 512], lengths[a : a + 512], mask[t0:t1], _EDGES,
            LOG_PROB_THRESHOLDS, RATIO_CAP, SHIFT_TOL, state.breakdowns.prob, state.breakdowns.position,
            state.breakdowns.length, state.scale.sums, state.offset.sums, _LOG_UNLIKELY, _LOG_LIKELY,
            state.shape.sums, tokens, out,
        )
        if mode == "separate":
            block_ids = ids[t0:t1].astype(np.int64)  # 5ceb9b2 widened the ids
            valid_range(block_ids, mask[t0:t1])
            scatter_token_sums(old[t0:t1], rollout[t0:t1], block_ids, mask[t0:t1], sums)
    ns = (time.perf_counter() - start) / ids.shape[0] * 1e9
    return ns, hashlib.sha256(sums.tobytes()).hexdigest() if mode != "no ids" else ""

for line in sys.stdin:
    print(json.dumps(run(json.loads(line))), flush=True)
"""
"""A tree's ``--kernels`` process: one mode (``"no ids"``, ``"inside"``, ``"separate"``) per line in, ``[ns a token,
the by-token table's digest]`` out."""
MODES = ("no ids", "inside", "separate")


def kernels(path: Path, rounds: int, trees: dict[str, Path]) -> None:
    """``--kernels`` (see the module's docstring)."""
    workers = {
        tree: subprocess.Popen(
            [sys.executable, "-c", KERNELS.format(path=str(path))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=_env(root), cwd=root,
        )
        for tree, root in trees.items()
    }  # fmt: skip

    def ask(tree: str, mode: str) -> tuple[float, str]:
        worker = workers[tree]
        assert worker.stdin is not None
        assert worker.stdout is not None
        worker.stdin.write(json.dumps(mode) + "\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        if not line:
            raise SystemExit(f"the {tree} tree's kernel process stopped (exit {worker.wait()})")
        ns, digest = json.loads(line)
        return ns, digest

    times: dict[tuple[str, str], list[float]] = {}
    try:
        digests = {(tree, mode): ask(tree, mode)[1] for tree in trees for mode in MODES}  # compiles, warms
        if len({digest for (_, mode), digest in digests.items() if mode != "no ids"}) != 1:
            raise SystemExit(f"the ways gave different tables: {digests}")
        for _ in range(rounds):
            for mode in MODES:
                for tree in trees:
                    times.setdefault((tree, mode), []).append(ask(tree, mode)[0])
    finally:
        for worker in workers.values():
            if worker.stdin is not None:
                worker.stdin.close()
            worker.wait()
    median = {key: statistics.median(seconds) for key, seconds in times.items()}
    print(f"load average {os.getloadavg()}")
    for tree in trees:
        print(f"{tree}: ns a token: " + ", ".join(f"{mode} {median[tree, mode]:.1f}" for mode in MODES))
        inside, separate = (median[tree, mode] - median[tree, "no ids"] for mode in MODES[1:])
        print(f"{tree}: the ids add {inside:.1f} ns a token inside the explain pass, {separate:.1f} in separate passes")
    if "old" in trees:
        added = {
            tree: [a - b for a, b in zip(times[tree, "inside"], times[tree, "no ids"], strict=True)] for tree in trees
        }
        print(f"inside the explain pass, median over rounds: the ids add {statistics.median(added['new']):.1f} ns a "
              f"token here, {statistics.median(added['old']):.1f} in the baseline")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="10M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--baseline", default="", help="a source tree of the code to compare with (git archive)")
    parser.add_argument("--kernels", action="store_true", help="the ids' part of the explain pass alone")
    args = parser.parse_args()
    paths = {"plain": dump(parse_tokens(args.tokens))}
    paths["ids"] = with_ids(paths["plain"], args.vocab)
    trees = {"new": BENCH.parent} | ({"old": Path(args.baseline).resolve()} if args.baseline else {})
    if args.kernels:
        kernels(paths["ids"], args.rounds, trees)
        return
    load_before = os.getloadavg()
    workers = {name: Worker(tree) for name, tree in trees.items()}
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    tokens = 0
    try:
        for worker in workers.values():  # compile and warm every case (and the page cache) first
            for file, explain, read_ids in CASES.values():
                worker.time(paths[file], explain, read_ids)
        for round_ in range(args.rounds):
            for case, (file, explain, read_ids) in CASES.items():
                for tree, worker in workers.items():
                    seconds, cpu_seconds, tokens = worker.time(paths[file], explain, read_ids)
                    wall.setdefault((tree, case), []).append(seconds)
                    cpu.setdefault((tree, case), []).append(cpu_seconds)
                    print(f"  round {round_ + 1}: {tree:3s} {case:20s} {seconds:.2f} s", flush=True)
    finally:
        for worker in workers.values():
            worker.close()
    load_after = os.getloadavg()
    result: dict[str, object] = {"tokens": tokens, "vocab": args.vocab, "rounds": args.rounds}
    result["load_average"] = {"before": load_before, "after": load_after}
    for (tree, case), seconds in wall.items():
        result[f"{tree}: {case}"] = {
            "seconds": statistics.median(seconds),
            "cpu_ns_per_token": statistics.median(cpu[tree, case]) / tokens * 1e9,
        }
    for case, (file, explain, read_ids) in CASES.items():
        result[f"new: {case}"]["peak_rss_mb"] = peak(trees["new"], paths[file], explain, read_ids)  # type: ignore[index]
    ratios = {}
    for tree in trees:
        for a, b in RATIOS:
            per_round = [x / y for x, y in zip(wall[tree, a], wall[tree, b], strict=True)]
            cpu_round = [x / y for x, y in zip(cpu[tree, a], cpu[tree, b], strict=True)]
            ratios[f"{tree}: {a} / {b}"] = {"wall": statistics.median(per_round), "cpu": statistics.median(cpu_round)}
    result["ratios"] = ratios
    print(json.dumps(result, indent=1))
    for name, ratio in ratios.items():
        print(f"{name:60s} {ratio['wall']:.2f}x wall, {ratio['cpu']:.2f}x CPU")


if __name__ == "__main__":
    main()
