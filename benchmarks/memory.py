"""Peak memory: rcdiag's resident set stays flat as the dump grows; the padded approach's does not.

    python benchmarks/memory.py --tokens 25M,100M

Each measurement runs in a fresh process. It reports the peak resident set (``ru_maxrss``) and, from a 5 ms
sampler of ``/proc/self/status``, the peaks of its two parts: ``RssAnon`` (the process's own memory: arrays,
heap) and ``RssFile`` (file pages mapped into the process). For a memory-mapped Arrow IPC dump, ``RssFile``
counts the pages of the file that were read through the mapping: page cache the kernel can drop at any time
(clean, file-backed), not memory the process holds; ``RssAnon`` is what it holds. Measured: rcdiag end to end
with verl's default configuration and with the realistic one (``is_rs``) on every dump size, the same dumps as
Arrow IPC files, and the padded baseline at the same chunk size on the smallest dump (``--padded-tokens`` of it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from _data import dump, ipc_copy, parse_tokens

from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS

HERE = Path(__file__).resolve().parent
CHILD = """
import resource, sys, threading, time
sys.path.insert(0, {here!r})
from _methods import {method}

peaks = {{"RssAnon": 0, "RssFile": 0}}
done = threading.Event()

def sample():
    while not done.is_set():
        with open("/proc/self/status") as status:
            for line in status:
                key = line.split(":")[0]
                if key in peaks:
                    peaks[key] = max(peaks[key], int(line.split()[1]))
        time.sleep(0.005)

sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
tokens = {method}(__import__("pathlib").Path({path!r}), {chunk}{extra})
done.set()
sampler.join()
print(tokens, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, peaks["RssAnon"], peaks["RssFile"])
"""


def peak(method: str, path: Path, chunk: int, extra: str = "") -> tuple[int, float]:
    """(tokens, peak RSS in MB) of one method in a fresh process."""
    tokens, maxrss, _, _ = peaks(method, path, chunk, extra)
    return tokens, maxrss


def peaks(method: str, path: Path, chunk: int, extra: str = "") -> tuple[int, float, float, float]:
    """(tokens, peak RSS, peak RssAnon, peak RssFile; all in MB) of one method in a fresh process."""
    code = CHILD.format(here=str(HERE), method=method, path=str(path), chunk=chunk, extra=extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]) / 1024, int(out[2]) / 1024, int(out[3]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="25M,100M", help="comma-separated dump sizes")
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    parser.add_argument("--padded-tokens", default="5M", help="tokens the padded baseline reads (0 = skip it)")
    parser.add_argument("--no-ipc", action="store_true", help="skip the Arrow IPC rows")
    args = parser.parse_args()
    sizes = [parse_tokens(t) for t in args.tokens.split(",")]
    paths = [dump(size) for size in sizes]
    runs = [("rcdiag", "parquet", ', config="default"'), ("rcdiag is_rs", "parquet", "")]
    if not args.no_ipc:
        runs += [("rcdiag", "IPC mmap", ', config="default"'), ("rcdiag is_rs", "IPC mmap", "")]
    print(f"chunk {args.chunk_tokens:,} tokens; peaks in MB (fresh process each)\n")
    print("| run | format | tokens | peak RSS | peak RssAnon | peak RssFile |\n|---|---|---|---|---|---|")
    first: dict[tuple[str, str], float] = {}
    growth: list[str] = []
    for name, form, extra in runs:
        for size, path in zip(sizes, paths, strict=True):
            where = ipc_copy(path) if form == "IPC mmap" else path
            tokens, rss, anon, mapped = peaks("rcdiag_e2e", where, args.chunk_tokens, extra)
            print(f"| {name} | {form} | {tokens / 1e6:.1f}M | {rss:.0f} | {anon:.0f} | {mapped:.0f} |", flush=True)
            key = (name, form)
            judged = anon if form == "IPC mmap" else rss  # mapped file pages are page cache, not held memory
            if key in first:
                what = "RssAnon" if form == "IPC mmap" else "RSS"
                growth.append(f"| {name}, {form}: peak {what} {sizes[0] / 1e6:.0f}M -> {size / 1e6:.0f}M tokens "
                              f"| {judged / first[key]:.2f}x | <= 1.2x |")  # fmt: skip
            else:
                first[key] = judged
    padded_tokens = parse_tokens(args.padded_tokens)
    if padded_tokens:
        tokens, rss, anon, _ = peaks("padded", paths[0], args.chunk_tokens, extra=f", {padded_tokens}")
        print(f"| padded (verl helper) | parquet | {tokens / 1e6:.1f}M | {rss:.0f} | {anon:.0f} | |")
        ours = peaks("rcdiag_e2e", paths[0], args.chunk_tokens)[1]
        growth.append(f"| padded / rcdiag is_rs peak RSS, same chunk size | {rss / ours:.1f}x | >= 4x |")
    print("\n| ratio | measured | target |\n|---|---|---|")
    print("\n".join(growth))


if __name__ == "__main__":
    main()
