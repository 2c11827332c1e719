"""The signature statistics' cost (issue 34's budget: a default analyze with its judgement at most 1.3x the plain
analyze it replaced), measured in one run against the same analyze without them.

    python benchmarks/signatures.py --tokens 20M --rounds 3 [--history]

``without`` is ``rcdiag.analyze`` with ``SignatureMetrics`` taken out of every batch (what analyze computed before
issue 34), ``with`` is today's analyze; both verl's default configuration and the realistic IS/RS one. Rounds are
interleaved (load on a shared machine hits both), medians reported, and the ratio with / without, wall and CPU time
of this process.

``--history``: the history test's cost where the token ids are read (``--explain``, ``watch``, analyze's extra pass
on a verdict of noise or an unexplained mismatch), on the dump copied with a ``token_ids`` column (Zipf ids over
151,936, as ``explain_tokens.py`` writes it): one pass reading the ids with the history pass off (the ids' decode
alone) against the same with it on, and against the pass without the ids.

``--pass``: the signature pass alone (``rcdiag.metrics.signatures.signature_sums``, compiled) over the dump's rows
in blocks of a million tokens, against one analyze of the dump in the same run: its time per token and its share of
analyze. Run it with another tree on ``PYTHONPATH`` to compare the pass of two trees (this script uses only what
both have).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from _data import dump, parse_tokens
from _methods import CONFIG
from explain_tokens import with_ids

import rcdiag
from rcdiag.api import accumulate, analyze_state, build_report
from rcdiag.metrics import batch
from rcdiag.metrics.block import Block
from rcdiag.metrics.signatures import SignatureMetrics
from rcdiag.sections.token_ids import TokenIdsSection


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


@contextlib.contextmanager
def without_history() -> Iterator[None]:
    """``SignatureMetrics`` blind to the block's token ids (the ids are still read and screened)."""
    update = SignatureMetrics.update

    def blind(self: SignatureMetrics, block: Block) -> None:
        tokens, block.tokens = block.tokens, None
        try:
            update(self, block)
        finally:
            block.tokens = tokens

    SignatureMetrics.update = blind  # type: ignore[method-assign]
    try:
        yield
    finally:
        SignatureMetrics.update = update  # type: ignore[method-assign]


def one_pass(path: Path, ids: bool, history: bool) -> tuple[float, float]:
    """One pass of the default analyze (no second pass): the ids read or not, the history pass on or off."""
    context = contextlib.nullcontext() if history else without_history()
    with context:
        wall, cpu = time.perf_counter(), time.process_time()
        got = accumulate(path, rcdiag.CorrectionConfig(), sections=[TokenIdsSection()] if ids else ())
        build_report(analyze_state(got.state), got.info, got.device, got.screen)
        return time.perf_counter() - wall, time.process_time() - cpu


def history(tokens: str, path: Path, rounds: int) -> None:
    with_ids_path = with_ids(path, 151_936)
    cases = {"no ids": (False, False), "ids, history off": (True, False), "ids, history on": (True, True)}
    for ids, on in cases.values():  # warm-up
        one_pass(with_ids_path, ids, on)
    times: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, (ids, on) in cases.items():
            times.setdefault(name, []).append(one_pass(with_ids_path, ids, on))
    med = {name: [statistics.median(t[i] for t in runs) for i in (0, 1)] for name, runs in times.items()}
    print(f"{tokens} tokens with ids, {rounds} rounds (medians; one pass, verl's default configuration)")
    for name, (wall, cpu) in med.items():
        print(f"{name:18s} {wall:6.2f} s wall {cpu:6.2f} s CPU")
    for a, b in (("ids, history on", "ids, history off"), ("ids, history on", "no ids")):
        print(f"{a} / {b}: {med[a][0] / med[b][0]:.3f} wall, {med[a][1] / med[b][1]:.3f} CPU")


def blocks(path: Path, size: int = 1_000_000) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The dump's rows as the compiled pass takes them (float32 log-probs, a bool mask, int64 lengths), cut into
    blocks of whole rows of about ``size`` tokens."""
    table = pq.read_table(path, columns=["old_log_prob", "rollout_log_prob", "response_mask"])
    columns = [table.column(name).combine_chunks() for name in table.column_names]
    offsets = np.asarray(columns[0].offsets, dtype=np.int64)
    values = [np.asarray(c.values) for c in columns]
    out, start = [], 0
    while start < offsets.size - 1:
        end = int(np.searchsorted(offsets, offsets[start] + size, side="left"))
        end = min(max(end, start + 1), offsets.size - 1)
        lo, hi = offsets[start], offsets[end]
        old, rollout = (np.ascontiguousarray(v[lo:hi], dtype=np.float32) for v in values[:2])
        out.append((old, rollout, values[2][lo:hi].astype(np.bool_), np.diff(offsets[start : end + 1])))
        start = end
    return out


def signature_pass(tokens: str, path: Path, rounds: int) -> None:
    from rcdiag.metrics.signatures import signature_kernel

    data = blocks(path)
    count = sum(old.size for old, *_ in data)
    signature_kernel(*data[0])  # warm-up: numba's cache
    rcdiag.analyze(path)
    passes, analyzes = [], []
    for _ in range(rounds):
        cpu = time.process_time()
        for block in data:
            signature_kernel(*block)
        passes.append(time.process_time() - cpu)
        cpu = time.process_time()
        rcdiag.analyze(path)
        analyzes.append(time.process_time() - cpu)
    one, whole = statistics.median(passes), statistics.median(analyzes)
    print(f"{tokens} tokens ({count:,}), {rounds} rounds (medians, CPU time of this process)")
    print(f"signature pass {one:6.3f} s CPU ({one / count * 1e9:.2f} ns a token)   analyze {whole:6.2f} s CPU")
    print(f"pass / analyze: {one / whole:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="20M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history", action="store_true", help="time the history test where token ids are read")
    parser.add_argument("--pass", dest="alone", action="store_true", help="time the signature pass alone")
    args = parser.parse_args()
    path = dump(parse_tokens(args.tokens))
    if args.alone:
        signature_pass(args.tokens, path, args.rounds)
        return
    if args.history:
        history(args.tokens, path, args.rounds)
        return
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
