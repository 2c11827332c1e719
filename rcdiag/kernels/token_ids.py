"""``--explain``'s by-token sums outside the explain pass: the ids' range, and a stand-alone pass adding each valid
token's terms to its id's row.

The explain pass adds the dense table's ids itself (``rcdiag.kernels.explain``, while a row's terms are in L1);
this pass takes the rest (ids beyond the dense table, a block folded on its own). A row of ``out`` per token id
holds ``N_TOKEN_SUMS`` float64 sums (``rcdiag.kernels.token_rows``): one cache line per token, where six
``np.bincount`` passes read the ids six times and allocate a vocabulary-sized array each (measured: 20-45 ns
against 30-55 ns a token for 256k ids on this machine, under load). Valid tokens are gathered ``BUFFER`` at a time
into small buffers (no compaction of the block beforehand), their ids' rows prefetched, their k3 and chi2 terms
taken by the explain pass's own ``_row_terms`` (the same formulas and bits as the breakdowns), then added to their
ids' rows. Ids are int32 or
int64 (each compiles once).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.explain import _row_terms
from rcdiag.kernels.explain_encoding import SMALL
from rcdiag.kernels.token_rows import add_token_terms, prefetch_token_rows

BUFFER = 2048
"""Valid tokens gathered before their terms are taken (the buffers stay in L1/L2)."""
_CAP = np.float32(1.0)
"""``_row_terms``' capped-ratio sum is not used here; any cap will do."""


@njit(**JIT)
def valid_range(ids: np.ndarray, mask: np.ndarray) -> tuple[int, int, int]:
    """(smallest id, largest id, valid tokens) over valid positions (``mask`` empty: every position valid);
    (0, -1, 0) without any."""
    everything = mask.shape[0] == 0
    low = np.int64(np.iinfo(np.int64).max)
    high = np.int64(np.iinfo(np.int64).min)
    count = 0
    for j in range(ids.shape[0]):
        if everything or mask[j]:
            v = ids[j]
            low = v if v < low else low
            high = v if v > high else high
            count += 1
    if count == 0:
        return 0, -1, 0
    return low, high, count


@njit(**JIT)
def _flush(
    ids: np.ndarray, old: np.ndarray, rollout: np.ndarray, k3: np.ndarray, chi2: np.ndarray, n: int, small: bool,
    out: np.ndarray,
) -> None:  # fmt: skip
    prefetch_token_rows(ids[:n], out)  # the ids' table rows arrive while the terms are taken
    _row_terms(old[:n], rollout[:n], k3[:n], chi2[:n], _CAP, small)
    add_token_terms(ids[:n], old[:n], rollout[:n], k3[:n], chi2[:n], out)


@njit(**JIT)
def scatter_token_sums(old: np.ndarray, rollout: np.ndarray, ids: np.ndarray, mask: np.ndarray, out: np.ndarray) -> int:
    """Add every valid token (``mask`` empty: every position) whose id is in ``[0, out.shape[0])`` to its id's row
    of ``out``; returns how many valid tokens had an id beyond the table (left for the caller)."""
    everything = mask.shape[0] == 0
    rows = out.shape[0]
    id_buf = np.empty(BUFFER, dtype=np.int64)
    old_buf = np.empty(BUFFER, dtype=np.float32)
    roll_buf = np.empty(BUFFER, dtype=np.float32)
    k3_buf = np.empty(BUFFER, dtype=np.float64)
    chi2_buf = np.empty(BUFFER, dtype=np.float64)
    small = np.float32(SMALL)
    n = 0
    all_small = True
    skipped = 0
    for j in range(ids.shape[0]):
        if not (everything or mask[j]):
            continue
        v = ids[j]
        if v < 0 or v >= rows:
            skipped += 1
            continue
        id_buf[n] = v
        old_buf[n] = old[j]
        roll_buf[n] = rollout[j]
        all_small = all_small and abs(old[j] - rollout[j]) < small
        n += 1
        if n == BUFFER:
            _flush(id_buf, old_buf, roll_buf, k3_buf, chi2_buf, n, all_small, out)
            n = 0
            all_small = True
    if n:
        _flush(id_buf, old_buf, roll_buf, k3_buf, chi2_buf, n, all_small, out)
    return skipped
