"""The catalogue: every metric and every finding rcdiag reports, declared once as plain frozen records.

Renderers, readings, check's name hints and packs, the health rules and the docs tests all read these tables;
a new metric or finding is one entry here (plus the accumulator that computes it). Imports no typer or rich.
"""

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
