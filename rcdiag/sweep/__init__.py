"""``rcdiag sweep``: every threshold of every IS level and RS option in one pass over a dump, recommended
thresholds and verl's presets ranked (docs/sweep.md).

    >>> from rcdiag.sweep import sweep, build_grid
    >>> report = sweep("sample_data/healthy.parquet", build_grid(rs_options=["seq_mean_k1"]))  # doctest: +SKIP
"""

from rcdiag.sweep.grid import DEFAULT_GRIDS, SweepGrid, build_grid
from rcdiag.sweep.run import merge_sweep_states, sweep, sweep_chunks
from rcdiag.sweep.sweep_report import Recommendation, SweepReport, SweepRow

__all__ = [
    "DEFAULT_GRIDS",
    "Recommendation",
    "SweepGrid",
    "SweepReport",
    "SweepRow",
    "build_grid",
    "merge_sweep_states",
    "sweep",
    "sweep_chunks",
]
