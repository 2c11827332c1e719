"""The per-row sums ``--by``'s table reads (``rcdiag.sections.slices``; its numpy twin, ``slice_arrays`` there,
serves a small dump and the tests), in one read of each row as it lies (padding included).

Per row, over its valid tokens: |d| and k3 = e^d - 1 - d with d = float32(old - rollout) (as the report's token
pass and ``compare``'s per-response sums), and, over those whose log-ratio is a number, d^2, mid, mid^2 and d * mid
with d = float64(old) - float64(rollout) and mid their mean (as the signature pass's ``shape_corr``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.scalar import k3 as k3_of


@njit(**JIT)
def slice_pass(old, rollout, mask, has_mask, lengths, out):  # fmt: skip
    """Fill ``out`` (rows x 6: |d|, k3, d^2, mid, mid^2, d * mid) from a block's raw rows (``lengths`` tokens
    each; ``mask`` where ``has_mask``)."""
    start = 0
    for i in range(lengths.shape[0]):
        absolute = k3 = d2 = mid = mid2 = dmid = 0.0
        for k in range(lengths[i]):
            t = start + k
            if has_mask and not mask[t]:
                continue
            o = old[t]
            r = rollout[t]
            d32 = np.float64(o - r)
            absolute += abs(d32)
            k3 += k3_of(math.expm1(d32), d32)
            d = np.float64(o) - np.float64(r)
            if not math.isfinite(d):
                continue
            m = 0.5 * (np.float64(o) + np.float64(r))
            d2 += d * d
            mid += m
            mid2 += m * m
            dmid += d * m
        out[i, 0] = absolute
        out[i, 1] = k3
        out[i, 2] = d2
        out[i, 3] = mid
        out[i, 4] = mid2
        out[i, 5] = dmid
        start += lengths[i]
