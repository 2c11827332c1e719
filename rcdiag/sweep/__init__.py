"""``rcdiag sweep``: every threshold of every IS level and RS option in one pass over a dump, recommended
thresholds and verl's presets ranked (docs/sweep.md).

    >>> from rcdiag.sweep import sweep, build_grid
    >>> report = sweep("sample_data/healthy.parquet", build_grid(rs_options=["seq_mean_k1"]))  # doctest: +SKIP

This package holds the sweep's state, accumulators and report (``build``: the report from a state); ``sweep``,
``sweep_chunks`` and ``merge_sweep_states``, which read a dump or saved states, are the library's
(``rcdiag.api.sweeping``), importable from here too.
"""

from __future__ import annotations

from rcdiag.runtime.lazy import exports
from rcdiag.sweep.grid import DEFAULT_GRIDS, SweepGrid, build_grid
from rcdiag.sweep.sweep_report import Recommendation, SweepReport, SweepRow

__all__ = [
    "DEFAULT_GRIDS",
    "Recommendation",
    "SweepGrid",
    "SweepReport",
    "SweepRow",
    "build_grid",
]

_API = {"sweep": "rcdiag.api", "sweep_chunks": "rcdiag.api", "merge_sweep_states": "rcdiag.api"}
"""The library's entry points users import from here (``from rcdiag.sweep import sweep``), found in the library layer
(``rcdiag.api.sweeping``) when first asked for: this package never imports the layer above it
(tests/lint/test_layering.py pins these names)."""

__getattr__ = exports(__name__, _API)
