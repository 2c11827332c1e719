"""Throughput: rcdiag end to end against a bare Parquet decode, and the new features against their budgets, in one run.

    python benchmarks/throughput.py --tokens 100M --rounds 3

The floor is ``decode``: pyarrow reading each row group with its threads and flattening the three list columns,
nothing else. ``scan_sum`` is the benchmark's former floor (a batch scan that also sums every value in float64),
kept as a second reference. One warm-up round runs every method once (it also brings the dump into the page
cache), then each round times every method once, in turn (interleaved, so load on a shared machine hits all of
them); the report gives medians over rounds in million tokens per second, and the ratios within this run:

* ``rcdiag`` (verl's default configuration) and ``rcdiag is_rs`` (``--is sequence --is-threshold 2.0
  --rs token_k1,seq_mean_k1 --rs-threshold 0.5_2.0,0.999_1.001``) against ``decode`` (target >= 0.8);
* the same dump as a memory-mapped Arrow IPC file against the maths alone (``maths``: the engine over chunks
  already in memory), to show IPC is bound by the maths, not the reads;
* ``--explain`` against plain analyze, both ``is_rs`` (time, target <= 1.5x), the default sweep against one
  ``analyze --rs token_k1`` (time, <= 3x), ``--ray`` on 2 local CPUs against ``--workers 2`` (throughput, >= 0.8):
  each measured where this checkout has the feature, else reported as not measured;
* the padded approach trainers use (verl's own helper on ``[B, T]`` tensors) on the first ``--padded-tokens``;
* a ``--device cuda`` row where torch sees a GPU.

Finally ``rcdiag --help`` is timed (fresh processes, median of 5). Peak memory: benchmarks/memory.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from _data import dump, ipc_copy, parse_tokens
from _methods import CONFIG, decode, padded, rcdiag_e2e, scan_sum
from startup import startup

import rcdiag
from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS
from rcdiag.settings.reading import ReadOptions

Method = Callable[[], int]


def maths_only(path: Path, chunk_tokens: int, tokens: int) -> Method:
    """The engine alone (screen + maths, one thread) over the first ``tokens`` of the dump held in memory."""
    from rcdiag.engine.stream import Engine
    from rcdiag.io import open_dump
    from rcdiag.io.screen import Screen

    chunks, held = [], 0
    for chunk in open_dump(path).chunks(chunk_tokens):
        chunks.append(chunk)
        held += chunk.n_tokens
        if held >= tokens:
            break

    def run() -> int:
        Engine(CONFIG.resolve()).run(Screen()(chunks))
        return held

    return run


def feature_methods(path: Path, chunk: int) -> tuple[dict[str, Method], list[str]]:
    """The new features' methods this checkout has, and a line for each one it lacks."""
    methods: dict[str, Method] = {}
    missing: list[str] = []
    params = inspect.signature(rcdiag.analyze).parameters
    if "explain" in params:
        from _methods import rcdiag_explain

        methods["rcdiag is_rs --explain"] = lambda: rcdiag_explain(path, chunk)
    else:
        missing.append("--explain: not in this checkout (not measured)")
    try:
        from _methods import analyze_token_k1, sweep_default
    except ImportError:
        missing.append("sweep: not in this checkout (not measured)")
    else:
        methods["analyze --rs token_k1"] = lambda: analyze_token_k1(path, chunk)
        methods["sweep (default)"] = lambda: sweep_default(path, chunk)
    ray = _ray() if "ray" in {f.name for f in dataclasses.fields(ReadOptions)} else None
    if ray is None:
        missing.append("--ray: not in this checkout, or ray is not installed (not measured)")
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        methods["rcdiag is_rs --workers 2"] = lambda: rcdiag_e2e(path, chunk, workers=2)
        methods["rcdiag is_rs --ray (2 CPUs)"] = lambda: rcdiag_e2e(path, chunk, ray=True)
    return methods, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="100M", help="dump size (default 100M)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    parser.add_argument("--padded-tokens", default="10M", help="tokens the padded baseline reads (0 = skip it)")
    parser.add_argument("--maths-tokens", default="10M", help="tokens held in memory for the maths-only row")
    parser.add_argument("--no-ipc", action="store_true", help="skip the Arrow IPC rows")
    parser.add_argument("--no-features", action="store_true", help="skip --explain, sweep and --ray")
    args = parser.parse_args()
    path, chunk = dump(parse_tokens(args.tokens)), args.chunk_tokens
    methods: dict[str, Method] = {
        "decode": lambda: decode(path),
        "scan_sum (former floor)": lambda: scan_sum(path, chunk),
        "rcdiag": lambda: rcdiag_e2e(path, chunk, config="default"),
        "rcdiag is_rs": lambda: rcdiag_e2e(path, chunk),
    }
    if not args.no_ipc:
        ipc = ipc_copy(path)
        methods["rcdiag, IPC mmap"] = lambda: rcdiag_e2e(ipc, chunk, config="default")
        methods["rcdiag is_rs, IPC mmap"] = lambda: rcdiag_e2e(ipc, chunk)
        methods["maths (is_rs, in memory)"] = maths_only(path, chunk, parse_tokens(args.maths_tokens))
    missing: list[str] = []
    if not args.no_features:
        features, missing = feature_methods(path, chunk)
        methods |= features
    padded_tokens = parse_tokens(args.padded_tokens)
    if padded_tokens:
        methods["padded (verl helper)"] = lambda: padded(path, chunk, padded_tokens)
    if _cuda():
        methods["rcdiag is_rs --device cuda"] = lambda: rcdiag_e2e(path, chunk, device="cuda")
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB, chunk {chunk:,} tokens, 1 warm-up + {args.rounds} rounds")
    print(f"machine: {platform.processor() or platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}")
    print(f"load average before: {_load()}")
    rate = interleaved(methods, args.rounds, warmup=True)
    print(f"load average after: {_load()}")
    print("\n| ratio (same run) | measured | target |\n|---|---|---|")
    ratio = _ratios(rate)
    for label, value, target in ratio:
        print(f"| {label} | {value} | {target} |")
    for line in missing:
        print(f"| {line} | | |")
    ray = _ray() if "rcdiag is_rs --ray (2 CPUs)" in methods else None
    if ray is not None:
        ray.shutdown()
    help_seconds = startup(["--help"], repeats=5)
    print(f"\n`rcdiag --help`: {help_seconds:.2f} s (median of 5 fresh processes; load average {_load()})")


def interleaved(methods: dict[str, Method], rounds: int, warmup: bool = False) -> dict[str, float]:
    """Time every method (returning the tokens it read) once per round, in turn, after an untimed warm-up round
    if asked; print each time and a table of the medians (M tokens/s, min-max), and return the medians."""
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for round_ in range(rounds + int(warmup)):
        for name, method in methods.items():
            start = time.perf_counter()
            tokens = method()
            seconds = time.perf_counter() - start
            label = "warm-up" if warmup and round_ == 0 else f"round {round_ + int(not warmup)}"
            print(f"  {label}: {name:28s} {tokens / seconds / 1e6:7.1f} M tok/s ({seconds:.1f} s)", flush=True)
            if label != "warm-up":
                rates[name].append(tokens / seconds / 1e6)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print("\n| method | M tokens/s, median (min-max) |\n|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {medians[name]:.1f} ({min(values):.1f}-{max(values):.1f}) |")
    return medians


def _ratios(rate: dict[str, float]) -> list[tuple[str, str, str]]:
    def time_ratio(a: str, b: str) -> float:  # both read the same tokens: times are inverse to rates
        return rate[b] / rate[a]

    out = [
        ("rcdiag / decode", f"**{rate['rcdiag'] / rate['decode']:.2f}**", ">= 0.8"),
        ("rcdiag is_rs / decode", f"**{rate['rcdiag is_rs'] / rate['decode']:.2f}**", ">= 0.8"),
        ("scan_sum (former floor) / decode", f"{rate['scan_sum (former floor)'] / rate['decode']:.2f}", ""),
    ]
    if "rcdiag is_rs, IPC mmap" in rate:
        ipc, maths = rate["rcdiag is_rs, IPC mmap"], rate["maths (is_rs, in memory)"]
        out.append(("rcdiag is_rs: IPC mmap / maths alone", f"{ipc / maths:.2f}", "close to 1 (bound by the maths)"))
        out.append(("rcdiag is_rs: IPC mmap / Parquet", f"{ipc / rate['rcdiag is_rs']:.2f}", ""))
    if "rcdiag is_rs --explain" in rate:
        value = time_ratio("rcdiag is_rs --explain", "rcdiag is_rs")
        out.append(("time: --explain / plain analyze", f"**{value:.2f}x**", "<= 1.5x"))
    if "sweep (default)" in rate:
        value = time_ratio("sweep (default)", "analyze --rs token_k1")
        out.append(("time: default sweep / analyze --rs token_k1", f"**{value:.2f}x**", "<= 3x"))
    if "rcdiag is_rs --ray (2 CPUs)" in rate:
        value = rate["rcdiag is_rs --ray (2 CPUs)"] / rate["rcdiag is_rs --workers 2"]
        out.append(("--ray (2 CPUs) / --workers 2", f"**{value:.2f}**", ">= 0.8"))
    if "padded (verl helper)" in rate:
        out.append(("rcdiag is_rs / padded", f"{rate['rcdiag is_rs'] / rate['padded (verl helper)']:.0f}x", ">= 10x"))
    if "rcdiag is_rs --device cuda" in rate:
        out.append(("cuda / cpu (is_rs)", f"{rate['rcdiag is_rs --device cuda'] / rate['rcdiag is_rs']:.2f}", ""))
    return out


def _ray():
    try:
        import ray
    except ImportError:
        return None
    return ray


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
