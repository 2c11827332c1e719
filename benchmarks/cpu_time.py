"""Where the CPU time goes: nanoseconds of CPU (all threads) per token for each stage, one stage at a time.

    python benchmarks/cpu_time.py --tokens 20M --repeats 3

Stages: the bare decode (``decode``, the floor of benchmarks/throughput.py), rcdiag's reader (decode plus the
conversion to chunks), the value screen, and the engine's maths for verl's default configuration and for the
realistic one (``is_rs``), each also with the bias detectors every analyze runs (``DetectorState``) and with
``--explain``, over chunks held in memory. CPU time (``time.process_time``)
hardly moves with other load on the machine, unlike wall time, so these figures explain the ratios of
throughput.py: on two cores, rcdiag's wall time can go no lower than the sum of its stages' CPU time divided by
two.
"""

from __future__ import annotations

import argparse
import time

from _data import dump, parse_tokens
from _methods import CONFIG, decode

import rcdiag
from rcdiag.engine.stream import Engine
from rcdiag.explain.detector_state import DetectorState
from rcdiag.explain.state import ExplainState
from rcdiag.io import open_dump
from rcdiag.io.screen import Screen
from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS


def best_cpu(run, repeats: int) -> float:
    """The least CPU time of ``repeats`` runs, seconds."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="20M", help="dump size (default 20M; its chunks are held in memory)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    args = parser.parse_args()
    path, chunk = dump(parse_tokens(args.tokens)), args.chunk_tokens
    chunks = list(open_dump(path).chunks(chunk))
    screened = list(Screen()(chunks))
    tokens = sum(c.n_tokens for c in chunks)
    stages = {
        "decode (the floor)": lambda: decode(path),
        "rcdiag reader (decode + chunks)": lambda: sum(1 for _ in open_dump(path).chunks(chunk)),
        "screen": lambda: list(Screen()(chunks)),
        "engine, default configuration": lambda: Engine(rcdiag.CorrectionConfig().resolve()).run(screened),
        "engine, default configuration + detectors": lambda: Engine(
            rcdiag.CorrectionConfig().resolve(), wholes=[DetectorState()]
        ).run(screened),
        "engine, is_rs": lambda: Engine(CONFIG.resolve()).run(screened),
        "engine, is_rs + detectors": lambda: Engine(CONFIG.resolve(), wholes=[DetectorState()]).run(screened),
        "engine, is_rs --explain": lambda: Engine(CONFIG.resolve(), wholes=[ExplainState()]).run(screened),
    }
    print(f"{tokens / 1e6:.1f}M tokens, chunk {chunk:,}; least CPU time of {args.repeats} runs, all threads\n")
    print("| stage | CPU ns per token |\n|---|---|")
    for name, run in stages.items():
        print(f"| {name} | {best_cpu(run, args.repeats) / tokens * 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
