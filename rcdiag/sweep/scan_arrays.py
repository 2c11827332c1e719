"""The sweep's per-token pass (``rcdiag.kernels.sweep.scan``) in array operations, for the backends that do not run
the numba kernels: a small dump's numpy path (``NumpyBackend(compiled=False)``, which must not import numba) and
torch (``--device cuda``, which would otherwise copy every block's statistic to the host for the kernel).

The same answer as the kernel, computed as scatters instead of a loop: each token's cell by ``searchsorted`` (edges
below plus edges at or below, NaN last: ``Cells.point``'s order), and every per-cell and per-row quantity as a
scatter-add (``bincount``) or scatter-max over a flat index. The kernel's layout is kept where it decides a value:
the same sub-blocks of whole rows (each cell's M2 centred on its sub-block's mean, then merged with
``chan_merge_share``), the same four interleaved copies (a token's position in its sub-block, mod 4) for the cells'
sums, extremes and the histogram. numpy's ``bincount`` adds in token order, as the kernel does, so on numpy every
count, histogram bin and cell sum is the kernel's to the bit, and so are the cells' means where a block is one
sub-block; the rest moves in the last bits (the kernel contracts ``d * d + s`` and the sub-blocks' merge to fused
multiply-adds and reorders its row sums under fast-math), and the cells' extremes are the kernel's values (the sign
of a zero tied with another may differ). On torch the scatters' order is the device's (atomics on a GPU): floats to
rounding, counts exact. Only per-cell and per-row results (and the histogram's counts) come back to the host. Held
to the kernel by tests/sweep/test_sweep_twin.py.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rcdiag.core.formulas import NEG_INF_KEY, POS_INF_KEY, chan_merge_share, order_key
from rcdiag.kernels.sweep_encoding import AMBIGUOUS, BUCKETS, HISTOGRAM_CLAMPED, NO_HISTOGRAM, SHIFT, SUB_BLOCK
from rcdiag.metrics.backend import Backend, NumpyBackend

LANES = 4
"""The kernel's interleaved copies of its per-cell sums and of the histogram."""
_NEG_INF_KEY = float(NEG_INF_KEY)
_POS_INF_KEY = float(POS_INF_KEY)


_NUMPY = NumpyBackend(compiled=False)
"""The backend of a call without one (the numpy path; its layout cache is keyed by it)."""


def _cells(b: Backend, x: Any, edges: np.ndarray, table: np.ndarray | None, nan_cell: int) -> Any:
    """Each value's cell: on numpy the table's cell by the value's bucket (``Cells.table``), the few ambiguous ones by
    comparison; elsewhere by comparison."""
    if table is None or not isinstance(b, NumpyBackend):
        return _compared(b, x, edges, nan_cell)
    cell = table.take(x.view(np.uint32) >> SHIFT).astype(np.int64)
    ambiguous = np.flatnonzero(cell == AMBIGUOUS)
    if ambiguous.size:
        cell[ambiguous] = _compared(b, x[ambiguous], edges, nan_cell)
    return cell


def _compared(b: Backend, x: Any, edges: np.ndarray, nan_cell: int) -> Any:
    """Each value's cell by comparison with every edge: edges below plus edges at or below (NaN: the last cell)."""
    nan = x != x
    if not edges.shape[0]:
        return b.to_int64(nan)  # no edge: every number in cell 0, NaN in cell 1
    e = b.asarray(np.ascontiguousarray(edges))
    return b.where(nan, nan_cell, b.searchsorted(e, x, False) + b.searchsorted(e, x, True))


def _row_extremes(b: Backend, x: Any, lengths: np.ndarray) -> tuple[Any, Any]:
    """Each row's largest and smallest order key, as float64 (which holds every int32 exactly; an empty row's: the
    infinities')."""
    keys = b.to_float64(order_key(b.int32_bits(x)))
    rows = b.segments(lengths)
    return rows.max(keys, _NEG_INF_KEY), rows.min(keys, _POS_INF_KEY)


@functools.lru_cache(maxsize=4)
def _layout(b: Backend, lengths: bytes) -> tuple[int, Any, Any, Any]:
    """A block's sub-blocks and, per token, its sub-block, its copy within the sub-block (its position there, mod
    4) and its row; the same for every statistic of the block (cached by its row lengths)."""
    rows = np.frombuffer(lengths, dtype=np.int64)
    firsts = sub_blocks(rows)
    n_sub = int(firsts.shape[0]) - 1
    starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    sizes = starts[firsts[1:]] - starts[firsts[:-1]]
    tokens = np.arange(int(starts[-1]), dtype=np.int64)
    sub = b.repeat(b.asarray(np.arange(n_sub, dtype=np.int64)), b.asarray(sizes))
    lane = (b.asarray(tokens) - b.repeat(b.asarray(starts[firsts[:-1]]), b.asarray(sizes))) & (LANES - 1)
    row = b.repeat(b.asarray(np.arange(rows.shape[0], dtype=np.int64)), b.asarray(np.ascontiguousarray(rows)))
    return n_sub, sub, sub * LANES + lane, row


def sub_blocks(lengths: np.ndarray) -> np.ndarray:
    """The kernel's sub-blocks: the first row of each (and ``len(lengths)`` last), whole rows packed while they fit
    in ``SUB_BLOCK`` tokens (a longer row alone)."""
    ends = np.cumsum(lengths)
    firsts = [0]
    start = 0
    while firsts[-1] < lengths.shape[0]:
        r0 = firsts[-1]
        r1 = max(r0 + 1, int(np.searchsorted(ends, start + SUB_BLOCK, side="right")))
        start = int(ends[r1 - 1])
        firsts.append(r1)
    return np.asarray(firsts, dtype=np.int64)


def scan(
    backend: Backend | None,
    x: Any,
    lengths: np.ndarray,
    edges: np.ndarray,
    n_cells: int,
    extremes: bool,
    per_row: bool,
    histogram: int,
    hist: np.ndarray,
    table: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """``rcdiag.kernels.sweep.scan`` on ``backend``'s arrays (``None``: numpy): the same arguments, ``x`` on the
    backend and the rest on the host, and the same results, as host numpy arrays. ``table``: the cells' table
    (``Cells.table``), which numpy indexes (torch compares every value with the edges)."""
    b = backend or _NUMPY
    x = b.to_float32(x)
    n_rows = int(lengths.shape[0])
    n_sub, sub, copy_of, row = _layout(b, np.ascontiguousarray(lengths, dtype=np.int64).tobytes())
    lane = copy_of & (LANES - 1)
    nan = x != x
    cell = _cells(b, x, edges, table, n_cells - 1)
    f = b.to_float64(x)

    # per sub-block, copy and cell: count and sum, then the cells' centred squares (the kernel's two passes)
    slot = copy_of * n_cells + cell
    size = n_sub * LANES * n_cells
    counts = b.to_numpy(b.bincount(slot, size)).reshape(n_sub, LANES, n_cells)
    totals = b.to_numpy(b.scatter_add(slot, f, size)).reshape(n_sub, LANES, n_cells)
    sub_n = counts[:, 0] + counts[:, 1] + counts[:, 2] + counts[:, 3]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        sub_total = totals[:, 0] + totals[:, 1] + totals[:, 2] + totals[:, 3]
        sub_mean = np.where(sub_n > 0, sub_total / np.maximum(sub_n, 1), 0.0)
    d = f - b.asarray(sub_mean.reshape(-1))[sub * n_cells + cell]
    squares = b.to_numpy(b.scatter_add(slot, d * d, size)).reshape(n_sub, LANES, n_cells)
    with np.errstate(invalid="ignore", over="ignore"):
        sub_m2 = squares[:, 0] + squares[:, 1] + squares[:, 2] + squares[:, 3]
    n_mean, mean, m2 = _merge(sub_n, sub_mean, sub_m2, n_cells)

    cell_high = np.full(n_cells, -np.inf)
    cell_low = np.full(n_cells, np.inf)
    if extremes:  # NaN skipped (the kernel's comparisons are false for it); copies combined in order, ties kept
        keep = ~nan
        index = (lane * n_cells + cell)[keep]
        for largest, out in ((True, cell_high), (False, cell_low)):
            copies = b.to_numpy(
                b.scatter_extreme(index, f[keep], LANES * n_cells, largest, -np.inf if largest else np.inf)
            ).reshape(LANES, n_cells)
            for copy in copies:
                better = copy > out if largest else copy < out
                out[better] = copy[better]

    # per row: extremes by the float order key (NaN if the row holds one), float64 sums
    row_high, row_low = (_floats(b.to_numpy(keys)) for keys in _row_extremes(b, x, lengths))
    row_nan = b.to_numpy(b.bincount(row[nan], n_rows)) > 0
    row_high[row_nan] = row_low[row_nan] = np.nan
    row_total = b.to_numpy(b.scatter_add(row, f, n_rows))
    if per_row:
        flat = row * n_cells + cell
        row_n = b.to_numpy(b.bincount(flat, n_rows * n_cells)).astype(np.int64).reshape(n_rows, n_cells)
        row_sum = b.to_numpy(b.scatter_add(flat, f, n_rows * n_cells)).reshape(n_rows, n_cells)
    else:
        row_n, row_sum = np.zeros((0, n_cells), np.int64), np.zeros((0, n_cells))

    if histogram != NO_HISTOGRAM:
        bucket = b.to_int64((b.int32_bits(x) >> SHIFT) & (BUCKETS - 1))
        if histogram == HISTOGRAM_CLAMPED:
            bucket = b.where(x < 0, 0, bucket)
        hist += b.to_numpy(b.bincount(lane * BUCKETS + bucket, LANES * BUCKETS)).astype(np.int64)
    return n_mean, mean, m2, cell_high, cell_low, row_n, row_sum, row_high, row_low, row_total


def _merge(
    sub_n: np.ndarray, sub_mean: np.ndarray, sub_m2: np.ndarray, n_cells: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sub-blocks' (count, mean, M2) per cell merged in order, as the kernel does: the first part taken as it is,
    a part of equal mean (equal infinities too: no NaN) adding its M2, any other by ``chan_merge_share``."""
    n_mean = np.zeros(n_cells, np.int64)
    mean = np.zeros(n_cells)
    m2 = np.zeros(n_cells)
    for k, part_mean, q in zip(sub_n, sub_mean, sub_m2, strict=True):
        first = (k > 0) & (n_mean == 0)
        same = (k > 0) & ~first & (part_mean == mean)
        other = (k > 0) & ~first & ~same
        if other.any():
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                _, merged_mean, merged_m2 = chan_merge_share(n_mean, mean, m2, k, part_mean, q)
            mean = np.where(other, merged_mean, mean)
            m2 = np.where(other, merged_m2, m2)
        mean = np.where(first, part_mean, mean)
        m2 = np.where(first, q, np.where(same, m2 + q, m2))
        n_mean = n_mean + k
    return n_mean, mean, m2


def _floats(keys: np.ndarray) -> np.ndarray:
    """The float32 values of float64-held order keys."""
    return order_key(keys.astype(np.int32)).view(np.float32)
