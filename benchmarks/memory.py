"""Peak memory: rcdiag's resident set stays flat as the dump grows; the padded approach's does not.

    python benchmarks/memory.py --tokens 25M,100M

Each measurement runs in a fresh process and reports its peak RSS (``ru_maxrss``): rcdiag end to end at the
default chunk size on every dump size, and the padded baseline at the same chunk size on the smallest dump
(``--padded-tokens`` of it). Also times ``rcdiag --help`` and ``rcdiag --version``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from _data import dump, parse_tokens
from startup import startup

from rcdiag.constants import DEFAULT_CHUNK_TOKENS

HERE = Path(__file__).resolve().parent
CHILD = """
import resource, sys
sys.path.insert(0, {here!r})
from _methods import {method}
tokens = {method}(__import__("pathlib").Path({path!r}), {chunk}{extra})
print(tokens, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak(method: str, path: Path, chunk: int, extra: str = "") -> tuple[int, float]:
    """(tokens, peak RSS in MB) of one method in a fresh process."""
    code = CHILD.format(here=str(HERE), method=method, path=str(path), chunk=chunk, extra=extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="25M,100M", help="comma-separated dump sizes")
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    parser.add_argument("--padded-tokens", default="5M", help="tokens the padded baseline reads (0 = skip it)")
    args = parser.parse_args()
    sizes = [parse_tokens(t) for t in args.tokens.split(",")]
    paths = [dump(size) for size in sizes]
    print(f"chunk {args.chunk_tokens:,} tokens")
    results = {}
    for size, path in zip(sizes, paths, strict=True):
        tokens, mb = peak("rcdiag_e2e", path, args.chunk_tokens)
        results[size] = mb
        print(f"  rcdiag  {tokens / 1e6:6.1f}M tokens: peak RSS {mb:6.0f} MB")
    if len(sizes) > 1:
        growth = results[sizes[-1]] / results[sizes[0]]
        print(f"  growth {sizes[0] / 1e6:.0f}M -> {sizes[-1] / 1e6:.0f}M tokens: {growth:.2f}x (target <= 1.2x)")
    padded_tokens = parse_tokens(args.padded_tokens)
    if padded_tokens:
        tokens, mb = peak("padded", paths[0], args.chunk_tokens, extra=f", {padded_tokens}")
        print(f"  padded  {tokens / 1e6:6.1f}M tokens: peak RSS {mb:6.0f} MB")
        print(f"  padded / rcdiag peak RSS at the same chunk size: {mb / results[sizes[0]]:.1f}x (target >= 4x)")
    print(
        f"rcdiag --help: {startup(['--help']):.2f} s, rcdiag --version: {startup(['--version']):.2f} s (target < 0.5 s)"
    )


if __name__ == "__main__":
    main()
