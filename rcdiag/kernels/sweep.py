"""The sweep's per-token pass over one statistic (a token option's k statistic, or token IS's ratio): each token's
cell among the thresholds' edges (``rcdiag.sweep.cells``), each cell's count, sum, extremes and centred sum of
squares, optionally per row, and optionally the recommendations' histogram (``rcdiag.sweep.collector``), in two
passes over the block instead of a sort (3 ns a value) and a ``bincount`` per quantity.

A token's cell comes from a table indexed by its float32 bit pattern shifted right by ``SHIFT`` = 15 bits
(sign, exponent and 8 mantissa bits: the collector's buckets, 256 per power of two). The floats of one bucket are
an interval, so a bucket with no edge inside it lies in one cell; the few that hold an edge (``AMBIGUOUS``) are
located by comparing with every edge (``_locate``: edges below plus edges at or below, the order of
``Cells.point``). The sums are float64, in token order within each of four interleaved copies (which break the
store-to-load chain of consecutive tokens in one cell). The encoding's constants live in
``rcdiag.kernels.sweep_encoding`` (no numba there), which the sweep feature imports.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rcdiag.core.formulas import NEG_INF_KEY, POS_INF_KEY
from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.scalar import chan_merge_share, order_key
from rcdiag.kernels.sweep_encoding import AMBIGUOUS, BUCKETS, HISTOGRAM_CLAMPED, SHIFT, SUB_BLOCK


@njit(**JIT)
def _locate(v: np.float32, edges: np.ndarray, nan_cell: int) -> int:
    """The cell of one value: edges below it plus edges at or below it (NaN: the last cell)."""
    if v != v:
        return nan_cell
    cell = 0
    for k in range(edges.shape[0]):
        e = edges[k]
        cell += (v >= e) + (v > e)
    return cell


@njit(**JIT)
def scan(
    x: np.ndarray,
    lengths: np.ndarray,
    table: np.ndarray,
    edges: np.ndarray,
    n_cells: int,
    extremes: bool,
    per_row: bool,
    histogram: int,
    hist: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """One statistic over a block: float32 ``x``, rows of ``lengths`` tokens one after another.

    Per cell: count, mean, M2 (centred on each sub-block's own mean, then combined as ``MomentArrays.merge``
    does), and with ``extremes`` max and min (NaN values: skipped by the extremes, summed into the last cell).
    Per row: max and min (float32; -inf and inf for an empty row; NaN if the row holds one) and float64 sum, as
    the block's segment reductions give them. With ``per_row``: per row and cell, count and float64 sum. With
    ``histogram`` > 0, each token counted into ``hist``: four interleaved int64 copies of the collector's
    histogram, one after another, kept across blocks.
    """
    n_rows = lengths.shape[0]
    n_mean = np.zeros(n_cells, np.int64)
    mean = np.zeros(n_cells)
    m2 = np.zeros(n_cells)
    high = np.full(4 * n_cells, -np.inf)
    low = np.full(4 * n_cells, np.inf)
    row_high = np.empty(n_rows, np.float32)
    row_low = np.empty(n_rows, np.float32)
    row_total = np.empty(n_rows)
    row_n = np.zeros((n_rows if per_row else 0, n_cells), np.int64)
    row_sum = np.zeros((n_rows if per_row else 0, n_cells))
    longest = 0
    for r in range(n_rows):
        longest = max(longest, lengths[r])
    buffer = np.empty(max(SUB_BLOCK, longest), np.uint16)
    count = np.zeros(4 * n_cells, np.int64)
    total = np.zeros(4 * n_cells)
    squares = np.zeros(4 * n_cells)
    sub_n = np.zeros(n_cells, np.int64)
    sub_mean = np.zeros(n_cells)
    r0 = 0
    start = 0
    while r0 < n_rows:
        r1 = r0 + 1
        size = lengths[r0]
        while r1 < n_rows and size + lengths[r1] <= SUB_BLOCK:
            size += lengths[r1]
            r1 += 1
        xs = x[start : start + size]
        cells = buffer[:size]
        count[:] = 0
        total[:] = 0.0
        squares[:] = 0.0
        _first_pass(xs, cells, table, edges, n_cells, extremes, histogram, hist, count, total, high, low)
        _row_reductions(xs, lengths[r0:r1], row_high[r0:r1], row_low[r0:r1], row_total[r0:r1])
        for c in range(n_cells):
            k = count[c] + count[n_cells + c] + count[2 * n_cells + c] + count[3 * n_cells + c]
            sub_n[c] = k
            t = total[c] + total[n_cells + c] + total[2 * n_cells + c] + total[3 * n_cells + c]
            sub_mean[c] = t / k if k > 0 else 0.0
        for t in range(xs.shape[0]):
            c = np.int64(cells[t])
            d = np.float64(xs[t]) - sub_mean[c]
            squares[(t & 3) * n_cells + c] += d * d
        for c in range(n_cells):
            k = sub_n[c]
            if k == 0:
                continue
            q = squares[c] + squares[n_cells + c] + squares[2 * n_cells + c] + squares[3 * n_cells + c]
            if n_mean[c] == 0:
                mean[c] = sub_mean[c]
                m2[c] = q
            elif sub_mean[c] == mean[c]:  # (equal infinities too: no NaN)
                m2[c] = m2[c] + q
            else:
                _, mean[c], m2[c] = chan_merge_share(n_mean[c], mean[c], m2[c], k, sub_mean[c], q)
            n_mean[c] += k
        if per_row:
            core = 0
            for c in range(n_cells - 1):
                if sub_n[c] > sub_n[core]:
                    core = c
            _row_cells(xs, cells, lengths[r0:r1], row_n[r0:r1], row_sum[r0:r1], core)
        start += size
        r0 = r1
    cell_high = np.full(n_cells, -np.inf)
    cell_low = np.full(n_cells, np.inf)
    for j in range(4):
        for c in range(n_cells):
            cell_high[c] = max(cell_high[c], high[j * n_cells + c])
            cell_low[c] = min(cell_low[c], low[j * n_cells + c])
    return n_mean, mean, m2, cell_high, cell_low, row_n, row_sum, row_high, row_low, row_total


@njit(**JIT)
def _row_reductions(xs: np.ndarray, lengths: np.ndarray, high: np.ndarray, low: np.ndarray, total: np.ndarray) -> None:
    """Each row's max, min (NaN if it holds a NaN) and float64 sum."""
    bits = xs.view(np.int32)
    high_bits = high.view(np.int32)
    low_bits = low.view(np.int32)
    start = 0
    for r in range(lengths.shape[0]):
        values = xs[start : start + lengths[r]]
        keys = bits[start : start + lengths[r]]
        top = NEG_INF_KEY
        bottom = POS_INF_KEY
        acc = 0.0
        nan = 0
        for t in range(values.shape[0]):
            key = order_key(keys[t])
            top = max(top, key)
            bottom = min(bottom, key)
            v = values[t]
            acc += np.float64(v)
            nan += v != v
        high_bits[r] = order_key(top)
        low_bits[r] = order_key(bottom)
        if nan:
            high[r] = low[r] = np.nan
        total[r] = acc
        start += lengths[r]


@njit(**JIT)
def _first_pass(
    xs: np.ndarray,
    cells: np.ndarray,
    table: np.ndarray,
    edges: np.ndarray,
    n_cells: int,
    extremes: bool,
    histogram: int,
    hist: np.ndarray,
    count: np.ndarray,
    total: np.ndarray,
    high: np.ndarray,
    low: np.ndarray,
) -> None:
    """Each token's cell, and per cell (four interleaved copies) its count, sum and extremes; the histogram."""
    nan_cell = n_cells - 1
    bits = xs.view(np.uint32)
    for t in range(xs.shape[0]):
        v = xs[t]
        b = bits[t] >> SHIFT
        c = np.int64(table[b])
        if c == AMBIGUOUS:
            c = _locate(v, edges, nan_cell)
        cells[t] = c
        k = (t & 3) * n_cells + c
        f = np.float64(v)
        count[k] += 1
        total[k] += f
        if extremes:
            if f > high[k]:
                high[k] = f
            if f < low[k]:
                low[k] = f
        if histogram:
            h = b & (BUCKETS - 1)
            if histogram == HISTOGRAM_CLAMPED and v < 0:
                h = 0
            hist[(t & 3) * BUCKETS + h] += 1


@njit(**JIT)
def _row_cells(
    xs: np.ndarray, cells: np.ndarray, lengths: np.ndarray, row_n: np.ndarray, row_sum: np.ndarray, core: int
) -> None:
    """Per row and cell: count and float64 sum. Most tokens lie in one cell, ``core``: its sums are a masked
    sum (vectorized), the other cells' a scatter."""
    start = 0
    for r in range(lengths.shape[0]):
        length = lengths[r]
        values = xs[start : start + length]
        where = cells[start : start + length]
        inside = 0.0
        for t in range(values.shape[0]):
            inside += np.float64(values[t]) if where[t] == core else 0.0
        others = 0
        for t in range(values.shape[0]):
            c = np.int64(where[t])
            if c != core:
                row_n[r, c] += 1
                row_sum[r, c] += np.float64(values[t])
                others += 1
        row_n[r, core] = length - others
        row_sum[r, core] = inside
        start += length
