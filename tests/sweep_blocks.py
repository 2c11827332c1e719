"""Random float32 log-ratio blocks for the sweep's cell scan: values near the cut edges, on them and one ulp away,
and special values, with a random subset of the edges (shared by the kernel's tests and its numpy twin's)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

EDGES = [-0.6931, -0.1, -0.001, 0.0, 1e-4, 0.001, 0.1, 0.6931, 1.5, 2.0]
SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38]


@st.composite
def blocks(draw, long: bool = False) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """float32 values in rows of random lengths (some empty): values near the edges, on them (and one ulp
    away), special values; and a random subset of the edges."""
    rows = draw(st.integers(1, 12))
    top = 6000 if long else 40
    lengths = np.array(draw(st.lists(st.integers(0, top), min_size=rows, max_size=rows)), dtype=np.int64)
    edges = draw(st.lists(st.sampled_from(EDGES), unique=True, max_size=len(EDGES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = int(lengths.sum())
    x = rng.normal(0.0, draw(st.sampled_from([1e-3, 0.05, 1.0])), n).astype(np.float32)
    on_edge = rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.4]))
    if edges and on_edge.any():
        picked = np.asarray(edges, dtype=np.float32)[rng.integers(0, len(edges), int(on_edge.sum()))]
        step = rng.integers(-1, 2, picked.shape[0])  # the edge, or one ulp below or above
        away = np.nextafter(picked, np.where(step > 0, np.float32(np.inf), np.float32(-np.inf)))
        x[on_edge] = np.where(step == 0, picked, away)
    special = rng.random(n) < draw(st.sampled_from([0.0, 0.02, 0.2]))
    x[special] = rng.choice(np.asarray(SPECIAL, dtype=np.float32), int(special.sum()))
    return x, lengths, edges
