"""The small-dump path: below ``SMALL_DUMP_BYTES`` of input a run never imports numba.

Importing numba and loading its first cached kernel (numba initialising its CPU target) is a fixed cost per process
(0.3-0.85 s measured, docs/performance.md "Where a small run's time goes"; a fresh machine also compiles, 3 s),
which is most of a small dump's run. Below the threshold the numpy backend takes the array passes
(``rcdiag.metrics.token_passes.ArrayPasses``, the torch path's code on numpy, held to the kernels by
tests/engine/test_token_kernel.py and tests/engine/test_small_path.py) and the numpy forms below of the kernels a plain
analyze calls outside the token passes: the token-id range (``rcdiag.kernels.token_ids``) and the valid tokens per row
(``rcdiag.kernels.metric_pass``); the value screen's range (``rcdiag.kernels.screen``) is numpy's own ``min`` and
``max`` there (``rcdiag.io.screen``). Every one of these gives
exactly the kernel's answer (integers, extremes); the token sums agree to float64 rounding. The choice is made once
per run, from the dump's file sizes, before the first block (``compiled_for``): a dump of unknown size (chunks given
in memory, a file without a known size) takes the kernels. This module imports no numba.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rcdiag.core.formulas import ulp_distance
from rcdiag.runtime.environment import Variable, whole_number

SMALL_DUMP_BYTES = 32 << 20
"""Dumps whose files hold fewer bytes take the numpy path: 32 MiB, about 3.5M tokens of zstd Parquet (8.8 bytes a
token in the benchmark's dumps, 11-12 in the samples'). Measured by ``benchmarks/small_path.py --tokens 2M --rounds 5``
(2026-12-01, the shared 2-vCPU machine, load average 8.6, medians, in one run): the numpy path took 2.58x the
kernels' time in-process (+252 ns a token, the decode included in both), and numba's fixed cost per process was
2.2 s cached (a 10k-token analyze forced to the kernels against the same on the numpy path; 19.6 s with an empty
numba cache), so the two break even at 8.8M tokens (74 MiB). The threshold sits below half of that, where the numpy
path is still faster by at least half of numba's cached fixed cost, since the per-token gap moves with load and
with the dump's mask; a fresh machine's compile only widens the margin."""

SWITCH = "RCDIAG_SMALL_DUMP_BYTES"
"""Overrides ``SMALL_DUMP_BYTES`` (a whole number of bytes): ``0`` always takes the kernels, a large number takes the
numpy path for every dump of known size."""


SMALL_DUMP = Variable(SWITCH, "a whole number of bytes", whole_number)


def small_dump_bytes() -> int:
    """The threshold in force (the variable is read at each use, so a test or a wrapper can set it)."""
    return SMALL_DUMP.value(SMALL_DUMP_BYTES)


def compiled_for(sizes: Iterable[int | None]) -> bool:
    """Whether a dump of files of these sizes (bytes; ``None``: unknown) takes the compiled kernels: yes unless every
    size is known and together they stay below the threshold."""
    total = 0
    for size in sizes:
        if size is None:
            return True
        total += size
    return total >= small_dump_bytes()


def valid_range(ids: np.ndarray, mask: np.ndarray) -> tuple[int, int, int]:
    """``rcdiag.kernels.token_ids.valid_range`` in numpy: (smallest id, largest id, valid tokens) over valid positions
    (``mask``: uint8 flags, empty for every position valid); (0, -1, 0) without any."""
    chosen = ids if mask.shape[0] == 0 else ids[mask.view(np.bool_)]
    if not chosen.size:
        return 0, -1, 0
    return int(chosen.min()), int(chosen.max()), int(chosen.size)


def valid_lengths(mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``rcdiag.kernels.metric_pass.valid_lengths`` in numpy: the valid tokens (int64) of each row of ``lengths`` raw
    tokens (a running count of the mask, differenced at the row ends: empty rows included)."""
    ends = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    counts = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(mask, dtype=np.int64, out=counts[1:])
    return counts[ends[1:]] - counts[ends[:-1]]


def row_differences(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
    """``rcdiag.kernels.metric_pass.differences_pass`` in numpy: per row of a raw block (float32 ``old``/``rollout``,
    boolean ``mask`` or ``None``, ``lengths`` raw tokens each), [valid tokens whose bits differ, their greatest ulp
    distance, the list position of the first (-1: none)], int64. Only the differing tokens are looked at twice."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros((lengths.shape[0], 3), dtype=np.int64)
    out[:, 2] = -1
    old_bits = np.ascontiguousarray(old, dtype=np.float32).view(np.int32)
    rollout_bits = np.ascontiguousarray(rollout, dtype=np.float32).view(np.int32)
    differ = old_bits != rollout_bits
    if mask is not None:
        differ &= mask
    at = np.flatnonzero(differ)
    if not at.size:
        return out
    apart = ulp_distance(old_bits[at].astype(np.int64), rollout_bits[at].astype(np.int64))
    starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    row = np.searchsorted(starts, at, side="right") - 1  # ascending, as ``at`` is
    firsts = np.flatnonzero(np.diff(row, prepend=-1))
    rows = row[firsts]
    out[rows, 0] = np.diff(np.append(firsts, at.shape[0]))
    out[rows, 1] = np.maximum.reduceat(apart, firsts)
    out[rows, 2] = at[firsts] - starts[rows]
    return out
