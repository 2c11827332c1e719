"""The one table of frameworks: ``--as NAME`` -> the module that declares it (imported when first named).

Adding a framework is one module declaring ``FRAMEWORK`` (``rcdiag.frameworks.base.Framework``) and one line here
(docs/frameworks.md, "Adding a framework").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rcdiag.frameworks.base import Framework, Settings
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import CorrectionConfig

DEFAULT = "verl"
FRAMEWORKS: dict[str, str] = {
    "verl": "rcdiag.frameworks.verl",
    "trl": "rcdiag.frameworks.trl",
    "openrlhf": "rcdiag.frameworks.openrlhf",
    "areal": "rcdiag.frameworks.areal",
    "skyrl": "rcdiag.frameworks.skyrl",
    "slime": "rcdiag.frameworks.slime",
    "prime-rl": "rcdiag.frameworks.prime_rl",
    "nemo-rl": "rcdiag.frameworks.nemo_rl",
    "roll": "rcdiag.frameworks.roll",
}
"""``--as`` names rcdiag reproduces -> their module, in the order ``--help`` lists them."""


def names() -> tuple[str, ...]:
    """Every ``--as`` name rcdiag reproduces."""
    return tuple(FRAMEWORKS)


def framework(name: str) -> Framework:
    """The framework called ``name``; a ``ConfigError`` for one rcdiag does not reproduce."""
    key = name.strip().lower()
    module = FRAMEWORKS.get(key)
    if module is None:
        raise ConfigError(f"--as {name}: unknown framework; rcdiag reproduces {', '.join(FRAMEWORKS)}")
    found: Framework = importlib.import_module(module).FRAMEWORK
    return found


@dataclass(frozen=True)
class Chosen:
    """A framework and its resolved settings: what ``--as NAME --as-option ...`` asks for."""

    framework: Framework
    settings: Settings

    @property
    def name(self) -> str:
        return self.framework.name

    def keys(self) -> list[str]:
        """The keys these settings log (none where the framework logs nothing under them)."""
        metrics = self.settings.new_metrics()
        return [] if metrics is None else metrics.keys()

    def split(self, config: CorrectionConfig | None) -> tuple[CorrectionConfig | None, Chosen | None]:
        """``(verl's configuration, the framework riding beside it)``: ``--as verl``'s options put on top of
        ``config`` (nothing rides), or ``config`` as it is and this framework."""
        from rcdiag.frameworks.verl import VerlSettings

        if isinstance(self.settings, VerlSettings):
            return self.settings.config(config), None
        return config, self


def choose(name: str = DEFAULT, options: Iterable[str] | Mapping[str, Any] = ()) -> Chosen:
    """``name`` with ``options`` (``KEY=VALUE`` texts, or keys to values) on top of its release's defaults;
    a ``ConfigError`` (one line) for an unknown name, key or value, or a combination the framework refuses."""
    from rcdiag.frameworks.options import option_values

    found = framework(name)
    return Chosen(found, found.settings(*option_values(found, options)))
