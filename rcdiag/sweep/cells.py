"""Exact per-interval statistics of one per-token statistic against a sorted set of threshold edges.

The edges ``E_0 < ... < E_{m-1}`` (float32 values, the thresholds as verl compares them) cut the real line into
cells ordered by value: ``O_0 = (-inf, E_0)``, ``P_0 = {E_0}``, ``O_1 = (E_0, E_1)``, ..., ``O_m = (E_{m-1}, inf)``,
plus a cell for NaN. Every token of a cell lies on the same side of every threshold, so a cell's count, moments
(count, mean, M2), extremes and per-row sums give, for every threshold at once, exactly the counts above and
below it and the moments of the clamped (``min(w, U)``), IcePop'd (zero outside ``[L, U]``) or clipped values:
a clamped value is the token itself or a constant, cell by cell. Cell index ``left + right`` of the two
``searchsorted`` sides is that order (even: open interval, odd: an edge itself).

Two ways to fill the cells of a block: ``sorted_arrays`` sorts the block (3 ns a value) and finds each cell as a
contiguous run (token RS options, whose dense grids spread tokens over many cells); ``split`` + ``block_arrays``
keep each token's cell, which token IS needs for its per-response sums: most tokens fall into one open cell (the
"core", around a ratio of 1), handled with two comparisons and a compaction, and only the tail is located, with
two comparisons per edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rcdiag.backend import NumpyBackend
from rcdiag.metrics.base import Moments

_NP = NumpyBackend()


@dataclass
class CellArrays:
    """Mergeable per-cell state: count, moments, max and min (float64 arrays of ``2m + 2`` cells, NaN last)."""

    n: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    max: np.ndarray
    min: np.ndarray

    @classmethod
    def empty(cls, cells: int) -> CellArrays:
        zeros = np.zeros(cells)
        return cls(zeros, zeros.copy(), zeros.copy(), np.full(cells, -np.inf), np.full(cells, np.inf))

    def merge(self, other: CellArrays) -> None:
        """Chan et al.'s pairwise update, cell by cell (the NaN cell only counts)."""
        n = self.n + other.n
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = other.mean - self.mean
            share = np.where(n > 0, other.n / np.where(n > 0, n, 1.0), 0.0)
            mean = np.where(self.n == 0, other.mean, np.where(other.n == 0, self.mean, self.mean + delta * share))
            m2 = self.m2 + other.m2 + np.where((self.n > 0) & (other.n > 0), delta * delta * self.n * share, 0.0)
        self.n, self.mean, self.m2 = n, mean, m2
        self.max = np.maximum(self.max, other.max)  # only the NaN cell holds NaN, and must keep it
        self.min = np.minimum(self.min, other.min)

    def state_dict(self) -> dict[str, list[float]]:
        return {name: getattr(self, name).tolist() for name in ("n", "mean", "m2", "max", "min")}

    @classmethod
    def from_state_dict(cls, state: dict[str, list[float]]) -> CellArrays:
        return cls(*(np.asarray(state[name], dtype=np.float64) for name in ("n", "mean", "m2", "max", "min")))


class Cells:
    """The cell layout of one statistic: its edges and which open cell is the core."""

    def __init__(self, edges: list[float], reference: float) -> None:
        self.edges = np.asarray(sorted(set(edges)), dtype=np.float32)
        self.m = int(self.edges.shape[0])
        self.count = 2 * self.m + 2
        self.nan_cell = 2 * self.m + 1
        # The default core (small blocks): the open cell holding the reference value (the one above it if it
        # is an edge).
        self.core_open = int(np.searchsorted(self.edges, np.float32(reference), side="right"))
        self.index = {float(e): i for i, e in enumerate(self.edges.tolist())}

    def point(self, value: float) -> int:
        """The cell of an edge value."""
        return 2 * self.index[value] + 1

    def split(self, x: np.ndarray) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """``(core cell, core mask, tail positions, tail cells)`` of a block's values.

        The core is the open cell most of an evenly spaced sample of the block falls into; the tail is located
        with two comparisons per edge (a few tenths of a nanosecond each, against ~50 ns per value for a
        binary search over unsorted values)."""
        j, e = self._core_of(x), self.edges
        if self.m == 0:
            core = ~np.isnan(x)
        elif j == 0:
            core = x < e[0]
        elif j == self.m:
            core = x > e[-1]
        else:
            core = (x > e[j - 1]) & (x < e[j])
        tail = np.flatnonzero(~core)
        values = x[tail]
        small = np.zeros(values.shape[0], dtype=np.uint8 if self.count < 256 else np.intp)
        scratch = np.empty(values.shape[0], dtype=bool)
        for edge in e:
            small += np.greater_equal(values, edge, out=scratch)
            small += np.greater(values, edge, out=scratch)
        cells = small.astype(np.intp)
        cells[np.isnan(values)] = self.nan_cell
        return 2 * j, core, tail, cells

    def _core_of(self, x: np.ndarray) -> int:
        """The open cell holding most of a sample of ``x`` (the reference cell for a small block)."""
        sample = x[:: max(1, x.shape[0] // 1024)]
        sample = sample[~np.isnan(sample)]
        if sample.shape[0] < 64:
            return self.core_open
        cells = np.searchsorted(self.edges, sample, side="left") + np.searchsorted(self.edges, sample, side="right")
        counts = np.bincount(cells, minlength=self.count)[0 : self.count - 1 : 2]  # open cells only
        return int(np.argmax(counts))

    def sorted_arrays(self, x: np.ndarray) -> CellArrays:
        """This block's per-cell state from the sorted values (no per-token cell needed): each cell is a
        contiguous run, found by locating the edges in the sorted block (NaN sorts last)."""
        out = CellArrays.empty(self.count)
        if not x.size:
            return out
        ordered = np.sort(x)
        finite = int(np.searchsorted(ordered, np.float32(np.inf), side="right"))
        bounds = np.empty(self.count + 1, dtype=np.int64)
        bounds[0], bounds[-2], bounds[-1] = 0, finite, x.shape[0]
        bounds[1:-2:2] = np.searchsorted(ordered[:finite], self.edges, side="left")
        bounds[2:-2:2] = np.searchsorted(ordered[:finite], self.edges, side="right")
        n = np.diff(bounds).astype(np.float64)
        out.n = n
        for cell in np.flatnonzero(n[:-1] > 0).tolist():  # the NaN cell only counts
            run = ordered[bounds[cell] : bounds[cell + 1]]
            _, out.mean[cell], out.m2[cell] = _NP.moments(run)  # centred on the cell's own mean, as analyze's
            out.min[cell], out.max[cell] = float(run[0]), float(run[-1])
        return out

    def block_arrays(
        self, x: np.ndarray, core_cell: int, core: np.ndarray, tail: np.ndarray, cells: np.ndarray
    ) -> CellArrays:
        """This block's per-cell state."""
        out = CellArrays.empty(self.count)
        values = x[tail].astype(np.float64)
        if values.size:
            n = np.bincount(cells, minlength=self.count).astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.bincount(cells, weights=values, minlength=self.count) / np.where(n > 0, n, 1.0)
            out.n, out.mean = n, mean
            out.m2 = np.bincount(cells, weights=(values - mean[cells]) ** 2, minlength=self.count).astype(float)
            np.maximum.at(out.max, cells, values)
            np.minimum.at(out.min, cells, values)
        inner = x[core]
        if inner.size:
            n_core, mean_core, m2_core = _NP.moments(inner)
            out.n[core_cell], out.mean[core_cell], out.m2[core_cell] = n_core, mean_core, m2_core
            out.max[core_cell], out.min[core_cell] = float(inner.max()), float(inner.min())
        return out


@dataclass(frozen=True)
class CellMap:
    """What a threshold does to each cell: keep the token's own value, or replace it by a constant."""

    own: np.ndarray
    """Boolean per cell."""
    value: np.ndarray
    """The constant for cells that are not ``own``."""

    def moments(self, cells: CellArrays) -> Moments:
        """Moments of the mapped values (own cells combined exactly, constant cells as point masses)."""
        keep = self.own & (cells.n > 0)
        total = Moments()
        if keep.any():
            n, mean, m2 = cells.n[keep], cells.mean[keep], cells.m2[keep]
            count = float(n.sum())
            centre = float((n * mean).sum() / count)
            total = Moments(count, centre, float(m2.sum() + (n * (mean - centre) ** 2).sum()))
        for cell in np.flatnonzero(~self.own & (cells.n > 0)):
            total = total.merge(Moments(float(cells.n[cell]), float(self.value[cell]), 0.0))
        return total

    def extreme(self, cells: CellArrays, largest: bool) -> float:
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
    """``clip(x, lo, hi)`` (``lo`` None: ``min(x, hi)``); NaN stays NaN."""
    index = np.arange(cells.count)
    value = np.zeros(cells.count)
    below = index < cells.point(lo) if lo is not None else np.zeros(cells.count, dtype=bool)
    above = (index > cells.point(hi)) & (index != cells.nan_cell)
    value[below] = lo if lo is not None else 0.0
    value[above] = hi
    return CellMap(~(below | above), value)


def band_map(cells: Cells, lo: float, hi: float) -> CellMap:
    """IcePop: the value inside ``[lo, hi]`` (inclusive), 0 outside and for NaN."""
    index = np.arange(cells.count)
    inside = (index >= cells.point(lo)) & (index <= cells.point(hi))
    return CellMap(inside, np.zeros(cells.count))


def count_above(cells: Cells, arrays: CellArrays, value: float) -> float:
    """Tokens strictly above an edge (NaN excluded)."""
    return float(arrays.n[cells.point(value) + 1 : cells.nan_cell].sum())


def count_below(cells: Cells, arrays: CellArrays, value: float) -> float:
    """Tokens strictly below an edge."""
    return float(arrays.n[: cells.point(value)].sum())
