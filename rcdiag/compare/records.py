"""The frozen records a comparison is made of, and the report keys they are read from.

Kept apart from the analysis so that renderers and API users depend on plain data only; every record has a
``to_dict`` for the JSON of ``rcdiag compare`` (docs/compare.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.catalogue.keys import Key
from rcdiag.compare.paired import PairedTest
from rcdiag.records.report import SCHEMA_VERSION, Finding, Report

KL = Key.KL
K3 = Key.K3_KL
KL_SE = Key.KL_STD_ERROR


CompareFinding = Finding
"""A finding about the pair: a ``rcdiag.records.report.Finding`` whose ``side`` says which dump (the old name, kept)."""


@dataclass(frozen=True)
class MetricDiff:
    """One metric on both sides: ``difference`` is b - a, ``ratio`` is b / a (``None`` where undefined)."""

    key: str
    a: float | None
    b: float | None
    difference: float | None
    ratio: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SideTemperature:
    """What one side's kl says about its logit noise, given its sampling temperature."""

    temperature: float | None
    source: Literal["option", "metadata", "assumed"] | None
    """Where ``temperature`` comes from; ``assumed``: neither dump records one, so both are taken as equal
    (``ASSUMED_TEMPERATURE``)."""
    train_temperature: float | None
    """From the dump's ``train_temperature`` metadata, when recorded."""
    kl: float | None
    k3_kl: float | None
    kl_std_error: float | None
    kl_t2: float | None
    """kl * T^2: constant across temperatures in the ideal case."""
    noise: float | None
    """T * sqrt(2 kl): the logit-noise estimate, comparable across temperatures (``None`` unless kl > 0)."""
    noise_low: float | None
    """T * sqrt(2 max(kl - 2 se, 0)): the low end of the estimate given kl's standard error."""
    noise_high: float | None
    """T * sqrt(2 (kl + 2 se)): the high end."""
    recorded_temperature: float | None = None
    """The dump's ``temperature`` metadata, also when an option gave the temperature (``None``: not recorded)."""

    @property
    def noise_resolved(self) -> bool:
        """kl is more than ``SIGMAS`` standard errors above 0: the side's noise is measurably nonzero."""
        return bool(self.noise_low)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TemperatureAnalysis:
    """Both sides' noise estimates and the kl ratio against the ideal 1/T^2 scaling."""

    a: SideTemperature
    b: SideTemperature
    kl_ratio: float | None
    """kl_a / kl_b as measured."""
    ideal_kl_ratio: float | None
    """(T_b / T_a)^2: kl_a / kl_b if the engines' logit noise were the same and Var_pi(eps) did not depend on T."""
    noise_ratio: float | None
    """noise_b / noise_a (both resolved)."""
    explanation: tuple[str, ...]
    kl_ratio_explained: bool | None = None
    """Whether the measured kl ratio (with kl +- 2 standard errors) reaches the range the temperatures explain,
    between 1x and ``ideal_kl_ratio`` (``None``: equal temperatures, or a ratio that is undefined)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "kl_ratio": self.kl_ratio,
            "ideal_kl_ratio": self.ideal_kl_ratio,
            "noise_ratio": self.noise_ratio,
            "kl_ratio_explained": self.kl_ratio_explained,
            "explanation": list(self.explanation),
        }


@dataclass(frozen=True)
class StepPair:
    """One training step present in both dumps: every metric on both sides and b - a."""

    step: int
    metrics: tuple[MetricDiff, ...]

    def get(self, key: str) -> MetricDiff | None:
        return next((m for m in self.metrics if m.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "metrics": [m.to_dict() for m in self.metrics]}


@dataclass(frozen=True)
class Comparison:
    """The result of ``compare``: both reports, the metric-by-metric diff, the temperature analysis, findings."""

    a: Report
    b: Report
    metrics: tuple[MetricDiff, ...]
    temperature: TemperatureAnalysis
    steps: tuple[StepPair, ...]
    """Steps present in both dumps, in step order."""
    unpaired_steps: dict[str, tuple[int, ...]]
    """Steps found in only one dump (``{"a": (...), "b": (...)}``): listed, never dropped silently."""
    trend: dict[str, float | None]
    """Least-squares slope of (b - a) per step over the paired steps, for the ``TREND_KEYS`` present."""
    findings: tuple[Finding, ...]
    """Findings about the pair, each with its ``side``."""
    tests: dict[str, PairedTest] = dataclasses.field(default_factory=dict)
    """Per headline metric (full key): is B different from A, by how much, how sure (``rcdiag.compare.paired``;
    empty when neither responses nor steps can be the units)."""

    def metric(self, key: str) -> MetricDiff:
        """The row of one metric (full key)."""
        return next(m for m in self.metrics if m.key == key)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (schema in docs/compare.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "comparison",
            "verdicts": {
                side: None if r.verdict is None else r.verdict.to_dict() for side, r in (("a", self.a), ("b", self.b))
            },
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "metrics": [m.to_dict() for m in self.metrics],
            "temperature": self.temperature.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "unpaired_steps": {side: list(steps) for side, steps in self.unpaired_steps.items()},
            "trend": self.trend,
            "findings": [f.to_pair_dict() for f in self.findings],
            "tests": {key: test.to_dict() for key, test in self.tests.items()},
        }


@dataclass(frozen=True)
class Comparisons:
    """``compare`` over more than two dumps: each against one baseline, every test's p-value Holm-adjusted over
    the comparisons (per metric), so the family-wise false-alarm rate stays at the level (docs/compare.md)."""

    baseline: Report
    comparisons: tuple[Comparison, ...]
    """One per other dump, in the order given; each ``a`` is the baseline."""

    @property
    def reports(self) -> tuple[Report, ...]:
        """The baseline, then every other dump."""
        return (self.baseline, *(c.b for c in self.comparisons))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "comparisons",
            "baseline": self.baseline.input.path,
            "correction": "holm",
            "comparisons": [{"path": c.b.input.path, **c.to_dict()} for c in self.comparisons],
        }
