"""The one table of state kinds: which module declares the section saved under each key, and each kind of state.

A run's state holds each section's whole-dump accumulator under its key; ``merge``, a state file read back and a
report built from a state no section object was given for (``rcdiag.api.build_report``) find the kind here, imported
when needed (a plain analyze imports none of them). The engine and the state files import no feature: the library
gives them this table (``KNOWN``, a ``rcdiag.engine.state_files.StateKinds``). A new section adds one line to ``KINDS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from rcdiag.engine.stream import StepStates
from rcdiag.runtime.fields import FieldError
from rcdiag.sections.base import Section

KINDS: dict[str, tuple[str, str]] = {
    "explain": ("rcdiag.explain.section", "ExplainSection"),
    "detectors": ("rcdiag.explain.detector_section", "DetectorSection"),
    "units": ("rcdiag.sections.units", "UnitsSection"),
    "framework": ("rcdiag.frameworks.section", "FrameworkSection"),
    "framework_settings": ("rcdiag.frameworks.section", "SettingsSection"),
    "exact": ("rcdiag.sections.exact", "ExactSection"),
    "slices": ("rcdiag.sections.slices", "SlicesSection"),
    "microbatch": ("rcdiag.microbatch.section", "MicroBatchSection"),
}
"""Each section's key -> (module, class); the class built with no arguments reads a merged state by its defaults,
and its ``STATE`` is the class of its whole-dump accumulator."""
STATE_KINDS: dict[str, tuple[str, str]] = {
    "analyze": ("rcdiag.engine.stream", "EngineState"),
    "sweep": ("rcdiag.sweep.state", "SweepState"),
}
"""Each kind of state (``StepStates.KIND``: a state file's ``kind``) -> (module, class)."""


def section_kind(key: str) -> type[Section]:
    """The section class saved under ``key``."""
    module, name = KINDS[key]
    kind: type[Section] = getattr(importlib.import_module(module), name)
    return kind


class Kinds:
    """``KINDS`` and ``STATE_KINDS`` as the state files read them (``rcdiag.engine.state_files.StateKinds``)."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(STATE_KINDS)

    def state(self, kind: str) -> type[StepStates[Any]]:
        module, name = STATE_KINDS[kind]
        found: type[StepStates[Any]] = getattr(importlib.import_module(module), name)
        return found

    def whole_dump(self, key: str) -> Any:
        if key not in KINDS:
            raise FieldError(
                f"state.whole_dump.{key} is a state no section declares (known: {', '.join(sorted(KINDS))}; "
                "rcdiag.sections.registry lists them)"
            )
        return section_kind(key).STATE

    def merge_refusal(self, key: str, mine: Any, theirs: Any, path: str, first: str) -> str | None:
        return section_kind(key).merge_refusal(mine, theirs, path, first) if key in KINDS else None


KNOWN = Kinds()
"""Every kind a state may hold: what the library gives ``rcdiag.engine.state_files`` to read, merge and save states."""


def sections_for(whole_dump: Mapping[str, Any], given: Iterable[Section]) -> list[Section]:
    """The sections that read a state's accumulators: those given, then each registered kind's defaults for a key
    the state holds that none given reads, in the table's order."""
    chosen = list(given)
    keys = {section.KEY for section in chosen}
    chosen.extend(section_kind(key)() for key in KINDS if key in whole_dump and key not in keys)
    return chosen
