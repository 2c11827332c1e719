"""The by-token table's one addition: a run of valid tokens' terms added to their ids' rows.

Shared by the explain pass (``rcdiag.kernels.explain``, which adds each row's tokens while the row's terms are in
L1) and the stand-alone pass (``rcdiag.kernels.token_ids``), so both add the same terms in the same order: a
row of ``out`` per id holds the sums of ``rcdiag.explain.tokens.SUMS`` (tokens, log-ratio, |log-ratio|, k3, chi2,
log-ratio squared).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rcdiag.kernels import JIT

N_TOKEN_SUMS = 6


@njit(**JIT)
def add_token_terms(
    ids: np.ndarray, old: np.ndarray, rollout: np.ndarray, k3: np.ndarray, chi2: np.ndarray, out: np.ndarray
) -> int:
    """Add each token whose id is in ``[0, out.shape[0])`` to its id's row of ``out``; returns how many were not
    (left for the caller)."""
    rows = out.shape[0]
    skipped = 0
    for j in range(ids.shape[0]):
        row = ids[j]
        if row < 0 or row >= rows:
            skipped += 1
            continue
        d = np.float64(old[j] - rollout[j])
        out[row, 0] += 1.0
        out[row, 1] += d
        out[row, 2] += abs(d)
        out[row, 3] += k3[j]
        out[row, 4] += chi2[j]
        out[row, 5] += d * d
    return skipped
