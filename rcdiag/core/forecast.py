"""When will a per-step series cross a limit? One least-squares line with a prediction interval, the one forecast
that ``rcdiag watch`` (its bounded rules) and the ``mismatch_trend`` detector (verl's warnings) both make.

The values ``y`` at steps ``x`` are fitted by least squares, ``y = a + b x``, on the values themselves
(``scale="linear"``: a metric that grows by a constant amount per step) or on their logarithm (``scale="log"``: one
that grows by a constant factor, exponentially). With ``s`` the residual standard deviation (``n - 2`` degrees of
freedom), ``Sxx = sum (x - mean x)^2`` and ``t`` Student's two-sided critical value at ``level``, a new step's
value lies, at that level, within

    a + b x  +-  t s sqrt(1 + 1/n + (x - mean x)^2 / Sxx)

The expected crossing is where the line meets the limit; the earliest the first step whose upper bound reaches it,
the latest the first whose lower bound does. Both are roots of one quadratic (``u = x - mean x``,
``c = limit - mean y``, ``k = t s``):

    (b^2 - k^2/Sxx) u^2 - 2 b c u + c^2 - k^2 (1 + 1/n) = 0

A crossing is forecast only when the slope points at the limit by more than ``t`` standard errors (``b^2 Sxx > k^2``,
so the quadratic opens upward and both roots exist): a flat, noisy or receding series forecasts nothing. A lower
limit is forecast on ``-y`` (``direction="below"``; linear scale only). The log scale is monotone, so its interval's
steps are those of the values' own interval; it needs every value and the limit above 0.

Which scale is right is measured in benchmarks/forecast_models.py on the per-step k3_kl of real-model and synthetic
runs (docs/watch.md, "The forecast"): a linear fit for the watch's bounds on any metric (signed, falling, or
linear in the step), the log fit for k3_kl's exponential growth in ``mismatch_trend``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rcdiag.core.stats import t_critical

Direction = Literal["above", "below"]
Scale = Literal["linear", "log"]

NEGLIGIBLE = 1e-9
"""A slope explaining less than this fraction of the values' spread is rounding, not a trend."""


@dataclass(frozen=True)
class Line:
    """The least-squares line ``y = intercept + slope x`` through ``n`` points."""

    n: int
    mean_x: float
    mean_y: float
    slope: float
    intercept: float
    sxx: float
    syy: float
    """The values' squared deviations from their mean."""
    sse: float
    """The squared residuals."""

    @property
    def slope_se(self) -> float:
        """The slope's standard error (infinite without a degree of freedom left)."""
        return math.sqrt(self.sse / (self.n - 2) / self.sxx) if self.n > 2 else math.inf


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line | None:
    """The least-squares line, or ``None`` when the steps are all one (or there are none)."""
    n = len(xs)
    if n == 0:
        return None
    xm = math.fsum(xs) / n
    ym = math.fsum(ys) / n
    sxx = math.fsum((x - xm) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = math.fsum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sxx
    a = ym - b * xm
    sse = math.fsum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return Line(n, xm, ym, b, a, sxx, math.fsum((y - ym) ** 2 for y in ys), sse)


@dataclass(frozen=True)
class Crossing:
    """A series' projected crossing of its limit, in steps."""

    expected: float
    """The step at which the fitted line meets the limit (fractional)."""
    earliest: int
    """The first step after the last observed one whose prediction interval reaches the limit."""
    latest: int
    """The first step after the last observed one whose whole prediction interval is beyond the limit."""
    slope: float
    """The fitted change per step (of the values, or of their logarithm), signed as the series'."""
    slope_se: float
    points: int


def beyond(value: float, limit: float, direction: Direction = "above") -> bool:
    """Has ``value`` crossed ``limit``? Strictly beyond it, as a rule fails (a value on the limit has not)."""
    return value > limit if direction == "above" else value < limit


def forecast(
    xs: Sequence[float],
    ys: Sequence[float],
    limit: float,
    *,
    direction: Direction = "above",
    scale: Scale = "linear",
    level: float = 0.9,
) -> Crossing | None:
    """The crossing of ``limit`` by the points ``(xs, ys)`` (the module's docstring), counted from the last step
    ``xs[-1]``; ``None`` with fewer than 3 points, all at one step, or no slope towards the limit that clears the
    interval. The caller chooses the points (a window, finite values) and says when the limit is already crossed."""
    if len(xs) < 3:
        return None
    sign = 1.0 if direction == "above" else -1.0
    if scale == "log":
        if direction != "above" or limit <= 0 or min(ys) <= 0:
            raise ValueError("a log-scale forecast needs positive values and an upper limit above 0")
        values, bound = [math.log(y) for y in ys], math.log(limit)
    else:
        values, bound = [sign * y for y in ys], sign * limit
    line = fit_line(xs, values)
    if line is None:
        return None
    n, b, xm = line.n, line.slope, line.mean_x
    k = t_critical(1.0 - level, n - 2) * math.sqrt(line.sse / (n - 2))
    quad = b * b - k * k / line.sxx
    if b <= 0 or quad <= 0 or b * b * line.sxx <= NEGLIGIBLE * line.syy:
        return None
    c = bound - line.mean_y
    half = math.sqrt(max((b * c) ** 2 - quad * (c * c - k * k * (1 + 1 / n)), 0.0))
    low, high = (b * c - half) / quad, (b * c + half) / quad
    last = xs[-1]
    earliest = int(max(last + 1, math.ceil(xm + low)))
    latest = int(max(last + 1, math.ceil(xm + high)))
    slope = b if scale == "log" else sign * b
    return Crossing(xm + c / b, earliest, latest, slope, line.slope_se, n)
