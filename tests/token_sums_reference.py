"""Random raw token blocks (rows of any length, special values, a mask or none) and the checks the fused token
pass and its twins (compiled, numpy, torch, the sweep's) are held to: the log-ratio histogram counted value by value,
per-row valid counts, closeness that treats NaN and infinities as exact."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from rcdiag.metrics.histogram import EDGES

# log-probs a dump can hold: typical ones, tiny and large mismatches, the series' edge, infinities and NaN-makers
SPECIAL = [0.0, -1e-7, -0.2499, -0.25, -0.2501, -3.0, -19.99, -20.0, -20.5, -89.0, -100.0, -np.inf]


@st.composite
def raw_blocks(draw):
    """A raw block: rows of random lengths (some empty), values near each other or special, a mask or none."""
    lengths = np.array(draw(st.lists(st.integers(0, 40), min_size=1, max_size=12)), dtype=np.int64)
    n = int(lengths.sum())
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    old = -np.abs(rng.normal(0.0, 2.0, n))
    scale = draw(st.sampled_from([1e-6, 1e-3, 0.05, 0.3, 3.0]))
    rollout = old + rng.normal(0.0, scale, n)
    for values in (old, rollout):
        special = rng.random(n) < draw(st.sampled_from([0.0, 0.05, 0.3]))
        values[special] = rng.choice(SPECIAL, int(special.sum()))
    rollout = np.minimum(rollout, 0.0)
    mask = None if draw(st.booleans()) else rng.random(n) < 0.8
    return old.astype(np.float32), rollout.astype(np.float32), mask, lengths


def brute_force(log_ratios: np.ndarray) -> list[int]:
    """Bin i holds edges[i-1] <= x < edges[i], counted value by value against the float64 edges."""
    bounds = [-math.inf, *EDGES.tolist(), math.inf]
    counts = [0] * (len(bounds) - 1)
    for x in log_ratios.astype(np.float64).tolist():
        if x != x:
            continue
        i = next(
            i for i in range(len(counts)) if bounds[i] <= x < bounds[i + 1] or (x == math.inf and i == len(counts) - 1)
        )
        counts[i] += 1
    return counts


def same_or_close(a: float, b: float, rel: float = 1e-12) -> bool:
    if math.isnan(b) or math.isinf(b):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)


def assert_chi2_close(got: float, expected: float, scale: float) -> None:
    """chi2 terms e^(2d) - 1 have both signs, so their sum can cancel: compared at the rounding of its terms
    (``scale`` bounds the sum of their magnitudes; e^(2d) - 1 is about 2d for small d)."""
    if math.isfinite(expected) and math.isfinite(scale):
        assert math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-13 * scale), (got, expected)
    else:
        assert same_or_close(got, expected), (got, expected)


def valid_per_row(mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    ends = np.cumsum(lengths)
    return np.array(
        [int(mask[e - n : e].sum()) for n, e in zip(lengths.tolist(), ends.tolist(), strict=True)], dtype=np.int64
    )
