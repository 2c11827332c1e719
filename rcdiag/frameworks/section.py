"""``--as NAME`` as a section (``rcdiag.sections``): the framework's accumulators, one per step, fed every block
beside verl's; its keys merged into the report's ``metrics`` (and rcdiag's ``rcdiag/<name>/*`` readings into
``extras``), per step and pooled, and its release, options and notes under the JSON's ``framework``.

Each step's accumulator is a ``rcdiag.metrics.base.Accumulator`` of the framework's module: the pooled view merges
every step's, as verl's all-steps view does, so memory stays bounded by the number of steps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rcdiag.catalogue.metrics import EXTRA_PREFIX
from rcdiag.core.limits import finite
from rcdiag.engine.stream import StepKey, step_pairs
from rcdiag.frameworks.base import needs_notes
from rcdiag.frameworks.gradient import drops_gradient
from rcdiag.frameworks.registry import Chosen, choose
from rcdiag.io.base import RowNumbering
from rcdiag.metrics.base import Accumulator, MetricValue, verl_float
from rcdiag.metrics.batch import declared_states
from rcdiag.metrics.block import Block
from rcdiag.records.report import Finding
from rcdiag.runtime.fields import FieldError, integer, shown
from rcdiag.sections.base import PlainSection, RunFacts

KEY = "framework"


class FrameworkState(RowNumbering):
    """A whole-dump accumulator (``rcdiag.engine.stream.WholeDump``): one framework accumulator per step."""

    KEY = KEY

    def __init__(self, chosen: Chosen) -> None:
        self.chosen = chosen
        self.steps: dict[StepKey, Accumulator] = {}
        self.rows_read = 0
        self.part_rows: list[int] = []

    def _step(self, step: StepKey) -> Accumulator | None:
        found = self.steps.get(step)
        if found is None:
            found = self.chosen.settings.new_metrics()
            if found is None:
                return None
            self.steps[step] = found
        return found

    def update(self, block: Block) -> None:
        step = block.rows.step if block.rows is not None else None
        metrics = self._step(step)
        if metrics is not None:
            metrics.update(block)

    def merge(self, other: FrameworkState) -> FrameworkState:
        if self.signature() != other.signature():
            raise ValueError(f"cannot merge --as {other.chosen.name} into --as {self.chosen.name}")
        for step, metrics in other.steps.items():
            mine = self._step(step)
            if mine is not None:
                mine.merge(metrics)
        self.rows_read += other.rows_read
        return self

    def signature(self) -> tuple:
        return (type(self).__name__, self.chosen.name, self.chosen.settings)

    def pooled(self) -> Accumulator | None:
        """Every step merged (the all-steps view)."""
        pooled = self.chosen.settings.new_metrics()
        if pooled is not None:
            for metrics in self.steps.values():
                pooled.merge(metrics)
        return pooled

    def values(self) -> tuple[StepValues, dict[int, StepValues]]:
        """The values pooled over the dump, and each numbered step's: what the record shows and the findings read."""
        steps = {int(step): step_values(m) for step, m in self.steps.items() if step is not None}
        return step_values(self.pooled()), steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.chosen.name,
            "options": self.chosen.settings.to_dict(),
            "rows_read": self.rows_read,
            "steps": [[step, metrics.state_dict()] for step, metrics in self.steps.items()],
        }

    @classmethod
    def from_state_dict(cls, state: Any) -> FrameworkState:
        if not isinstance(state, dict) or set(state) != {"name", "options", "rows_read", "steps"}:
            raise FieldError(f"framework must be a table of name, options, rows_read and steps, got {shown(state)}")
        if not isinstance(state["name"], str) or not isinstance(state["options"], dict):
            raise FieldError("framework.name must be a name and framework.options a table")
        out = cls(choose(state["name"], state["options"]))
        out.rows_read = integer(state["rows_read"], "framework.rows_read")
        for key, saved in step_pairs(state["steps"], "framework.steps"):
            metrics = out._step(key)
            if metrics is None:
                raise FieldError(f"framework.steps: --as {out.chosen.name} with these options logs no key")
            metrics.load_state_dict(saved)
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        from rcdiag.frameworks.registry import FRAMEWORKS, framework

        for name in FRAMEWORKS:  # every framework's accumulator declared before the layout is read
            framework(name)
        return {"accumulators": declared_states(KEY)}


@dataclass(frozen=True)
class StepValues:
    """One step's (or the pooled) values: the framework's keys and rcdiag's readings of them."""

    metrics: dict[str, MetricValue]
    extras: dict[str, MetricValue]


def step_values(metrics: Accumulator | None) -> StepValues:
    """An accumulator's values split into the framework's own keys and rcdiag's ``rcdiag/<name>/*``; a value
    beyond float32's range is inf, as the framework's float32 logs it, and a non-finite one ``None`` (JSON)."""
    if metrics is None:
        return StepValues({}, {})
    values, _ = metrics.compute()
    own: dict[str, MetricValue] = {}
    extras: dict[str, MetricValue] = {}
    for key, value in values.items():
        (extras if key.startswith(EXTRA_PREFIX) else own)[key] = finite(verl_float(value))
    return StepValues(own, extras)


@dataclass(frozen=True)
class FrameworkRecord:
    """What ``--as NAME`` adds to a report: the framework's values (merged into ``metrics``/``extras`` and each
    step's by ``rcdiag.api.build_report``) and, in the JSON under ``framework``, its release, options and notes."""

    name: str
    label: str
    source: str
    options: dict[str, Any]
    notes: tuple[str, ...]
    pooled: StepValues
    steps: dict[int, StepValues] = field(default_factory=dict)
    readings: dict[str, str] = field(default_factory=dict)
    """What each key means (renderers; not in the JSON)."""

    def rows(self) -> list[tuple[str, MetricValue, str]]:
        """(key, pooled value, reading) of every key, the framework's own first."""
        values = {**self.pooled.metrics, **self.pooled.extras}
        return [(key, value, self.readings.get(key, "")) for key, value in values.items()]

    def heading(self) -> str:
        """``TRL 1.16.0 (--as trl: vllm_importance_sampling_mode=sequence_mask, ...)``."""
        options = ", ".join(f"{key}={_shown(value)}" for key, value in self.options.items())
        return f"{self.label} (--as {self.name}: {options})"

    def step_metrics(self, step: int) -> StepValues:
        """The values of ``step`` (none for a step the framework's accumulator did not see)."""
        return self.steps.get(step, StepValues({}, {}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "release": self.label,
            "source": self.source,
            "options": self.options,
            "keys": [*self.pooled.metrics, *self.pooled.extras],
            "notes": list(self.notes),
        }


class FrameworkSection(PlainSection):
    """The chosen framework riding on the run (``rcdiag.api.analyze(framework=...)``); built with no argument it
    reads a saved state's framework (``merge``)."""

    KEY: ClassVar[str] = KEY
    STATE = FrameworkState
    wants_loss_inputs = True

    def __init__(self, chosen: Chosen | None = None) -> None:
        self.chosen = chosen

    def new_state(self) -> FrameworkState:
        if self.chosen is None:
            raise ValueError("a framework section built without a framework only reads saved states")
        return FrameworkState(self.chosen)

    def record(self, state: FrameworkState | None, run: RunFacts) -> FrameworkRecord | None:
        if state is None:
            return None
        chosen = state.chosen
        pooled, steps = state.values()
        missing = needs_notes(chosen.settings, pooled.metrics)
        return FrameworkRecord(
            name=chosen.name,
            label=chosen.framework.label,
            source=chosen.framework.source,
            options=chosen.settings.to_dict(),
            notes=(
                *chosen.settings.notes(),
                *missing,
                *((chosen.framework.left_out,) if chosen.framework.left_out else ()),
            ),
            pooled=pooled,
            steps=steps,
            readings={key.key: key.reading for key in chosen.framework.keys},
        )

    def findings(self, state: FrameworkState | None, run: RunFacts) -> list[Finding]:
        """``framework_drops_gradient`` where the framework's correction, pooled over the dump or at some of its
        steps, takes away most of the gradient (``rcdiag.frameworks.gradient``)."""
        if state is None:
            return []
        pooled, steps = state.values()
        found = drops_gradient(state.chosen, pooled.extras, {step: values.extras for step, values in steps.items()})
        return [] if found is None else [found]


def _shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def framework_section(name: str, options: Mapping[str, Any] | list[str] | tuple[str, ...] = ()) -> FrameworkSection:
    """The section of ``--as name`` with ``options`` (``KEY=VALUE`` texts or keys to values)."""
    return FrameworkSection(choose(name, options))


# ------------------------------------------------------------------------- several settings measured in one pass


SETTINGS_KEY = "framework_settings"


class SettingsState(RowNumbering):
    """A whole-dump accumulator (``rcdiag.engine.stream.WholeDump``) of several frameworks' settings at once, each
    pooled over the whole dump: how ``sweep --as NAME`` measures every recommendation in that framework's settings in
    one pass."""

    KEY = SETTINGS_KEY

    def __init__(self, chosen: tuple[Chosen, ...]) -> None:
        self.chosen = chosen
        self.metrics = [c.settings.new_metrics() for c in chosen]
        self.rows_read = 0
        self.part_rows: list[int] = []

    def update(self, block: Block) -> None:
        for metrics in self.metrics:
            if metrics is not None:
                metrics.update(block)

    def merge(self, other: SettingsState) -> SettingsState:
        if self.signature() != other.signature():
            raise ValueError("cannot merge the measures of other framework settings")
        for mine, theirs in zip(self.metrics, other.metrics, strict=True):
            if mine is not None and theirs is not None:
                mine.merge(theirs)
        self.rows_read += other.rows_read
        return self

    def signature(self) -> tuple:
        return (type(self).__name__, *((c.name, c.settings) for c in self.chosen))

    def state_dict(self) -> dict[str, Any]:
        return {
            "settings": [[c.name, c.settings.to_dict()] for c in self.chosen],
            "rows_read": self.rows_read,
            "metrics": [None if m is None else m.state_dict() for m in self.metrics],
        }

    @classmethod
    def from_state_dict(cls, state: Any) -> SettingsState:
        if not isinstance(state, dict) or set(state) != {"settings", "rows_read", "metrics"}:
            raise FieldError(f"{SETTINGS_KEY} must be a table of settings, rows_read and metrics, got {shown(state)}")
        settings, saved = state["settings"], state["metrics"]
        if not isinstance(settings, list) or not isinstance(saved, list) or len(settings) != len(saved):
            raise FieldError(f"{SETTINGS_KEY}: one saved accumulator per setting")
        chosen = []
        for item in settings:
            if not (
                isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)
            ):
                raise FieldError(f"{SETTINGS_KEY}.settings: each a [name, options] pair, got {shown(item)}")
            chosen.append(choose(item[0], item[1]))
        out = cls(tuple(chosen))
        out.rows_read = integer(state["rows_read"], f"{SETTINGS_KEY}.rows_read")
        for metrics, part in zip(out.metrics, saved, strict=True):
            if (metrics is None) != (part is None):
                raise FieldError(f"{SETTINGS_KEY}.metrics: a setting's saved accumulator does not match it")
            if metrics is not None:
                metrics.load_state_dict(part)
        return out

    @classmethod
    def layout(cls) -> dict[str, Any]:
        return FrameworkState.layout()


@dataclass(frozen=True)
class SettingsRecord:
    """Each setting's pooled values (in the order given): the framework's keys and rcdiag's readings."""

    values: tuple[StepValues, ...]

    def to_dict(self) -> list[dict[str, Any]]:
        return [{"metrics": v.metrics, "extras": v.extras} for v in self.values]


class SettingsSection(PlainSection):
    """Several frameworks' settings measured on the dump in one pass (``SettingsRecord``)."""

    KEY: ClassVar[str] = SETTINGS_KEY
    STATE = SettingsState
    wants_loss_inputs = True

    def __init__(self, chosen: tuple[Chosen, ...] = ()) -> None:
        self.chosen = chosen

    def new_state(self) -> SettingsState:
        return SettingsState(self.chosen)

    def record(self, state: SettingsState | None, run: RunFacts) -> SettingsRecord | None:
        if state is None:
            return None
        return SettingsRecord(tuple(step_values(metrics) for metrics in state.metrics))
