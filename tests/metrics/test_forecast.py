"""The one crossing forecast (rcdiag.core.forecast) against an independent computation: numpy's least squares,
Student's t from printed tables, and a scan over the integer steps ahead (the library solves a quadratic instead),
on the values and on their logarithm; its boundaries; the watch's choice of scale; and its calibration on series
with a known crossing step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.core.forecast import forecast
from rcdiag.watch.forecast import MIN_POINTS, forecast_crossing, scale_for

T_95 = {3: 2.353363, 4: 2.131847, 5: 2.015048, 6: 1.943180, 7: 1.894579, 8: 1.859548, 10: 1.812461, 18: 1.734064}
"""Student's t, 0.95 quantile (a two-sided 90% interval), from the printed tables."""


def scanned(steps: np.ndarray, values: np.ndarray, limit: float, horizon: int = 100_000) -> tuple[int, int, float]:
    """The first step ahead whose 90% prediction interval reaches ``limit`` at its upper end, the first at its lower
    end, and where the fitted line meets it, by brute force."""
    slope, intercept = np.polyfit(steps, values, 1)
    n = len(steps)
    residual = values - (intercept + slope * steps)
    s = math.sqrt(float(residual @ residual) / (n - 2))
    mean = steps.mean()
    sxx = float(((steps - mean) ** 2).sum())
    ahead = np.arange(steps[-1] + 1, steps[-1] + 1 + horizon, dtype=np.float64)
    half = T_95[n - 2] * s * np.sqrt(1 + 1 / n + (ahead - mean) ** 2 / sxx)
    line = intercept + slope * ahead
    earliest = int(ahead[np.argmax(line + half >= limit)])
    latest = int(ahead[np.argmax(line - half >= limit)])
    return earliest, latest, (limit - intercept) / slope


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n", [5, 8, 10])
def test_the_interval_is_the_brute_force_scans(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    steps = np.sort(rng.choice(np.arange(100, 160), size=n, replace=False)).astype(np.float64)
    values = 1e-3 + 2e-4 * (steps - 100) + rng.normal(0, 1e-4, n)
    limit = float(values.max()) + 2e-3
    made = forecast_crossing("rollout_corr/kl", steps.astype(int).tolist(), values.tolist(), limit, window=n)
    assert made is not None and made.scale == "log"  # values above 0 under an upper limit
    earliest, latest, expected = scanned(steps, np.log(values), math.log(limit))
    assert (made.earliest, made.latest) == (earliest, latest)
    assert made.expected == pytest.approx(expected, rel=1e-9)
    assert made.points == n and made.last_step == int(steps[-1])
    assert made.message.startswith(f"at the current rate, kl crosses {limit:g} between steps {earliest} and {latest}")
    assert "a line through log kl over the last" in made.message
    linear = forecast(steps.tolist(), values.tolist(), limit)
    assert linear is not None
    assert (linear.earliest, linear.latest) == scanned(steps, values, limit)[:2]
    assert linear.expected == pytest.approx(scanned(steps, values, limit)[2], rel=1e-9)


def test_a_lower_limit_is_forecast_on_the_falling_series() -> None:
    steps = np.arange(10, dtype=np.float64)
    values = 0.9 - 0.02 * steps + np.array([0.003, -0.002, 0.001, 0.0, -0.003, 0.002, 0.001, -0.001, 0.002, -0.002])
    made = forecast_crossing("rollout_corr/rollout_is_eff_sample_size", steps.tolist(), values.tolist(), 0.5, "below")
    assert made is not None
    earliest, latest, expected = scanned(steps, -values, -0.5)
    assert (made.earliest, made.latest, made.direction) == (earliest, latest, "below")
    assert made.expected == pytest.approx(expected, rel=1e-9) and made.slope < 0
    assert "falls below 0.5" in made.message


def test_no_forecast_without_a_trend_too_few_steps_or_after_the_crossing() -> None:
    rng = np.random.default_rng(3)
    flat = (1e-3 + rng.normal(0, 1e-4, 12)).tolist()
    assert forecast_crossing("kl", list(range(12)), flat, 1e-2) is None  # noise, no slope
    rising = [1e-3 * (1 + k) for k in range(MIN_POINTS - 1)]
    assert forecast_crossing("kl", list(range(len(rising))), rising, 1e-2) is None  # too few
    crossed = [1e-3 * (1 + k) for k in range(12)]
    assert forecast_crossing("kl", list(range(12)), crossed, 1e-2) is None  # 0.012 at the last step: crossed
    falling = [1e-3 * (12 - k) for k in range(8)]
    assert forecast_crossing("kl", list(range(8)), falling, 1e-2) is None  # heading away
    holes = [None, float("nan"), *(1e-3 * (1 + k) + 1e-5 * (-1) ** k for k in range(6))]
    made = forecast_crossing("kl", list(range(8)), holes, 1e-2)
    assert made is not None and made.points == 6  # null and NaN steps are left out


def test_only_the_last_window_of_steps_is_fitted() -> None:
    """A regime change: flat, then rising. The window sees the rise only."""
    values = [1e-3] * 20 + [1e-3 + 5e-4 * k + 1e-5 * (-1) ** k for k in range(1, 11)]
    made = forecast_crossing("kl", list(range(30)), values, 1e-2, window=10)
    assert made is not None and made.points == 10
    slope, intercept = np.polyfit(np.arange(20, 30), np.log(values[20:]), 1)  # the window's log fit
    assert made.expected == pytest.approx((math.log(1e-2) - intercept) / slope, rel=1e-9)
    linear = forecast(list(range(20, 30)), values[20:], 1e-2)
    assert linear is not None and linear.expected == pytest.approx(19 + 18, abs=0.5)  # 1e-3 + 5e-4 (x - 19) = 1e-2


def test_the_interval_covers_a_known_crossing_step() -> None:
    """Series with a true linear trend crossing at step 60, observed to step 29 with noise: the 90% interval holds
    the true crossing in about 90% of them."""
    rng = np.random.default_rng(7)
    covered = 0
    trials = 200
    for _ in range(trials):
        steps = np.arange(20, 30)
        values = 1e-2 * (steps / 60.0) + rng.normal(0, 4e-4, steps.size)
        made = forecast(steps.tolist(), values.tolist(), 1e-2, scale="linear")
        if made is not None and made.earliest <= 60 <= made.latest:
            covered += 1
    assert 0.84 * trials <= covered <= 0.96 * trials  # 0.898 over 2,000 such series


def test_the_log_scale_covers_a_known_exponential_crossing() -> None:
    """k3_kl growing 1.3x per step with 10% noise, crossing at step 60: the log scale's 90% interval holds it in
    about 90% of the series."""
    rng = np.random.default_rng(11)
    covered = 0
    trials = 200
    for _ in range(trials):
        steps = np.arange(20, 30)
        values = 1e-2 * 1.3 ** (steps - 60.0) * np.exp(rng.normal(0, 0.1, steps.size))
        made = forecast(steps.tolist(), values.tolist(), 1e-2, scale="log")
        if made is not None and made.earliest <= 60 <= made.latest:
            covered += 1
    assert 0.84 * trials <= covered <= 0.96 * trials


def test_the_boundaries() -> None:
    steps = list(range(8))
    rising = [1e-3 * (1 + k) + 1e-5 * (-1) ** k for k in steps]
    on = forecast(steps, rising, rising[-1])  # the last value exactly on the limit: not yet crossed
    assert on is not None and on.earliest == on.latest == 8  # counted from the step after the last
    assert forecast_crossing("kl", steps, rising, rising[-1]) is not None
    assert forecast_crossing("kl", steps, rising, math.nextafter(rising[-1], 0.0)) is None  # just beyond: crossed
    assert forecast(steps, [1e-3] * 8, 1e-2) is None  # flat
    assert forecast(steps, [1e-3] * 8, 1e-2, scale="log") is None
    assert forecast(steps[:2], rising[:2], 1e-2) is None  # too few for an interval
    assert forecast([3, 3, 3], [1.0, 2.0, 3.0], 10.0) is None  # one step
    assert forecast(steps, rising[::-1], 1e-2) is None  # decreasing towards an upper limit
    assert forecast(steps, rising[::-1], 1e-2, scale="log") is None
    falling = forecast(steps, rising[::-1], 1e-4, direction="below")
    assert falling is not None and falling.slope < 0
    with pytest.raises(ValueError, match="positive values"):
        forecast(steps, [0.0, *rising[1:]], 1e-2, scale="log")


def test_the_horizon_is_counted_from_the_last_step() -> None:
    """Steps numbered from 1000: the interval starts after step 1007, and the expected step is the brute force's."""
    steps = np.arange(1000, 1008, dtype=np.float64)
    values = 1e-3 + 1e-4 * (steps - 1000) + np.array([1, -1, 2, 0, -2, 1, -1, 0]) * 1e-6
    made = forecast(steps.tolist(), values.tolist(), 2e-3)
    assert made is not None
    earliest, latest, expected = scanned(steps, values, 2e-3)
    assert (made.earliest, made.latest) == (earliest, latest) and earliest > 1007
    assert made.expected == pytest.approx(expected, rel=1e-12)


def test_the_watch_fits_the_logarithm_only_of_values_above_0_under_an_upper_limit() -> None:
    assert scale_for([1e-3, 2e-3], 1e-2, "above") == "log"
    assert scale_for([0.0, 2e-3], 1e-2, "above") == "linear"
    assert scale_for([-1e-3, 2e-3], 1e-2, "above") == "linear"
    assert scale_for([0.9, 0.8], 0.5, "below") == "linear"
    assert scale_for([1e-3, 2e-3], 0.0, "above") == "linear"
