"""Is B's mismatch different from A's, by how much, how sure: one significance test per headline metric.

The headline metrics are token means over valid tokens, ratios of per-response sums whose terms are heavy-tailed
(a few tokens carry most of k3 and chi2). Two tests hold for them without a distributional assumption:

- **responses as units** (``units = "responses"``, the default): a percentile bootstrap over responses, each dump
  resampled on its own (the two dumps hold different prompts, so nothing pairs a response of A with one of B). The
  statistic is recomputed exactly (sum over the resampled responses / their tokens), so the response-level
  correlation of a response's tokens is kept. The p-value inverts the interval (the smallest level whose
  interval excludes 0). With more than ``BOOTSTRAP_MAX`` responses on one side the bootstrap's cost is not worth
  it: the cluster (delta-method) standard error of each ratio gives a normal interval, which the central limit
  theorem makes exact enough at that size (``method = "normal"``).
- **steps as units** (``units = "steps"``), when both dumps hold at least ``MIN_STEPS`` training steps: a Welch
  t-test on the per-step values (steps are independent batches; their means are close to normal even when tokens
  are not), with the Welch-Satterthwaite degrees of freedom.

``LEVEL`` is the two-sided level; with several dumps against one baseline, Holm's step-down correction over the
dumps (per metric) keeps the family-wise false-alarm rate at ``LEVEL`` (docs/compare.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rcdiag.core.stats import ratio_variance

if TYPE_CHECKING:
    from rcdiag.records.report import Report

LEVEL = 0.05
"""Two-sided level of every test (95% intervals)."""
RESAMPLES = 2000
"""Bootstrap resamples per dump."""
BOOTSTRAP_MAX = 100_000
"""Above this many responses on one side the interval is the normal one from the cluster standard error."""
MIN_STEPS = 3
"""Both dumps need this many steps for steps to be the units."""
SEED = 0
"""The bootstrap's seed: one dump pair always gives one answer."""
CHUNK_ELEMENTS = 4_000_000
"""Resampled indices drawn at a time (bounded memory: 32 MB of int64)."""


@dataclass(frozen=True)
class PairedTest:
    """One metric, B against A: ``difference`` = b - a with its 95% interval and two-sided p-value."""

    metric: str
    a: float | None
    b: float | None
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    significant: bool
    units: Literal["responses", "steps"]
    method: Literal["bootstrap", "normal", "welch"]
    n_a: int
    n_b: int
    """Units (responses or steps) on each side."""
    adjusted_p_value: float | None = None
    """Holm-adjusted p-value, when several dumps are compared with one baseline (``None``: two dumps)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sentence(self, name_a: str = "A", name_b: str = "B") -> str:
        """One line for the terminal."""
        short = self.metric.rsplit("/", 1)[-1]
        if self.difference is None or self.ci_low is None or self.ci_high is None:
            return f"{short}: not testable ({self.n_a} and {self.n_b} {self.units})"
        p = self.p_value if self.adjusted_p_value is None else self.adjusted_p_value
        if not self.significant:
            return (
                f"{short}: no significant difference ({name_b} - {name_a} = {self.difference:.4g} "
                f"[{self.ci_low:.4g}, {self.ci_high:.4g}], p {p:.3g}, {self.units})"
            )
        word = "higher" if self.difference > 0 else "lower"
        return (
            f"{name_b}'s {short} is {word} than {name_a}'s by {abs(self.difference):.4g} "
            f"[{self.ci_low:.4g}, {self.ci_high:.4g}] (p {p:.3g}, {self.units}, {self.method})"
        )


def ratio(tokens: np.ndarray, sums: np.ndarray) -> float | None:
    """The token mean the metric is: sum of sums / sum of tokens (``None`` without tokens or a finite value)."""
    n = float(tokens.sum())
    value = float(sums.sum()) / n if n > 0 else math.nan
    return value if math.isfinite(value) else None


def _bootstrap(tokens: np.ndarray, sums: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``RESAMPLES`` resampled token means over responses."""
    n = tokens.size
    out = np.empty(RESAMPLES)
    per = max(1, CHUNK_ELEMENTS // max(n, 1))
    for at in range(0, RESAMPLES, per):
        count = min(per, RESAMPLES - at)
        idx = rng.integers(0, n, size=(count, n))
        out[at : at + count] = sums[idx].sum(axis=1) / tokens[idx].sum(axis=1)
    return out


def responses_test(metric: str, a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> PairedTest:
    """Responses as units: ``a`` and ``b`` are (tokens, sums) per response."""
    (ta, sa), (tb, sb) = (_kept(*a), _kept(*b))
    value_a, value_b = ratio(ta, sa), ratio(tb, sb)
    sides = (metric, value_a, value_b, ta.size, tb.size)
    if value_a is None or value_b is None or ta.size < 2 or tb.size < 2:
        return _made(*sides, "responses", "bootstrap")
    difference = value_b - value_a
    method: Method
    if max(ta.size, tb.size) > BOOTSTRAP_MAX:
        se = math.sqrt(ratio_variance(ta, sa, value_a) + ratio_variance(tb, sb, value_b))
        z = _normal_quantile(1 - LEVEL / 2)
        p = math.erfc(abs(difference) / se / math.sqrt(2)) if se > 0 else (0.0 if difference else 1.0)
        low, high, method = difference - z * se, difference + z * se, "normal"
    else:
        rng = np.random.default_rng(SEED)
        diffs = _bootstrap(tb, sb, rng) - _bootstrap(ta, sa, rng)
        low, high = (float(q) for q in np.quantile(diffs, [LEVEL / 2, 1 - LEVEL / 2]))
        below, above = int(np.sum(diffs <= 0)), int(np.sum(diffs >= 0))
        p = min(1.0, 2 * (1 + min(below, above)) / (RESAMPLES + 1))
        method = "bootstrap"
    return _made(*sides, "responses", method, (difference, low, high, p))


Units = Literal["responses", "steps"]
Method = Literal["bootstrap", "normal", "welch"]


def _made(
    metric: str,
    a: float | None,
    b: float | None,
    n_a: int,
    n_b: int,
    units: Units,
    method: Method,
    result: tuple[float, float, float, float] | None = None,
) -> PairedTest:
    """A test from its sides and ``result`` = (difference, low, high, p); ``None``: not testable."""
    if result is None:
        return PairedTest(metric, a, b, None, None, None, None, False, units, method, n_a, n_b)
    difference, low, high, p = result
    return PairedTest(metric, a, b, difference, low, high, p, p < LEVEL, units, method, n_a, n_b)


def _kept(tokens: np.ndarray, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Responses with valid tokens (an empty response is no unit of a token mean)."""
    keep = tokens > 0
    return tokens[keep], sums[keep]


def steps_test(metric: str, a: Sequence[float | None], b: Sequence[float | None]) -> PairedTest:
    """Steps as units: a Welch t-test on the per-step values (non-finite steps left out)."""
    xa = np.array([v for v in a if v is not None and math.isfinite(v)], dtype=np.float64)
    xb = np.array([v for v in b if v is not None and math.isfinite(v)], dtype=np.float64)
    value_a = float(xa.mean()) if xa.size else None
    value_b = float(xb.mean()) if xb.size else None
    sides = (metric, value_a, value_b, xa.size, xb.size)
    if value_a is None or value_b is None or xa.size < 2 or xb.size < 2:
        return _made(*sides, "steps", "welch")
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    difference = value_b - value_a
    se = math.sqrt(va + vb)
    if se == 0:
        p = 0.0 if difference else 1.0
        return _made(*sides, "steps", "welch", (difference, difference, difference, p))
    df = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    t = difference / se
    p = student_t_two_sided(abs(t), df)
    half = student_t_quantile(1 - LEVEL / 2, df) * se
    return _made(*sides, "steps", "welch", (difference, difference - half, difference + half, p))


def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| >= t) for Student's t with ``df`` degrees of freedom: the regularised incomplete beta
    I_{df/(df+t^2)}(df/2, 1/2) (mpmath, which torch's sympy brings)."""
    import mpmath

    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


def student_t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (q > 0.5) of Student's t: bisection on ``student_t_two_sided``."""
    target = 2 * (1 - q)
    low, high = 0.0, 1.0
    while student_t_two_sided(high, df) > target:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if student_t_two_sided(mid, df) > target:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2


def _normal_quantile(q: float) -> float:
    """The standard normal's ``q`` quantile (``statistics.NormalDist``)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (``None`` kept): reject where the adjusted value is below the level."""
    order = sorted((float(p), i) for i, p in enumerate(p_values) if p is not None)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    m = len(order)
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def paired_tests(a: Report, b: Report) -> dict[str, PairedTest]:
    """Every headline metric's test, B against A: steps as units when both dumps hold ``MIN_STEPS`` steps, else
    responses (when both reports kept their per-response sums: ``rcdiag.sections.units``), else none."""
    from rcdiag.sections.units import METRIC_COLUMNS, UnitsRecord

    if len(a.steps) >= MIN_STEPS and len(b.steps) >= MIN_STEPS:
        return {
            key: steps_test(key, [_step_value(s, key) for s in a.steps], [_step_value(s, key) for s in b.steps])
            for key in METRIC_COLUMNS
        }
    units_a, units_b = a.sections.get("units"), b.sections.get("units")
    if not isinstance(units_a, UnitsRecord) or not isinstance(units_b, UnitsRecord):
        return {}
    return {key: responses_test(key, units_a.column(key), units_b.column(key)) for key in METRIC_COLUMNS}


def _step_value(step: Any, key: str) -> float | None:
    value = step.metrics.get(key, step.extras.get(key))
    return None if value is None else float(value)
