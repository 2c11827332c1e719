"""A verl setting in the settings of the framework a run is computed ``--as`` (the verdict's prescription, the
sweep's recommendations): the framework's options to paste, in its own spelling, how they match verl's setting and
what differs (``rcdiag.frameworks.translate``), and their effect on the dump under the framework's semantics, read
from running its correction (``rcdiag.frameworks.section``), never guessed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rcdiag.frameworks.base import weight_keys
from rcdiag.frameworks.registry import Chosen, choose, framework
from rcdiag.frameworks.translate import translate
from rcdiag.records.report import FrameworkEffect, FrameworkSetting

VERL_FIELDS = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "rollout_is_batch_normalize")
"""The ``rollout_correction`` fields a prescription or a recommendation sets."""


def riding(sections: Mapping[str, Any]) -> str | None:
    """The ``--as`` framework of a report's sections (``framework``), unless verl (whose settings are verl's)."""
    record = sections.get("framework")
    name = getattr(record, "name", None)
    return name if isinstance(name, str) and name != "verl" else None


def speak(config: Mapping[str, Any], name: str) -> FrameworkSetting:
    """verl's setting ``config`` (its ``rollout_correction`` fields) in framework ``name``'s settings, its effect
    still to measure."""
    fields = {key: config[key] for key in VERL_FIELDS if key in config}
    whole = translate(choose("verl", fields), name).whole
    target = framework(name)
    paste = target.paste(whole.options) if whole.options else ""
    return FrameworkSetting(name, target.label, whole.match, dict(whole.options), paste, whole.meaning)


def chosen(setting: FrameworkSetting) -> Chosen | None:
    """The framework with the setting's options, to run on the dump; ``None`` where it has nothing alike."""
    return choose(setting.name, setting.options) if setting.options else None


def effect_of(name: str, extras: Mapping[str, Any]) -> FrameworkEffect:
    """The effect of framework ``name``'s correction on a dump, from the pooled readings of its run
    (``rcdiag/NAME/*``)."""
    mean, zeroed, responses, truncated, ess = (key.key for key in weight_keys(name))
    return FrameworkEffect(
        weight_mean=extras.get(mean),
        tokens_zeroed=extras.get(zeroed),
        responses_zeroed=extras.get(responses),
        weights_truncated=extras.get(truncated),
        ess=extras.get(ess),
    )


def measured(setting: FrameworkSetting, record: Any) -> FrameworkSetting:
    """``setting`` with its effect read from ``record`` (a ``FrameworkRecord`` of its run on the dump; ``None``: it
    has nothing to run)."""
    effect = None if record is None else effect_of(setting.name, record.pooled.extras)
    return dataclasses.replace(setting, effect=effect)
