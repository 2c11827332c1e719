"""The log-ratio histogram's bin edges (``rcdiag.metrics.histogram``) and the table that bins a float32 by its top
16 bits (the numpy backend's ``bin_counts`` and the compiled token pass): both passes and the accumulator read them
here."""

from __future__ import annotations

import numpy as np

TINY_DECADE = -6
HUGE_DECADE = 2
PER_DECADE = 5
_MAGNITUDES = np.float32(10.0) ** (
    np.arange(TINY_DECADE * PER_DECADE, HUGE_DECADE * PER_DECADE + 1, dtype=np.float64) / PER_DECADE
).astype(np.float32)
EDGES: np.ndarray = np.concatenate([-_MAGNITUDES[::-1], _MAGNITUDES]).astype(np.float64)
"""Bin edges, ascending: ``-1e2 ... -1e-6, 1e-6 ... 1e2`` (float32 values held as float64)."""


_BIN_TABLES: dict[bytes, tuple[np.ndarray, np.ndarray] | None] = {}


def bin_table(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For each of the 65,536 values of a float32's top 16 bits (sign, exponent, 7 mantissa bits), the floats
    holding them form one interval: ``base`` is the number of edges at or below its lowest value, ``edge`` the
    one edge inside it (NaN if none; a comparison with NaN is false). Then ``searchsorted(edges, x, "right")`` is
    ``base[cell] + (x >= edge[cell])`` for every non-NaN float32 ``x``. ``None`` (use the binary search) when an
    interval holds two edges or an edge is not a float32 number."""
    key = edges.tobytes()
    if key not in _BIN_TABLES:
        with np.errstate(invalid="ignore"):  # the NaN bit patterns among the cells
            _BIN_TABLES[key] = _build_bin_table(edges)
    return _BIN_TABLES[key]


def _build_bin_table(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    if not np.array_equal(edges.astype(np.float32).astype(edges.dtype), edges) or np.isnan(edges).any():
        return None
    cells = np.arange(1 << 16, dtype=np.uint32) << 16
    ends = np.stack([cells.view(np.float32), (cells | 0xFFFF).view(np.float32)])
    with np.errstate(invalid="ignore"):
        low, high = np.fmin(ends[0], ends[1]), np.fmax(ends[0], ends[1])  # a NaN end: the other one
    base = np.searchsorted(edges, low, side="right")
    inside = np.searchsorted(edges, high, side="right") - base
    if inside.max() > 1:
        return None
    edge = np.full(cells.shape[0], np.nan, dtype=np.float32)
    edge[inside == 1] = edges[base[inside == 1]]
    return base.astype(np.uint8 if edges.shape[0] < 255 else np.intp), edge  # small tables stay in cache
