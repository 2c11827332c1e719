"""The encoding the sweep's kernel (``rcdiag.kernels.sweep``) works in: the cell table's buckets of float32 bit
patterns, the histogram modes and sizes. Plain constants, without numba, so the sweep feature and its state
layout (``rcdiag.engine.state_files.state_layout``) can name them without compiling anything."""

from __future__ import annotations

SHIFT = 15
"""Bits dropped from a float32's pattern to index the cell table: 8 mantissa bits remain, 256 buckets per power
of two, which are also the recommendations' histogram buckets (``rcdiag.sweep.collector``, without the sign)."""
TABLE_SIZE = 1 << (32 - SHIFT)
"""Entries of the cell table (``rcdiag.sweep.cells``): one per bucket of float32 bit patterns."""
BUCKETS = 1 << (31 - SHIFT)
"""Buckets of the recommendations' histogram: the sign bit dropped (every statistic there is >= 0, or NaN)."""
NO_HISTOGRAM, HISTOGRAM, HISTOGRAM_CLAMPED = 0, 1, 2
"""What a statistic's pass (``Cells.scan``) adds to the collector's histogram: nothing; the bucket of ``|x|``
(the sign bit dropped: statistics >= 0, and k1 whose absolute value decides); the bucket of ``max(x, 0)`` (k3,
which float32 may round below 0)."""
SUB_BLOCK = 1 << 15
"""Tokens per sub-block of the sweep's pass (whole rows): its values and cells stay in the core's cache between the
kernel's two passes; each cell's M2 is centred on its sub-block's mean (the array twin, ``rcdiag.sweep.scan_arrays``,
cuts the same sub-blocks)."""
AMBIGUOUS = 0xFFFF
"""A table entry whose bucket holds an edge: its tokens are located by comparison with every edge."""


def layout() -> dict[str, int]:
    """The constants a saved sweep state depends on (the collector's histogram is in these buckets); read when
    called, so a changed one shows."""
    return {
        "SHIFT": SHIFT,
        "TABLE_SIZE": TABLE_SIZE,
        "BUCKETS": BUCKETS,
        "HISTOGRAM": HISTOGRAM,
        "HISTOGRAM_CLAMPED": HISTOGRAM_CLAMPED,
    }
