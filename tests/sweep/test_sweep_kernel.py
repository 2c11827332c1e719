"""The sweep's compiled pass over a token statistic (``Cells.scan``, ``rcdiag.kernels.sweep``) against a numpy
brute force: each token's cell by binary search, per-cell and per-row sums by masks, extremes by Python loops, the
collector's histogram by its own numpy bucketing; per-row extremes and sums by loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sweep_blocks import blocks

from rcdiag.kernels.sweep import SUB_BLOCK
from rcdiag.metrics.base import MomentArrays
from rcdiag.sweep.cells import HISTOGRAM, HISTOGRAM_CLAMPED, NO_HISTOGRAM, Cells
from rcdiag.sweep.collector import BUCKETS, bucket


def brute_cells(x: np.ndarray, cells: Cells) -> np.ndarray:
    """Each value's cell: edges below plus edges at or below (``searchsorted`` both sides); NaN last."""
    index = np.searchsorted(cells.edges, x, side="left") + np.searchsorted(cells.edges, x, side="right")
    return np.where(np.isnan(x), cells.nan_cell, index)


def _same(got: float, want: float, rel: float = 1e-12, abs_tol: float = 1e-300) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol)


def check_scan(x: np.ndarray, lengths: np.ndarray, edges: list[float], nan_values: bool, mode: int) -> None:
    cells = Cells(edges)
    counts = np.zeros(4 * BUCKETS, dtype=np.int64)
    found = cells.scan(x, lengths, per_row=True, histogram=(mode, counts), nan_values=nan_values)
    where = brute_cells(x, cells)
    arrays = found.arrays
    for cell in range(cells.count):
        values = x[where == cell].astype(np.float64)
        assert arrays.n[cell] == values.shape[0], cell
        if cell == cells.nan_cell:
            if nan_values and values.size:
                assert np.isnan([arrays.mean[cell], arrays.m2[cell], arrays.max[cell], arrays.min[cell]]).all()
            else:
                assert (arrays.mean[cell], arrays.m2[cell]) == (0.0, 0.0)
            continue
        if not values.size:
            continue
        mean = math.fsum(values.tolist()) / values.shape[0] if np.isfinite(values).all() else float(np.mean(values))
        scale = float(np.abs(values).mean())  # sums that cancel are exact only to the rounding of their terms
        assert _same(arrays.mean[cell], mean, abs_tol=1e-15 * scale), (cell, arrays.mean[cell], mean)
        if np.isfinite(values).all():
            m2 = math.fsum(((values - mean) ** 2).tolist())
            assert _same(arrays.m2[cell], m2, rel=1e-9, abs_tol=1e-12 * max(1.0, mean * mean)), (cell, m2)
        if nan_values:
            assert (arrays.max[cell], arrays.min[cell]) == (max(values.tolist()), min(values.tolist()))
    start = 0
    for row, length in enumerate(lengths.tolist()):
        values = x[start : start + length]
        row_cells = where[start : start + length]
        finite = values[~np.isnan(values)].tolist()
        has_nan = bool(np.isnan(values).any())
        want_max = math.nan if has_nan else max(finite, default=-math.inf)
        want_min = math.nan if has_nan else min(finite, default=math.inf)
        assert _same(float(found.row_max[row]), want_max) and _same(float(found.row_min[row]), want_min), row
        total = values.astype(np.float64)
        want = math.fsum(total.tolist()) if np.isfinite(total).all() else float(np.sum(total))
        assert _same(found.row_total[row], want, abs_tol=1e-15 * float(np.abs(total).sum())), row
        assert found.row_counts is not None and found.row_sums is not None
        for cell in range(cells.count):
            own = values[row_cells == cell].astype(np.float64)
            assert found.row_counts[row, cell] == own.shape[0]
            want = math.fsum(own.tolist()) if np.isfinite(own).all() else float(np.sum(own))
            assert _same(found.row_sums[row, cell], want, abs_tol=1e-15 * float(np.abs(own).sum())), (row, cell)
        start += length
    folded = counts.reshape(4, BUCKETS).sum(axis=0)
    if mode == NO_HISTOGRAM:
        assert not folded.any()
    else:
        stat = np.abs(x) if mode == HISTOGRAM else x  # k1 is bucketed by its absolute value
        want = np.bincount(bucket(stat, nonnegative=mode == HISTOGRAM), minlength=BUCKETS)
        assert np.array_equal(folded, want)


pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@settings(max_examples=150, deadline=None)
@given(
    block=blocks(),
    nan_values=st.booleans(),
    mode=st.sampled_from([NO_HISTOGRAM, HISTOGRAM, HISTOGRAM_CLAMPED]),
)
def test_scan_equals_brute_force(block: tuple, nan_values: bool, mode: int) -> None:
    check_scan(*block, nan_values, mode)


@settings(max_examples=8, deadline=None)
@given(block=blocks(long=True))
def test_scan_across_sub_blocks_equals_brute_force(block: tuple) -> None:
    x, lengths, edges = block
    assert x.shape[0] <= 12 * 6000 and SUB_BLOCK < 12 * 6000
    check_scan(x, lengths, edges, nan_values=True, mode=HISTOGRAM)


@settings(max_examples=40, deadline=None)
@given(block=blocks(), cut=st.integers(0, 12))
def test_scanning_parts_and_merging_equals_one_scan(block: tuple, cut: int) -> None:
    """Rows split between two blocks: the merged per-cell state equals one pass over all of them."""
    x, lengths, edges = block
    x = x[~np.isnan(x)] if x.size else x  # the NaN cell's moments are NaN either way
    lengths = np.array([x.shape[0]], dtype=np.int64) if lengths.sum() != x.shape[0] else lengths
    cut = min(cut, lengths.shape[0])
    split = int(lengths[:cut].sum())
    cells = Cells(edges)
    whole = cells.scan(x, lengths, nan_values=True).arrays
    parts = MomentArrays.empty(cells.count)
    parts.merge(cells.scan(x[:split], lengths[:cut], nan_values=True).arrays)
    parts.merge(cells.scan(x[split:], lengths[cut:], nan_values=True).arrays)
    assert np.array_equal(whole.n, parts.n)
    assert np.array_equal(whole.max, parts.max) and np.array_equal(whole.min, parts.min)
    finite = np.isfinite(whole.mean) & np.isfinite(parts.mean)
    assert np.allclose(whole.mean[finite], parts.mean[finite], rtol=1e-12, atol=0)
    assert np.allclose(whole.m2[finite], parts.m2[finite], rtol=1e-9, atol=1e-15)


@settings(max_examples=6, deadline=None)
@given(
    sizes=st.lists(st.integers(SUB_BLOCK // 2 + 1, SUB_BLOCK), min_size=2, max_size=4), seed=st.integers(0, 2**32 - 1)
)
def test_scan_merges_sub_blocks_with_shifted_means(sizes: list[int], seed: int) -> None:
    """Rows longer than half a sub-block: each row is its own sub-block, so the per-cell moments are combined
    across sub-blocks (Chan's merge). Each row is shifted to its own mean inside one wide cell, so the merge's
    delta^2 term carries most of that cell's M2 (dropping it, or weighting it wrongly, fails the brute force)."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(sizes, dtype=np.int64)
    assert (lengths > SUB_BLOCK // 2).all() and int(lengths.sum()) > SUB_BLOCK  # no two rows share a sub-block
    shifts = (-1.5, 0.3, 2.0, -0.2)
    x = np.concatenate([rng.normal(shifts[i], 0.05, n) for i, n in enumerate(sizes)]).astype(np.float32)
    check_scan(x, lengths, [-3.0, 3.0], nan_values=False, mode=NO_HISTOGRAM)  # every value in the middle cell
    check_scan(x, lengths, [-0.1, 0.0, 0.1, 1.5], nan_values=False, mode=HISTOGRAM)
