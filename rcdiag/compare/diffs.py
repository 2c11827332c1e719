"""Metric-by-metric differences between the two sides, and the per-step trend of those differences.

Plain arithmetic on metric mappings: a value missing or non-finite on either side gives ``None``, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping

from rcdiag.catalogue.metrics import step_columns
from rcdiag.compare.records import MetricDiff, StepPair
from rcdiag.core.limits import finite

TREND_KEYS = tuple(step_columns("compare_trend"))


def _diffs(a: Mapping[str, float | None], b: Mapping[str, float | None]) -> tuple[MetricDiff, ...]:
    keys = list(a) + [k for k in b if k not in a]
    return tuple(_diff(key, a.get(key), b.get(key)) for key in keys)


def _diff(key: str, a: float | None, b: float | None) -> MetricDiff:
    difference = b - a if a is not None and b is not None else None
    ratio = b / a if a is not None and b is not None and a != 0 else None
    return MetricDiff(key, a, b, finite(difference), finite(ratio))


def _slope(pairs: tuple[StepPair, ...], key: str) -> float | None:
    points = [(p.step, d.difference) for p in pairs if (d := p.get(key)) is not None and d.difference is not None]
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else None
