"""Two dumps through the same engine configuration, side by side, with a temperature-aware verdict.

Why temperature matters: with logit noise eps between the engines at sampling temperature T, the first-order
term cancels and ``kl ~ Var_pi(eps) / (2 T^2)``. So kl alone is not comparable across temperatures, but the
logit-noise estimate ``std(eps) ~ T * sqrt(2 kl)`` is. For 0.6 vs 1.0 the ideal kl ratio is (1.0/0.6)^2 = 2.78;
measured ratios are lower (about 2x) because a sharper distribution concentrates its mass and ``Var_pi(eps)``
shrinks. A side that left the temperature out of its log-probs shows kl of order 0.1-1 at T != 1, and a noise
estimate far from the other side's. Every finding code is documented in docs/compare.md.

The package splits by concern: ``records`` (the frozen result records), ``temperature`` (noise estimates),
``verdicts`` (findings) and ``diffs`` (metric differences and trends). This module re-exports the public API and
holds the entry points ``compare`` and ``compare_reports``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcdiag.api import ProgressCallback, analyze
from rcdiag.compare.diffs import TREND_KEYS, _diffs, _slope
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
from rcdiag.compare.verdicts import COMPARE_FINDING_CODES, TEMPERATURE_KL_LIMIT, _findings
from rcdiag.config import CorrectionConfig
from rcdiag.errors import ConfigError
from rcdiag.options import ReadOptions
from rcdiag.report import Report, Side

if TYPE_CHECKING:
    from rcdiag.frameworks.registry import Chosen

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
    "analyze",
    "check_temperature",
    "compare",
    "compare_many",
    "compare_reports",
]


def compare(
    path_a: str | Path,
    path_b: str | Path,
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    read_b: ReadOptions | None = None,
    temperature_a: float | None = None,
    temperature_b: float | None = None,
    on_chunk: ProgressCallback | None = None,
    framework: str | Chosen | None = None,
    framework_options: Mapping[str, Any] | Sequence[str] = (),
    **options: Any,
) -> Comparison:
    """Analyse both dumps with ``config`` and compare them.

    ``read`` (with any ``ReadOptions`` field given as a keyword on top) says how to read both dumps; ``read_b``,
    when given, replaces it for B (two dumps with different column names). Temperatures given here are used
    instead of the dumps' ``temperature`` metadata; a disagreement is reported as a finding. ``framework`` (and its
    ``framework_options``): both sides computed ``--as`` it, as ``rcdiag.analyze`` takes them: its keys compared
    beside verl's, each side's prescription in its settings. Raises ``ConfigError`` for a bad temperature and the
    errors of ``rcdiag.analyze`` for bad inputs.
    """
    for name, value in (("temperature_a", temperature_a), ("temperature_b", temperature_b)):
        check_temperature(value, name)
    config = config or CorrectionConfig()
    config.resolve()
    read = ReadOptions.of(read, options)
    from rcdiag.sections.units import UnitsSection

    units = (UnitsSection(),)  # each response's sums, for the significance tests
    chosen = _chosen(framework, framework_options)
    report_a = analyze(path_a, config, read, on_chunk=on_chunk, sections=units, framework=chosen)
    report_b = analyze(path_b, config, read_b or read, on_chunk=on_chunk, sections=units, framework=chosen)
    return compare_reports(report_a, report_b, temperature_a=temperature_a, temperature_b=temperature_b)


def compare_many(
    paths: Sequence[str | Path],
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    baseline: int = 0,
    reads: Sequence[ReadOptions | None] = (),
    temperatures: Sequence[float | None] = (),
    on_chunk: ProgressCallback | None = None,
    framework: str | Chosen | None = None,
    framework_options: Mapping[str, Any] | Sequence[str] = (),
    **options: Any,
) -> Comparisons:
    """Every dump against ``paths[baseline]``, each dump read once. ``reads``/``temperatures``, where given, apply
    per dump (by position); the tests' p-values are Holm-adjusted over the comparisons, per metric. ``framework``:
    every dump computed ``--as`` it (``compare``)."""
    from rcdiag.sections.units import UnitsSection

    if len(paths) < 2:
        raise ConfigError("compare needs at least two dumps.")
    if not 0 <= baseline < len(paths):
        raise ConfigError(f"the baseline must be one of the {len(paths)} dumps given.")
    for i, value in enumerate(temperatures):
        check_temperature(value, f"temperature of dump {i + 1}")
    config = config or CorrectionConfig()
    config.resolve()
    read = ReadOptions.of(read, options)
    given = [*reads, *[None] * (len(paths) - len(reads))]
    chosen = _chosen(framework, framework_options)
    reports = [
        analyze(path, config, given[i] or read, on_chunk=on_chunk, sections=(UnitsSection(),), framework=chosen)
        for i, path in enumerate(paths)
    ]
    temps = [*temperatures, *[None] * (len(paths) - len(temperatures))]
    others = [i for i in range(len(paths)) if i != baseline]
    pairs = [
        compare_reports(reports[baseline], reports[i], temperature_a=temps[baseline], temperature_b=temps[i])
        for i in others
    ]
    return Comparisons(reports[baseline], tuple(_holm_adjusted(pairs)))


def _chosen(framework: str | Chosen | None, options: Mapping[str, Any] | Sequence[str]) -> Chosen | None:
    """The framework both sides are computed ``--as`` (checked once, before either dump is read)."""
    if framework is None and not options:
        return None
    from rcdiag.frameworks.registry import Chosen, choose

    return framework if isinstance(framework, Chosen) else choose(framework or "verl", options)


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
    config_a, config_b = CorrectionConfig(**a.config).resolve(), CorrectionConfig(**b.config).resolve()
    if not config_a.same_computation(config_b):  # as merge judges states: 2.0 and "2" are one threshold
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
