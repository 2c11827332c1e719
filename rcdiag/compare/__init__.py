"""Two dumps through the same engine configuration, side by side, with a temperature-aware verdict.

Why temperature matters: with logit noise eps between the engines at sampling temperature T, the first-order
term cancels and ``kl ~ Var_pi(eps) / (2 T^2)``. So kl alone is not comparable across temperatures, but the
logit-noise estimate ``std(eps) ~ T * sqrt(2 kl)`` is. For 0.6 vs 1.0 the ideal kl ratio is (1.0/0.6)^2 = 2.78;
measured ratios are lower (about 2x) because a sharper distribution concentrates its mass and ``Var_pi(eps)``
shrinks. A side that left the temperature out of its log-probs shows kl of order 0.1-1 at T != 1, and a noise
estimate far from the other side's. Every finding code is documented in docs/compare.md.

The package splits by concern: ``records`` (the frozen result records), ``temperature`` (noise estimates),
``verdicts`` (findings) and ``diffs`` (metric differences and trends). This module re-exports the public API and
compares reports (``compare_reports``, ``compare_against``); ``compare`` and ``compare_many``, which analyse the dumps
first, are the library's (``rcdiag.api.comparing``), importable from here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rcdiag.compare.diffs import TREND_KEYS, _diffs, _slope
from rcdiag.compare.findings import COMPARE_FINDING_CODES, TEMPERATURE_KL_LIMIT, _findings
from rcdiag.compare.paired import LEVEL, PairedTest, holm, paired_tests
from rcdiag.compare.records import (
    K3,
    KL,
    KL_SE,
    CompareFinding,
    Comparison,
    Comparisons,
    MetricDiff,
    SideTemperature,
    StepPair,
    TemperatureAnalysis,
)
from rcdiag.compare.temperature import (
    ASSUMED_TEMPERATURE,
    NOISE_RATIO_LIMIT,
    SIGMAS,
    TEMPERATURE_KEY,
    TRAIN_TEMPERATURE_KEY,
    _sides,
    _temperature_analysis,
    check_temperature,
)
from rcdiag.records.report import Report, Side
from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.lazy import exports

__all__ = [
    "ASSUMED_TEMPERATURE",
    "COMPARE_FINDING_CODES",
    "K3",
    "KL",
    "KL_SE",
    "NOISE_RATIO_LIMIT",
    "SIGMAS",
    "TEMPERATURE_KEY",
    "TEMPERATURE_KL_LIMIT",
    "TRAIN_TEMPERATURE_KEY",
    "TREND_KEYS",
    "CompareFinding",
    "Comparison",
    "Comparisons",
    "MetricDiff",
    "PairedTest",
    "Side",
    "SideTemperature",
    "StepPair",
    "TemperatureAnalysis",
    "check_temperature",
    "compare_against",
    "compare_reports",
]

_API = {"compare": "rcdiag.api", "compare_many": "rcdiag.api", "analyze": "rcdiag.api"}
"""The library's entry points users import from here (``from rcdiag.compare import compare``), found in the library
layer (``rcdiag.api.comparing``) when first asked for: this package compares reports and never imports the layer
above it (tests/lint/test_layering.py pins these names)."""

__getattr__ = exports(__name__, _API)


def compare_against(
    reports: Sequence[Report], baseline: int = 0, temperatures: Sequence[float | None] = ()
) -> Comparisons:
    """Every report against ``reports[baseline]`` (``compare_reports``), the tests' p-values Holm-adjusted over the
    comparisons, per metric; ``temperatures``, where given, apply per report (by position)."""
    temps = [*temperatures, *[None] * (len(reports) - len(temperatures))]
    others = [i for i in range(len(reports)) if i != baseline]
    pairs = [
        compare_reports(reports[baseline], reports[i], temperature_a=temps[baseline], temperature_b=temps[i])
        for i in others
    ]
    return Comparisons(reports[baseline], tuple(_holm_adjusted(pairs)))


def _framework_of(report: Report) -> tuple[str, Any] | None:
    record = report.sections.get("framework")
    return None if record is None else (record.name, record.options)


def _holm_adjusted(pairs: list[Comparison]) -> list[Comparison]:
    """Each comparison with its tests' p-values adjusted over the comparisons (per metric)."""
    keys = {key for pair in pairs for key in pair.tests}
    tests: list[dict[str, PairedTest]] = [dict(pair.tests) for pair in pairs]
    for key in keys:
        adjusted = holm([t[key].p_value if key in t else None for t in tests])
        for t, p in zip(tests, adjusted, strict=True):
            if key in t and p is not None:
                t[key] = dataclasses.replace(t[key], adjusted_p_value=p, significant=p < LEVEL)
    return [dataclasses.replace(pair, tests=t) for pair, t in zip(pairs, tests, strict=True)]


def compare_reports(
    a: Report, b: Report, *, temperature_a: float | None = None, temperature_b: float | None = None
) -> Comparison:
    """``compare`` over two reports you already have (same engine configuration)."""
    if not a.config.same_computation(b.config):  # as merge judges states: 2.0 and "2" are one threshold
        raise ConfigError("the two reports were computed with different engine configurations; compare needs one.")
    if _framework_of(a) != _framework_of(b):
        raise ConfigError("the two reports were computed --as different frameworks or options; compare needs one.")
    temperature = _temperature_analysis(*_sides(a, b, temperature_a, temperature_b))
    steps_a = {s.step: s for s in a.steps}
    steps_b = {s.step: s for s in b.steps}
    paired = sorted(steps_a.keys() & steps_b.keys())
    pairs = tuple(
        StepPair(
            step, _diffs(steps_a[step].metrics | steps_a[step].extras, steps_b[step].metrics | steps_b[step].extras)
        )
        for step in paired
    )
    return Comparison(
        a=a,
        b=b,
        metrics=_diffs(a.metrics | a.extras, b.metrics | b.extras),
        temperature=temperature,
        steps=pairs,
        unpaired_steps={
            "a": tuple(sorted(steps_a.keys() - steps_b.keys())),
            "b": tuple(sorted(steps_b.keys() - steps_a.keys())),
        },
        trend={key: _slope(pairs, key) for key in TREND_KEYS if key in a.metrics or key in a.extras},
        findings=tuple(_findings(a, b, temperature)),
        tests=paired_tests(a, b),
    )
