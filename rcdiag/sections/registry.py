"""The one table of section kinds: which module declares the section saved under each key.

A saved state (``--save-state``) holds each section's accumulator under its key; ``merge`` and a report built from
a state no section object was given for (``rcdiag.api.build_report``) find the kind here, imported when needed (a
plain analyze imports none of them). A new section adds one line.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from rcdiag.sections.base import Section

KINDS: dict[str, tuple[str, str]] = {
    "explain": ("rcdiag.explain.section", "ExplainSection"),
    "detectors": ("rcdiag.explain.detector_section", "DetectorSection"),
    "units": ("rcdiag.sections.units", "UnitsSection"),
    "framework": ("rcdiag.frameworks.section", "FrameworkSection"),
    "exact": ("rcdiag.sections.exact", "ExactSection"),
    "slices": ("rcdiag.sections.slices", "SlicesSection"),
}
"""Each section's key -> (module, class); the class built with no arguments reads a merged state by its defaults."""


def section_kind(key: str) -> type[Section]:
    """The section class saved under ``key`` (importing its module registers its state kind with the engine)."""
    module, name = KINDS[key]
    kind: type[Section] = getattr(importlib.import_module(module), name)
    return kind


def load_kinds() -> None:
    """Import every section's module, so that a saved state of any kind can be read (``rcdiag.state``)."""
    for key in KINDS:
        section_kind(key)


def sections_for(whole_dump: Mapping[str, Any], given: Iterable[Section]) -> list[Section]:
    """The sections that read a state's accumulators: those given, then each registered kind's defaults for a key
    the state holds that none given reads, in the table's order."""
    chosen = list(given)
    keys = {section.KEY for section in chosen}
    chosen.extend(section_kind(key)() for key in KINDS if key in whole_dump and key not in keys)
    return chosen
