"""When will a metric cross its limit? A straight line through its recent steps, with a prediction interval.

The last ``window`` steps' values ``y`` are fitted by least squares, ``y = a + b x`` (``x`` the step). With ``s``
the residual standard deviation (``n - 2`` degrees of freedom), ``Sxx = sum (x - mean x)^2`` and ``t`` Student's
two-sided critical value at ``level``, a new step's value lies, at that level, within

    a + b x  +-  t s sqrt(1 + 1/n + (x - mean x)^2 / Sxx)

The earliest crossing is the first step whose upper bound reaches the limit, the latest the first whose lower bound
does; both are roots of one quadratic (``u = x - mean x``, ``c = limit - mean y``, ``k = t s``):

    (b^2 - k^2/Sxx) u^2 - 2 b c u + c^2 - k^2 (1 + 1/n) = 0

A forecast is made only when the slope points at the limit by more than ``t`` standard errors (``b^2 Sxx > k^2``,
so the quadratic opens upward and both roots exist): a flat or noisy series forecasts nothing. Lower limits
(``min`` rules) are forecast on ``-y``, ``max_abs`` rules on ``|y|``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.stats import t_critical

Direction = Literal["above", "below"]

DEFAULT_WINDOW = 10
"""Steps fitted: the recent trend, not the whole run (a regime change would be averaged away)."""
MIN_POINTS = 5
"""Fewer steps than this forecast nothing (three degrees of freedom at least)."""
DEFAULT_LEVEL = 0.9
"""The prediction interval's coverage."""


@dataclass(frozen=True)
class Forecast:
    """A metric's projected crossing of its limit: the expected step and the interval ``earliest..latest``."""

    metric: str
    limit: float
    direction: Direction
    last_step: int
    points: int
    slope: float
    slope_se: float
    level: float
    expected: float
    """The step at which the fitted line meets the limit (fractional)."""
    earliest: int
    """The first step after ``last_step`` whose prediction interval reaches the limit."""
    latest: int
    """The first step after ``last_step`` whose whole prediction interval is beyond the limit."""

    @property
    def message(self) -> str:
        side = "crosses" if self.direction == "above" else "falls below"
        name = self.metric.rpartition("/")[2]
        return (
            f"at the current rate, {name} {side} {self.limit:g} between steps {self.earliest} and {self.latest} "
            f"(expected at step {self.expected:.0f}; a line through the last {self.points} steps, "
            f"{self.level * 100:g}% prediction interval)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "limit": self.limit,
            "direction": self.direction,
            "last_step": self.last_step,
            "points": self.points,
            "slope": self.slope,
            "slope_se": self.slope_se,
            "level": self.level,
            "expected": self.expected,
            "earliest": self.earliest,
            "latest": self.latest,
            "message": self.message,
        }


def forecast_crossing(
    metric: str,
    steps: Sequence[int],
    values: Sequence[float | None],
    limit: float,
    direction: Direction = "above",
    *,
    window: int = DEFAULT_WINDOW,
    level: float = DEFAULT_LEVEL,
) -> Forecast | None:
    """The crossing of ``limit`` by the series ``(steps, values)``, or ``None``: too few finite points, the limit
    already reached at the last step, or no slope towards it that clears the fit's own scatter."""
    points = [(int(x), float(y)) for x, y in zip(steps, values, strict=True) if y is not None and math.isfinite(y)]
    points = points[-window:]
    n = len(points)
    if n < MIN_POINTS:
        return None
    sign = 1.0 if direction == "above" else -1.0
    xs = [x for x, _ in points]
    ys = [sign * y for _, y in points]
    bound = sign * limit
    if ys[-1] >= bound:
        return None  # crossed already: the rule itself says so
    xm = sum(xs) / n
    ym = sum(ys) / n
    sxx = sum((x - xm) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = sum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sxx
    a = ym - b * xm
    sse = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    s = math.sqrt(sse / (n - 2))
    se = s / math.sqrt(sxx)
    t = t_critical(1.0 - level, n - 2)
    k = t * s
    quad = b * b - k * k / sxx
    if b <= 0 or quad <= 0:
        return None
    c = bound - ym
    half = math.sqrt(max((b * c) ** 2 - quad * (c * c - k * k * (1 + 1 / n)), 0.0))
    low, high = (b * c - half) / quad, (b * c + half) / quad
    last = xs[-1]
    earliest = max(last + 1, math.ceil(xm + low))
    latest = max(last + 1, math.ceil(xm + high))
    return Forecast(metric, limit, direction, last, n, sign * b, se, level, xm + c / b, earliest, latest)
