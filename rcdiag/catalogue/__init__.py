"""The catalogue: every metric and every finding rcdiag reports, declared once as plain frozen records.

Renderers, readings, check's name hints and packs, the health rules and the docs tests all read these tables;
a new metric or finding is one entry here (plus the accumulator that computes it). Imports no typer or rich.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rcdiag.catalogue.findings import FINDINGS, FindingSpec, codes_for, finding
    from rcdiag.catalogue.metrics import (
        EXTRA_PREFIX,
        METRICS,
        PREFIX,
        Band,
        MetricSpec,
        Threshold,
        every_key,
        full_key,
        metric,
        reading,
        short_key,
    )

__all__ = [
    "EXTRA_PREFIX",
    "FINDINGS",
    "METRICS",
    "PREFIX",
    "Band",
    "FindingSpec",
    "MetricSpec",
    "Threshold",
    "codes_for",
    "every_key",
    "finding",
    "full_key",
    "metric",
    "reading",
    "short_key",
]


def __getattr__(name: str) -> Any:
    """The tables on first use: ``rcdiag --help`` reads the metrics' packs, not the findings (which import
    ``rcdiag.report``), so neither submodule is imported for the package alone."""
    if name in __all__:
        module = "findings" if name in ("FINDINGS", "FindingSpec", "codes_for", "finding") else "metrics"
        return getattr(importlib.import_module(f"rcdiag.catalogue.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
