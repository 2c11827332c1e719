"""The cost of token ids under ``analyze --explain``: the by-token breakdown against ``--explain`` without ids.

    python benchmarks/explain_tokens.py --tokens 10M --rounds 3 [--vocab 151936]

The benchmark dump (``_data.dump``) is copied with a ``token_ids`` column (``list<int32>``, Zipf-distributed ids
over ``--vocab`` ids, as a real vocabulary's frequencies fall off). Each round times, in turn (interleaved, so load
on a shared machine hits all three): plain analyze of the file with ids (the id column is not read), analyze
--explain of the file without ids, and analyze --explain of the file with ids; medians over rounds, and CPU time of
all threads. Peak RSS of each is measured in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _data import dump, parse_tokens
from _methods import CONFIG

import rcdiag


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


def run(path: Path, explain: bool) -> int:
    return rcdiag.analyze(path, CONFIG, explain=explain).input.tokens


PEAK = """
import resource, sys
sys.path.insert(0, {bench!r})
import rcdiag
from _methods import CONFIG
rcdiag.analyze({path!r}, CONFIG, explain={explain})
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def peak(path: Path, explain: bool) -> float:
    code = PEAK.format(bench=str(Path(__file__).parent), path=str(path), explain=explain)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="10M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args()
    plain_path = dump(parse_tokens(args.tokens))
    ids_path = with_ids(plain_path, args.vocab)
    cases = {
        "plain (file with ids)": (ids_path, False),
        "explain, no ids": (plain_path, True),
        "explain, with ids": (ids_path, True),
    }
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    run(ids_path, True)  # compile every kernel first
    tokens = 0
    for round_ in range(args.rounds):
        for name, (path, explain) in cases.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens = run(path, explain)
            seconds[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            print(f"  round {round_ + 1}: {name:22s} {seconds[name][-1]:.2f} s")
    result = {}
    for name in cases:
        result[name] = {
            "seconds": statistics.median(seconds[name]),
            "cpu_ns_per_token": statistics.median(cpu[name]) / tokens * 1e9,
            "peak_rss_mb": peak(*cases[name]),
        }
    print(json.dumps({"tokens": tokens, "vocab": args.vocab, **result}, indent=1))
    with_ids_s, without_s = result["explain, with ids"]["seconds"], result["explain, no ids"]["seconds"]
    print(f"explain with ids / without: {with_ids_s / without_s:.2f}x time; "
          f"explain with ids / plain: {with_ids_s / result['plain (file with ids)']['seconds']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
