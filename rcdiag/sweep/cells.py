"""Exact per-interval statistics of one per-token statistic against a sorted set of threshold edges.

The edges ``E_0 < ... < E_{m-1}`` (float32 values, the thresholds as verl compares them) cut the real line into
cells ordered by value: ``O_0 = (-inf, E_0)``, ``P_0 = {E_0}``, ``O_1 = (E_0, E_1)``, ..., ``O_m = (E_{m-1}, inf)``,
plus a cell for NaN. Every token of a cell lies on the same side of every threshold, so a cell's count, moments
(count, mean, M2), extremes and per-row sums give, for every threshold at once, exactly the counts above and
below it and the moments of the clamped (``min(w, U)``), IcePop'd (zero outside ``[L, U]``) or clipped values:
a clamped value is the token itself or a constant, cell by cell. Cell index ``left + right`` of the two
``searchsorted`` sides is that order (even: open interval, odd: an edge itself).

``Cells.scan`` fills the cells of a block in one compiled pass (``rcdiag.kernels.sweep``): each token's cell
from a table over its float32 bit pattern, the cells' counts, sums and extremes, then their centred sums of
squares; per row as well for token IS (its per-response sums), and the recommendations' histogram on the way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from rcdiag.kernels.sweep_encoding import AMBIGUOUS, HISTOGRAM, HISTOGRAM_CLAMPED, NO_HISTOGRAM, SHIFT, TABLE_SIZE
from rcdiag.metrics.base import MomentArrays, Moments

if TYPE_CHECKING:
    from rcdiag.metrics.backend import Backend
    from rcdiag.metrics.block import Block

T = TypeVar("T")

__all__ = ["HISTOGRAM", "HISTOGRAM_CLAMPED", "NO_HISTOGRAM", "SHIFT"]  # the kernel's encoding, named here too


class Cells:
    """The cell layout of one statistic: its edges."""

    def __init__(self, edges: list[float]) -> None:
        self.edges = np.asarray(sorted(set(edges)), dtype=np.float32)
        self.m = int(self.edges.shape[0])
        self.count = 2 * self.m + 2
        self.nan_cell = 2 * self.m + 1
        self.index = {float(e): i for i, e in enumerate(self.edges.tolist())}

    def point(self, value: float) -> int:
        """The cell of an edge value."""
        return 2 * self.index[value] + 1

    @property
    def table(self) -> np.ndarray:
        """The cell of every float32 bucket (``rcdiag.kernels.sweep``), shared by every ``Cells`` with these edges."""
        return _cell_table(self.edges.tobytes())

    def scan(
        self,
        x: np.ndarray,
        lengths: np.ndarray,
        per_row: bool = False,
        histogram: tuple[int, np.ndarray] | None = None,
        nan_values: bool = False,
        backend: Backend | None = None,
    ) -> TokenScan:
        """One statistic's pass over a block (``x`` float32, rows of ``lengths`` tokens): the per-cell state, and
        with ``per_row`` the per-(row, cell) counts and sums; ``histogram``: the collector's mode and counts,
        which the pass adds the block's tokens to. The NaN cell only counts (and the extremes are left out),
        unless ``nan_values`` (token IS: a NaN ratio makes verl's weights' statistics NaN): then the cells'
        extremes are kept, and the NaN cell's mean, M2 and extremes are NaN when it holds a token. ``backend``: a
        backend without the kernels (``uses_kernel``), whose arrays ``x`` are, takes the array twin."""
        rows = np.asarray(lengths).astype(np.int64, copy=False)
        mode, counts = histogram if histogram is not None else (NO_HISTOGRAM, _NO_COUNTS)
        if backend is None or uses_kernel(backend):
            from rcdiag.kernels.sweep import scan

            x = np.ascontiguousarray(x if backend is None else backend.to_numpy(x), dtype=np.float32)
            found = scan(x, rows, self.table, self.edges, self.count, nan_values, per_row, mode, counts)
        else:
            from rcdiag.sweep import scan_arrays

            args = (self.edges, self.count, nan_values, per_row, mode, counts)
            found = scan_arrays.scan(backend, x, rows, *args, self.table)
        n, mean, m2, high, low, row_n, row_sum, row_max, row_min, row_total = found
        arrays = MomentArrays(n.astype(np.float64), mean, m2, high, low)
        nan = self.nan_cell
        if nan_values and n[nan] > 0:
            arrays.mean[nan] = arrays.m2[nan] = arrays.max[nan] = arrays.min[nan] = np.nan
        else:
            arrays.mean[nan] = arrays.m2[nan] = 0.0
        return TokenScan(
            arrays,
            row_n.astype(np.float64) if per_row else None,
            row_sum if per_row else None,
            row_max,
            row_min,
            row_total,
        )


@dataclass
class TokenScan:
    """What one pass over a block's statistic gives (``Cells.scan``)."""

    arrays: MomentArrays
    row_counts: np.ndarray | None
    """Rows x cells: tokens of each row in each cell (float64)."""
    row_sums: np.ndarray | None
    """Rows x cells: the float64 sum of each row's values in each cell (NaN in the NaN cell of a row holding one)."""
    row_max: np.ndarray
    """Each row's largest value (float32; -inf for an empty row, NaN for a row holding NaN)."""
    row_min: np.ndarray
    row_total: np.ndarray
    """Each row's float64 sum (0 for an empty row)."""


_NO_COUNTS = np.zeros(0, dtype=np.int64)


NO_EDGES = Cells([])
"""The cells of a statistic only the collector's histogram needs."""


class Passes:
    """The per-token passes of a sweep: one per statistic that a token option's cells (``cells``, per row for token
    IS) or the collector's histogram (``histograms``: its mode and the counts the pass adds to) need, run once per
    block whichever accumulator asks first (``scans``). One object per sweep state: its batches share the grid."""

    def __init__(self) -> None:
        self.cells: dict[str, Cells] = {}
        self.histograms: dict[str, tuple[int, np.ndarray]] = {}
        self._shared: dict[Hashable, Any] = {}

    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """What ``make`` gives, made on the first call for ``key``: an option's cells, maps and bounds, the same for
        every step's accumulator of it, made once per sweep state rather than once per step (a sweep holds every
        step's batch until its report is built)."""
        found = self._shared.get(key)
        if found is None:
            found = self._shared[key] = make()
        return found

    def scans(self, block: Block) -> dict[str, TokenScan]:
        """Every pass over ``block`` (computed on the first call for this block; the histograms counted then)."""
        return block.once(_scan_all, self)


def uses_kernel(backend: Backend) -> bool:
    """Whether the sweep's pass runs the numba kernel on this backend (the compiled numpy backend), or the array
    twin (``rcdiag.sweep.scan_arrays``: a small dump's numpy path, which imports no numba, and torch, whose blocks
    stay on the device)."""
    from rcdiag.metrics.backend import NumpyBackend

    return isinstance(backend, NumpyBackend) and backend.compiled


def _scan_all(block: Block, passes: Passes) -> dict[str, TokenScan]:
    b = block.b
    lengths = b.to_numpy(block.row_len).astype(np.int64)
    scans = {}
    for statistic in dict.fromkeys([*passes.cells, *passes.histograms]):
        ratio = statistic == "ratio"
        values = block.ratio if ratio else statistic_of(block, statistic)
        cells = passes.cells.get(statistic)
        found = (cells or NO_EDGES).scan(
            values, lengths, ratio and cells is not None, passes.histograms.get(statistic), nan_values=ratio, backend=b
        )
        scans[statistic] = found
    return scans


def statistic_of(block: Block, estimator: str) -> Any:
    """The block's k statistic; k1 as the negated clamped log-ratio the block already holds (its definition),
    so no k1 array is built for the sweep alone."""
    return -block.lr_safe if estimator == "k1" else block.k(_HIGHER[estimator])


_HIGHER: dict[str, Literal["k2", "k3"]] = {"k2": "k2", "k3": "k3"}


@functools.lru_cache(maxsize=64)
def _cell_table(edges: bytes) -> np.ndarray:
    """For each bucket of float32 bit patterns (``bits >> SHIFT``, an interval of values), its cell when the whole
    interval lies in one, ``AMBIGUOUS`` when an edge lies within it (or it holds both NaN and a number)."""
    e = np.frombuffer(edges, dtype=np.float32)
    nan_cell = 2 * e.shape[0] + 1
    if nan_cell >= AMBIGUOUS:
        raise ValueError(f"{e.shape[0]} thresholds' edges are more than a sweep's cell table holds")
    first = np.arange(TABLE_SIZE, dtype=np.uint32) << SHIFT
    ends = [first.view(np.float32), (first | np.uint32((1 << SHIFT) - 1)).view(np.float32)]
    low, high = (np.searchsorted(e, v, side="left") + np.searchsorted(e, v, side="right") for v in ends)
    nan_low, nan_high = np.isnan(ends[0]), np.isnan(ends[1])
    table = np.where((low == high) & ~nan_low & ~nan_high, low, AMBIGUOUS).astype(np.uint16)
    table[nan_low & nan_high] = nan_cell
    return table


@dataclass(frozen=True)
class CellMap:
    """What a threshold does to each cell: keep the token's own value, or replace it by a constant."""

    own: np.ndarray
    """Boolean per cell."""
    value: np.ndarray
    """The constant for cells that are not ``own``."""

    def moments(self, cells: MomentArrays) -> Moments:
        """Moments of the mapped values: every present cell is a group (its own values' moments, or a point mass
        at its constant), the groups combined in closed form (Chan et al., all at once)."""
        present = cells.n > 0
        if not present.any():
            return Moments()
        n = cells.n[present]
        mean = np.where(self.own, cells.mean, self.value)[present]
        m2 = np.where(self.own, cells.m2, 0.0)[present]
        count = float(n.sum())
        centre = float((n * mean).sum() / count)
        return Moments(count, centre, float(m2.sum() + (n * (mean - centre) ** 2).sum()))

    def extreme(self, cells: MomentArrays, largest: bool) -> float:
        """Max (or min) of the mapped values; NaN propagates like torch's max."""
        present = cells.n > 0
        own = self.own & present
        candidates = [*(cells.max[own] if largest else cells.min[own]), *self.value[~self.own & present]]
        if not candidates:
            return -np.inf if largest else np.inf
        array = np.asarray(candidates, dtype=np.float64)
        if np.isnan(array).any():
            return float("nan")
        return float(array.max() if largest else array.min())

    def row_sums(self, own_sums: np.ndarray, row_counts: np.ndarray) -> np.ndarray:
        """Per-row sums of the mapped values from per-(row, cell) sums and counts (rows x cells)."""
        own = self.own
        total = own_sums[:, own].sum(axis=1) if own.any() else np.zeros(own_sums.shape[0])
        if (~own).any():
            total = total + row_counts[:, ~own] @ self.value[~own]
        return total


def clip_map(cells: Cells, lo: float | None, hi: float) -> CellMap:
    """``clip(x, lo, hi)`` (``lo`` None: ``min(x, hi)``) as torch clamps, ``min(max(x, lo), hi)``: an inverted band
    (``lo > hi``) gives ``hi`` everywhere; NaN stays NaN."""
    index = np.arange(cells.count)
    value = np.zeros(cells.count)
    below = index < cells.point(lo) if lo is not None else np.zeros(cells.count, dtype=bool)
    above = (index > cells.point(hi)) & (index != cells.nan_cell)
    if lo is not None and lo > hi:
        below, above = np.zeros(cells.count, dtype=bool), index != cells.nan_cell
    value[below] = lo if lo is not None else 0.0
    value[above] = hi
    return CellMap(~(below | above), value)


def band_map(cells: Cells, lo: float, hi: float) -> CellMap:
    """IcePop: the value inside ``[lo, hi]`` (inclusive), 0 outside and for NaN."""
    index = np.arange(cells.count)
    inside = (index >= cells.point(lo)) & (index <= cells.point(hi))
    return CellMap(inside, np.zeros(cells.count))


def count_above(cells: Cells, arrays: MomentArrays, value: float) -> float:
    """Tokens strictly above an edge (NaN excluded)."""
    return float(arrays.n[cells.point(value) + 1 : cells.nan_cell].sum())


def count_below(cells: Cells, arrays: MomentArrays, value: float) -> float:
    """Tokens strictly below an edge."""
    return float(arrays.n[: cells.point(value)].sum())
