"""The ``--explain`` sums by their definitions (per row, per token, numpy's own ``expm1`` and ``exp``) and random
blocks to feed them: the reference the fused explain pass (``rcdiag.kernels.explain``), its compiled and numpy twins
and the detectors' state are checked against."""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
from hypothesis import strategies as st

from rcdiag.explain.breakdowns import DOUBLING_EDGES, GROUPS, LOG_PROB_THRESHOLDS, N_DOUBLING, N_PROB, PROB_EDGES
from rcdiag.explain.statistics import LIKELY, RATIO_CAP, SHIFT_TOL, UNLIKELY, ShapeSums

LOG_F32_MAX = math.log(float(np.finfo(np.float32).max))
SPECIAL = [0.0, -1e-7, -0.3, -0.35, -3.0, -19.99, -20.0, -20.5, -89.0, -100.0, -np.inf]
NAMES = ("prob", "position", "length", "scale", "offset", "shape")
LOG_UNLIKELY = LOG_PROB_THRESHOLDS[PROB_EDGES.index(UNLIKELY) - 1]
LOG_LIKELY = LOG_PROB_THRESHOLDS[PROB_EDGES.index(LIKELY) - 1]
SHAPE_COUNTS = [0, 4, 5, 9, 10, 14, 15, 16]
"""The shape sums that are counts (n and n^2 of each statistic, the two shift counts): exact."""
SHAPE_RATIO = [11, 12, 13]
"""The shape sums of the capped ratio (float32 ``exp``)."""


def empty_sums() -> dict[str, np.ndarray]:
    return {
        "prob": np.zeros((N_PROB, 5)),
        "position": np.zeros((GROUPS, N_DOUBLING, 5)),
        "length": np.zeros((N_DOUBLING, 5)),
        "scale": np.zeros((GROUPS, 6)),
        "offset": np.zeros((GROUPS, 4)),
        "shape": np.zeros(ShapeSums.SIZE),
    }


def reference(old, rollout, mask, lengths, magnitude: bool = False) -> dict[str, np.ndarray]:
    """The sums by their definitions, one row and one token at a time (``magnitude``: of the terms' absolute
    values, the scale a rounding tolerance is relative to)."""
    with np.errstate(all="ignore"):
        return _reference(old, rollout, mask, lengths, magnitude)


def _reference(old, rollout, mask, lengths, magnitude: bool) -> dict[str, np.ndarray]:
    out = empty_sums()
    start = 0
    for length in lengths.tolist():
        o, r = old[start : start + length], rollout[start : start + length]
        valid = np.ones(length, dtype=bool) if mask is None else mask[start : start + length]
        start += length
        positions = np.flatnonzero(valid)
        o, r = o[valid], r[valid]
        n = o.shape[0]
        key = (n << 32) ^ (int(o[:1].view(np.uint32)[0]) if n else 0)
        group = ((key * 0x9E3779B97F4A7C15) % 2**64) >> 60
        if n == 0:
            continue
        d32 = o - r
        d = d32.astype(np.float64)
        k3 = np.where(d > LOG_F32_MAX, np.inf, np.expm1(d) - d)
        clamped = np.clip(d, -20.0, 20.0)
        chi2 = np.expm1(clamped) * (np.expm1(clamped) + 2.0)
        ratio = np.minimum(np.exp(clamped.astype(np.float32)), np.float32(RATIO_CAP))
        finite = np.isfinite(o) & np.isfinite(r)
        x, y = np.where(finite, o, np.float32(0)), np.where(finite, r, np.float32(0))
        scale = [finite, x, y, x * x, y * y, x * y]
        offset = [np.ones(n), ratio, d32 < np.float32(-SHIFT_TOL), d32 > np.float32(SHIFT_TOL)]
        terms = np.stack([np.ones(n), d, np.abs(d), k3, chi2], axis=1)
        fold = np.abs if magnitude else (lambda v: v)
        length_bucket = bisect.bisect_right(DOUBLING_EDGES, n) - 1
        for j in range(n):  # inf - inf is NaN here as in the kernel
            p = math.exp(float(r[j])) if not math.isnan(r[j]) else math.nan
            prob_bucket = sum(p >= edge for edge in PROB_EDGES[1:-1])
            out["prob"][prob_bucket] += fold(terms[j])
            out["position"][group, bisect.bisect_right(DOUBLING_EDGES, int(positions[j])) - 1] += fold(terms[j])
            out["length"][length_bucket] += fold(terms[j])
        out["scale"][group] += [fold(np.asarray(v, dtype=np.float64)).sum() for v in scale]
        out["offset"][group] += [fold(np.asarray(v, dtype=np.float64)).sum() for v in offset]
        unlikely, likely = finite & (o < LOG_UNLIKELY), finite & (o >= LOG_LIKELY)
        ratio_sum = ratio.astype(np.float64).sum()
        per_row = [
            (unlikely.sum(), fold(d[unlikely]).sum()),
            (likely.sum(), fold(d[likely]).sum()),
            (n, ratio_sum + n if magnitude else ratio_sum - n),
        ]
        cluster = [[k, v, v * v, k * v, k * k] for k, v in per_row]
        counts = [(likely & (d32 < np.float32(-SHIFT_TOL))).sum(), (likely & (d32 > np.float32(SHIFT_TOL))).sum()]
        out["shape"] += np.array([*itertools.chain(*cluster), *counts], dtype=np.float64)
    return out


def assert_sums_match(got: dict[str, np.ndarray], old, rollout, mask, lengths, names=NAMES) -> None:  # type: ignore[no-untyped-def]
    """Counts exactly; sums to 1e-12 of the sum of their terms' magnitudes (float64 rounding in another order),
    the capped IS ratio to 1e-6 (float32 ``exp``, which numpy takes to within a few ulps); inf and NaN where the
    reference has them. ``names``: the sums ``got`` holds (the detectors' state: no ``prob`` or ``length``)."""
    want, size = reference(old, rollout, mask, lengths), reference(old, rollout, mask, lengths, magnitude=True)
    for name in names:
        g, w, s = got[name], want[name], size[name]
        rtol = np.full(w.shape, 1e-12)
        if name == "offset":
            rtol[..., 1] = 1e-6
        if name == "shape":
            rtol[SHAPE_RATIO] = 1e-6
        finite = np.isfinite(w)
        assert np.array_equal(np.isnan(g), np.isnan(w)), name
        assert np.array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)]), name
        assert (np.abs(g[finite] - w[finite]) <= rtol[finite] * s[finite] + 1e-300).all(), name
    columns_of = (
        ("prob", 0),
        ("position", 0),
        ("length", 0),
        ("scale", 0),
        ("offset", [0, 2, 3]),
        ("shape", SHAPE_COUNTS),
    )
    for name, columns in columns_of:
        if name in names:
            assert np.array_equal(got[name][..., columns], want[name][..., columns]), name  # counts: exact


@st.composite
def blocks(draw, nan: bool = True):
    """Rows of random lengths (some empty, some crossing several position buckets), values near each other or
    special (NaN and +inf only where ``nan``), a mask (with fully masked rows) or none."""
    lengths = np.array(
        draw(st.lists(st.one_of(st.integers(0, 40), st.integers(0, 300)), min_size=1, max_size=10)), dtype=np.int64
    )
    n = int(lengths.sum())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    old = -np.abs(rng.normal(0.0, 2.0, n))
    rollout = old + rng.normal(0.0, draw(st.sampled_from([1e-6, 1e-3, 0.05, 0.3, 3.0, 30.0])), n)
    specials = [*SPECIAL, np.nan, np.inf] if nan else SPECIAL
    for values in (old, rollout):
        special = rng.random(n) < draw(st.sampled_from([0.0, 0.05, 0.3]))
        values[special] = rng.choice(specials, int(special.sum()))
    rollout = np.where(np.isnan(rollout), rollout, np.minimum(rollout, 0.0))
    mask = None if draw(st.booleans()) else rng.random(n) < draw(st.sampled_from([0.2, 0.8, 1.0]))
    return old.astype(np.float32), rollout.astype(np.float32), mask, lengths
