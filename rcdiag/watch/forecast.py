"""When will a bounded metric cross its limit? ``rcdiag.core.forecast``'s line with a prediction interval, through
the metric's recent steps, after any level change among them.

The last ``window`` finite values are fitted (the recent trend, not the whole run). The scale follows the values
(``scale_for``): an upper limit on values all above 0 (k3_kl, chi2_token, |kl|) is fitted on their logarithm, so
growth by a factor per step, and a square law's, is not forecast late; a lower limit (``min`` rules) or a window
holding a value at or below 0 is fitted on the values (benchmarks/forecast_models.py measured both on k3_kl).
``max_abs`` rules are forecast on ``|y|``.

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
from typing import Any

from rcdiag.core.forecast import NEGLIGIBLE, Direction, Scale, beyond, fit_line, forecast

__all__ = ["DEFAULT_LEVEL", "DEFAULT_WINDOW", "MIN_POINTS", "Direction", "Forecast", "NoTrend", "forecast_crossing",
           "level_change", "scale_for", "trend"]  # fmt: skip

DEFAULT_WINDOW = 10
"""Steps fitted: the recent trend, not the whole run (a regime change would be averaged away)."""
MIN_POINTS = 5
"""Fewer steps than this forecast nothing (three degrees of freedom at least)."""
DEFAULT_LEVEL = 0.9
"""The prediction interval's coverage."""
CHANGE_RATIO = 8.0
"""A level change: a flat level, then a line, fit the window this many times better than one line (squared
residuals; an F of 7 (n - 3) or more). On a linear trend one line fits about as well whatever the noise: none of
2,000 noisy lines at each of three noise levels was cut short (tests/watch/test_watch_dashboards_bounds.py)."""
JUMP_STEPS = 4.0
"""... and the level jumps between them by more than this many steps of the new line's slope (a curve bending
away from a line does not jump)."""


@dataclass(frozen=True)
class Forecast:
    """A metric's projected crossing of its limit: the expected step and the interval ``earliest..latest``."""

    metric: str
    limit: float
    direction: Direction
    last_step: int
    points: int
    slope: float
    """The fitted change per step: of the values, or of their natural logarithm (``scale``)."""
    slope_se: float
    level: float
    expected: float
    """The step at which the fitted line meets the limit (fractional)."""
    earliest: int
    """The first step after ``last_step`` whose prediction interval reaches the limit."""
    latest: int
    """The first step after ``last_step`` whose whole prediction interval is beyond the limit."""
    scale: Scale = "linear"
    """``log``: the line is fitted to the values' logarithm (growth by a factor per step)."""

    @property
    def message(self) -> str:
        side = "crosses" if self.direction == "above" else "falls below"
        name = self.metric.rpartition("/")[2]
        through = f"log {name} over the" if self.scale == "log" else "the"
        return (
            f"at the current rate, {name} {side} {self.limit:g} between steps {self.earliest} and {self.latest} "
            f"(expected at step {self.expected:.0f}; a line through {through} last {self.points} steps, "
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
    if beyond(points[-1][1], limit, direction):
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
    line = fit_line(xs, ys)
    if line is None:
        return None
    best: tuple[float, int] | None = None
    for k in range(2, n):
        before, after = ys[:k], ys[k:]
        level = sum(before) / len(before)
        fitted = fit_line(xs[k:], after) if n - k >= MIN_POINTS else None
        if fitted is None:
            here, at, slope = _spread(after), sum(after) / len(after), 0.0
        else:
            here, at, slope = fitted.sse, fitted.intercept + fitted.slope * xs[k], fitted.slope
        here += _spread(before)
        jump = abs(at - level)
        if jump > JUMP_STEPS * abs(slope) * (xs[k] - xs[k - 1]) and (best is None or here < best[0]):
            best = (here, k)
    return best[1] if best is not None and best[0] * CHANGE_RATIO < line.sse else None


def _spread(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values)


def scale_for(values: Sequence[float], limit: float, direction: Direction) -> Scale:
    """The fit's scale: the logarithm for an upper limit above 0 on values all above 0, else the values
    (the module's docstring)."""
    return "log" if direction == "above" and limit > 0 and min(values) > 0 else "linear"


def _line(
    metric: str, points: list[tuple[int, float]], limit: float, direction: Direction, level: float
) -> Forecast | None:
    """The crossing forecast of ``rcdiag.core.forecast`` through ``points``, or ``None``."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    scale = scale_for(ys, limit, direction)
    made = forecast(xs, ys, limit, direction=direction, scale=scale, level=level)
    if made is None:
        return None
    return Forecast(metric, limit, direction, xs[-1], made.points, made.slope, made.slope_se, level, made.expected,
                    made.earliest, made.latest, scale)  # fmt: skip
