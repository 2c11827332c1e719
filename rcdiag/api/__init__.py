"""The library layer: every entry point a user or the CLI calls, above the features it drives. Nothing here imports
typer or rich.

* ``analysis``: ``analyze`` (a dump, its sections, the report, their files, the verdict's second pass),
  ``analyze_chunks``, ``with_defaults``;
* ``reading``: the one engine entry (``accumulate``, ``accumulate_chunks``, ``merge_files``), which every command
  reads through;
* ``report``: a state -> the typed report (``build_report``, ``input_facts``);
* ``second_pass``: ``complete_verdict``, what a verdict leaves open measured on the dump;
* ``merging``: ``merge`` (the report of the kind the states declare), ``merge_states``;
* ``checking``, ``comparing``, ``sweeping``: ``check``, ``compare`` and ``compare_many``, ``sweep``, ``sweep_chunks``
  and ``merge_sweep_states``, imported when first asked for (a plain analyze does not pay for them); also offered
  where users import them (``rcdiag.check.check``, ``rcdiag.compare.compare``, ``rcdiag.sweep.sweep``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rcdiag.api.analysis import analyze, analyze_chunks, with_defaults, write_sections
from rcdiag.api.progress import ProgressCallback, ReadProgress
from rcdiag.api.reading import Accumulated, accumulate, accumulate_chunks, merge_files
from rcdiag.api.report import analyze_state, build_report, input_facts
from rcdiag.api.second_pass import complete_verdict, with_history
from rcdiag.runtime.lazy import exports

_LATER = {
    "merge": "rcdiag.api.merging",
    "merge_states": "rcdiag.api.merging",
    "check": "rcdiag.api.checking",
    "compare": "rcdiag.api.comparing",
    "compare_many": "rcdiag.api.comparing",
    "sweep": "rcdiag.api.sweeping",
    "sweep_chunks": "rcdiag.api.sweeping",
    "merge_sweep_states": "rcdiag.api.sweeping",
}
"""Entry points imported when first asked for."""

__all__ = [
    "Accumulated",
    "ProgressCallback",
    "ReadProgress",
    "accumulate",
    "accumulate_chunks",
    "analyze",
    "analyze_chunks",
    "analyze_state",
    "build_report",
    "complete_verdict",
    "input_facts",
    "merge_files",
    "with_defaults",
    "with_history",
    "write_sections",
    *_LATER,
]

if TYPE_CHECKING:
    from rcdiag.api.checking import check  # noqa: F401
    from rcdiag.api.comparing import compare, compare_many  # noqa: F401
    from rcdiag.api.merging import merge, merge_states  # noqa: F401
    from rcdiag.api.sweeping import merge_sweep_states, sweep, sweep_chunks  # noqa: F401

__getattr__ = exports(__name__, _LATER)
