"""How the log-ratio histogram is drawn on a symmetric-log axis, so that what the eye reads is what the tokens do.

The histogram's bins (``rcdiag.core.bins``) are logarithmic: 5 per decade from 1e-6 to 1e2 on each side. Drawn as
raw counts per bin on a symlog axis whose linear region is tiny, unimodal noise around 0 reads as two humps with a
hole at 0: a bin of one decade's fifth holds ``|x| p(x)`` worth of tokens, which vanishes at 0. So:

* the linear region reaches the bulk: ``linthresh`` is the smallest bin edge at or above the 90th percentile of
  ``|log-ratio|`` (at least the innermost edge), so noise lies in the linear part and only the tails are logarithmic;
* inside it the fine logarithmic bins near 0 are merged into one central bin over ``|x| < linthresh / 10`` (their
  widths there are far below a pixel), so the bins drawn in the linear part have comparable widths;
* every bar's height is its tokens per unit of the drawn axis (``count / (T(b) - T(a))`` with ``T`` the axis'
  transform), so a bar's area is its tokens on both sides of the boundary; ``linscale`` makes ``T`` smooth there
  (its slope the same on both sides), so the density of smooth noise does not step at ``linthresh``.

Unimodal noise then reads as one hump; a second population (outliers far out) still shows as its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.scale import SymmetricalLogTransform

BASE = 10.0
LINSCALE = (1 - 1 / BASE) / math.log(BASE)
"""matplotlib's symlog maps ``[0, linthresh]`` onto ``linscale / (1 - 1/base)`` decades: this value gives the
linear part the slope of the logarithmic part at ``linthresh`` (``1 / (linthresh ln 10)`` per unit)."""
BULK = 0.9
"""The share of tokens (by |log-ratio|) the linear region holds at least."""
CENTRAL = 10.0
"""The central merged bin spans ``|x| < linthresh / CENTRAL``."""


@dataclass(frozen=True)
class Bars:
    """One histogram as drawn: ``len(edges) == len(heights) + 1``, heights in tokens (or shares) per axis unit."""

    edges: tuple[float, ...]
    heights: tuple[float, ...]


def linthresh(edges: Sequence[float], counts: Sequence[float]) -> float:
    """The smallest positive edge with at least ``BULK`` of the tokens within it (``|x| < edge``); ``counts`` has
    one more entry than ``edges`` (the open outer bins), as ``Histogram``."""
    positive = sorted(e for e in edges if e > 0)
    total = float(sum(counts))
    if not positive or total <= 0:
        return positive[0] if positive else 1e-6
    lows = [-math.inf, *edges]
    highs = [*edges, math.inf]
    for edge in positive:
        inside = sum(c for c, lo, hi in zip(counts, lows, highs, strict=True) if lo >= -edge and hi <= edge)
        if inside >= BULK * total:
            return edge
    return positive[-1]


def transform(threshold: float) -> SymmetricalLogTransform:
    """The x axis' transform for ``threshold`` (what ``set_xscale("symlog", ...)`` with ``axis_kwargs`` draws)."""
    return SymmetricalLogTransform(BASE, threshold, LINSCALE)


def axis_kwargs(threshold: float) -> dict[str, float]:
    """``Axes.set_xscale("symlog", **axis_kwargs(t))``."""
    return {"base": BASE, "linthresh": threshold, "linscale": LINSCALE}


def bars(edges: Sequence[float], counts: Sequence[float], threshold: float, outer: float = 2.0) -> Bars:
    """The bars of one histogram: its outer open bins closed at ``outer`` times the outermost edges, the bins
    inside ``|x| < threshold / CENTRAL`` merged into one, each height its count per unit of the drawn axis."""
    closed = [outer * edges[0], *edges, outer * edges[-1]]
    bins = [(closed[i], closed[i + 1], float(c)) for i, c in enumerate(counts)]
    cut = threshold / CENTRAL
    inside = [i for i, (lo, hi, _) in enumerate(bins) if lo >= -cut and hi <= cut]  # contiguous: around 0
    if len(inside) > 1:
        first, last = inside[0], inside[-1]
        merged = (bins[first][0], bins[last][1], sum(c for _, _, c in bins[first : last + 1]))
        bins = [*bins[:first], merged, *bins[last + 1 :]]
    drawn = [lo for lo, _, _ in bins] + [bins[-1][1]]
    widths = np.diff(transform(threshold).transform(np.asarray(drawn, dtype=float)))
    heights = tuple(c / float(w) if w > 0 else 0.0 for (_, _, c), w in zip(bins, widths, strict=True))
    return Bars(tuple(drawn), heights)
