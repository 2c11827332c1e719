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

A line fitted across a step change is not a trend: a metric flat at one level, then flat at another, gives a steep
slope through the jump and forecasts a crossing that never comes. So the window is first tested for a level change
(``level_change``): a flat level before a step ``x_k`` and a line from it (the best ``k``), against one line; when
it fits ``CHANGE_RATIO`` times better and jumps at ``x_k``, the window holds a step, not a trend. After the last
such change only the steps since are fitted; with fewer than ``MIN_POINTS`` of them, or no slope, the result is a
``NoTrend`` that says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rcdiag.stats import t_critical

Direction = Literal["above", "below"]

DEFAULT_WINDOW = 10
"""Steps fitted: the recent trend, not the whole run (a regime change would be averaged away)."""
MIN_POINTS = 5
"""Fewer steps than this forecast nothing (three degrees of freedom at least)."""
DEFAULT_LEVEL = 0.9
"""The prediction interval's coverage."""
CHANGE_RATIO = 8.0
"""A level change: a flat level, then a line, fit the window this many times better than one line (squared
residuals; an F of 7 (n - 3) or more). On a linear trend one line fits about as well whatever the noise: none of
2,000 noisy lines at each of three noise levels was cut short (tests/test_watch_dashboards_bounds.py)."""
JUMP_STEPS = 4.0
"""... and the level jumps between them by more than this many steps of the new line's slope (a curve bending
away from a line does not jump)."""
NEGLIGIBLE = 1e-9
"""A shift or a slope explaining less than this fraction of the values' spread is rounding, not a change."""


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
        return _with_message(self)


@dataclass(frozen=True)
class NoTrend:
    """A bounded metric whose window holds a level change and no trend since: nothing is forecast, and this says
    why (a line through the jump would have forecast a crossing)."""

    metric: str
    limit: float
    direction: Direction
    last_step: int
    since: int
    """The first step of the new level."""
    before: float
    after: float
    """The mean value before the change (over the window) and since."""
    points: int
    """Steps since the change."""

    @property
    def message(self) -> str:
        name = self.metric.rpartition("/")[2]
        why = f", {MIN_POINTS} needed to fit one" if self.points < MIN_POINTS else ""
        return (
            f"{name} changed level at step {self.since} ({self.before:.3g} -> {self.after:.3g}): no trend towards "
            f"{self.limit:g} since ({self.points} step(s){why}), so no crossing is forecast"
        )

    def to_dict(self) -> dict[str, Any]:
        return _with_message(self)


def _with_message(record: Forecast | NoTrend) -> dict[str, Any]:
    """A record's fields in declaration order, then its message (the JSON of ``watch``'s steps)."""
    return {**asdict(record), "message": record.message}


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
    already reached at the last step, no slope towards it that clears the fit's own scatter, or a level change
    with no trend since."""
    made = trend(metric, steps, values, limit, direction, window=window, level=level)
    return made if isinstance(made, Forecast) else None


def trend(
    metric: str,
    steps: Sequence[int],
    values: Sequence[float | None],
    limit: float,
    direction: Direction = "above",
    *,
    window: int = DEFAULT_WINDOW,
    level: float = DEFAULT_LEVEL,
) -> Forecast | NoTrend | None:
    """``forecast_crossing``, and the ``NoTrend`` of a window whose last level change leaves no trend to fit."""
    points = [(int(x), float(y)) for x, y in zip(steps, values, strict=True) if y is not None and math.isfinite(y)]
    points = points[-window:]
    if len(points) < MIN_POINTS:
        return None
    sign = 1.0 if direction == "above" else -1.0
    bound = sign * limit
    if sign * points[-1][1] >= bound:
        return None  # crossed already: the rule itself says so
    start = level_change([x for x, _ in points], [y for _, y in points])
    if start:
        since = points[start:]
        made = _line(metric, since, limit, direction, level) if len(since) >= MIN_POINTS else None
        if made is not None:
            return made
        before = [y for _, y in points[:start]]
        after = [y for _, y in since]
        return NoTrend(metric, limit, direction, points[-1][0], since[0][0], sum(before) / len(before),
                       sum(after) / len(after), len(since))  # fmt: skip
    return _line(metric, points, limit, direction, level)


def level_change(xs: Sequence[float], ys: Sequence[float]) -> int:
    """The index of the first point after the window's last level change; 0: none. Each pass looks for a change
    among the points left (at least 2 before it, 1 after) and keeps the points from it."""
    start = 0
    while len(xs) - start >= 4:
        found = _best_shift(xs[start:], ys[start:])
        if found is None:
            return start
        start += found
    return start


def _best_shift(xs: Sequence[float], ys: Sequence[float]) -> int | None:
    """The split ``k`` of the best fit by a flat level before ``x_k`` and a line from it (a flat level when fewer
    than ``MIN_POINTS`` follow), when that fit is ``CHANGE_RATIO`` times better than one line's (squared residuals)
    and the level jumps at ``x_k`` by more than ``JUMP_STEPS`` steps of the new line's slope: a step, not a trend.
    A line, noisy or not, seldom passes (the flat level keeps its slope in the residuals), nor does a curve bending
    away from a line (it does not jump)."""
    n = len(xs)
    ym = sum(ys) / n
    if sum((y - ym) ** 2 for y in ys) <= NEGLIGIBLE * max(abs(y) for y in ys) ** 2 * n:
        return None  # constant, to rounding
    line = _fit(xs, ys)
    if line is None:
        return None
    best: tuple[float, int] | None = None
    for k in range(2, n):
        before, after = ys[:k], ys[k:]
        level = sum(before) / len(before)
        fitted = _fit(xs[k:], after) if n - k >= MIN_POINTS else None
        if fitted is None:
            here, at, slope = _spread(after), sum(after) / len(after), 0.0
        else:
            here, at, slope = fitted[2], fitted[0] + fitted[1] * xs[k], fitted[1]
        here += _spread(before)
        jump = abs(at - level)
        if jump > JUMP_STEPS * abs(slope) * (xs[k] - xs[k - 1]) and (best is None or here < best[0]):
            best = (here, k)
    return best[1] if best is not None and best[0] * CHANGE_RATIO < line[2] else None


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float] | None:
    """The least-squares line ``a + b x`` and its squared residuals; ``None`` when the steps are all one."""
    n = len(xs)
    xm = sum(xs) / n
    ym = sum(ys) / n
    sxx = sum((x - xm) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = sum((x - xm) * (y - ym) for x, y in zip(xs, ys, strict=True)) / sxx
    a = ym - b * xm
    return a, b, sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))


def _spread(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values)


def _line(
    metric: str, points: list[tuple[int, float]], limit: float, direction: Direction, level: float
) -> Forecast | None:
    """The straight line's crossing forecast (the module's docstring), or ``None``."""
    n = len(points)
    sign = 1.0 if direction == "above" else -1.0
    xs = [x for x, _ in points]
    ys = [sign * y for _, y in points]
    bound = sign * limit
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
    if b <= 0 or quad <= 0 or b * b * sxx <= NEGLIGIBLE * sum((y - ym) ** 2 for y in ys):
        return None
    c = bound - ym
    half = math.sqrt(max((b * c) ** 2 - quad * (c * c - k * k * (1 + 1 / n)), 0.0))
    low, high = (b * c - half) / quad, (b * c + half) / quad
    last = xs[-1]
    earliest = max(last + 1, math.ceil(xm + low))
    latest = max(last + 1, math.ceil(xm + high))
    return Forecast(metric, limit, direction, last, n, sign * b, se, level, xm + c / b, earliest, latest)
