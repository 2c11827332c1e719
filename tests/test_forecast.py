"""The crossing forecast (rcdiag.watch.forecast) against an independent computation: numpy's least squares, Student's
t from printed tables, and a scan over the integer steps ahead (the library solves a quadratic instead); and its
calibration on series with a known crossing step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.watch.forecast import MIN_POINTS, forecast_crossing

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
    assert made is not None
    earliest, latest, expected = scanned(steps, values, limit)
    assert (made.earliest, made.latest) == (earliest, latest)
    assert made.expected == pytest.approx(expected, rel=1e-9)
    assert made.points == n and made.last_step == int(steps[-1])
    assert made.message.startswith(f"at the current rate, kl crosses {limit:g} between steps {earliest} and {latest}")


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
    assert made.expected == pytest.approx(19 + 18, abs=0.5)  # 1e-3 + 5e-4 (x - 19) = 1e-2 at x = 37


def test_the_interval_covers_a_known_crossing_step() -> None:
    """Series with a true linear trend crossing at step 60, observed to step 29 with noise: the 90% interval holds
    the true crossing in about 90% of them."""
    rng = np.random.default_rng(7)
    covered = 0
    trials = 200
    for _ in range(trials):
        steps = np.arange(20, 30)
        values = 1e-2 * (steps / 60.0) + rng.normal(0, 4e-4, steps.size)
        made = forecast_crossing("kl", steps.tolist(), values.tolist(), 1e-2)
        if made is not None and made.earliest <= 60 <= made.latest:
            covered += 1
    assert 0.84 * trials <= covered <= 0.96 * trials  # 0.898 over 2,000 such series
