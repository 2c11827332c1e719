"""The catalogue: every metric and every finding rcdiag reports, declared once as plain frozen records.

Renderers, readings, check's name hints and packs, the health rules and the docs tests all read these tables;
a new metric or finding is one entry here (plus the accumulator that computes it). Imports no typer or rich.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rcdiag.catalogue.emit import emit, ordered
    from rcdiag.catalogue.findings import FINDINGS, Code, FindingSpec, codes_for, finding
    from rcdiag.catalogue.keys import EXTRA_PREFIX, PREFIX, Key
    from rcdiag.catalogue.metrics import (
        METRICS,
        Band,
        MetricSpec,
        Threshold,
        every_key,
        finding_threshold,
        framework_key,
        full_key,
        known_key,
        metric,
        reading,
        rs_key,
        short_key,
    )

__all__ = [
    "EXTRA_PREFIX",
    "FINDINGS",
    "METRICS",
    "PREFIX",
    "Band",
    "Code",
    "FindingSpec",
    "Key",
    "MetricSpec",
    "Threshold",
    "codes_for",
    "emit",
    "every_key",
    "finding",
    "finding_threshold",
    "framework_key",
    "full_key",
    "known_key",
    "metric",
    "ordered",
    "reading",
    "rs_key",
    "short_key",
]


_MODULE = {
    **dict.fromkeys(("FINDINGS", "Code", "FindingSpec", "codes_for", "finding"), "findings"),
    **dict.fromkeys(("emit", "ordered"), "emit"),
    **dict.fromkeys(("Key", "PREFIX", "EXTRA_PREFIX"), "keys"),
}
"""Where each name lives (the rest: ``metrics``)."""


def __getattr__(name: str) -> Any:
    """The tables on first use: no submodule is imported for the package alone (``rcdiag --help`` reads the
    metrics' packs; a command's help the detectors; neither imports ``rcdiag.records.report``, which ``emit`` does)."""
    if name in __all__:
        module = _MODULE.get(name, "metrics")
        return getattr(importlib.import_module(f"rcdiag.catalogue.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
