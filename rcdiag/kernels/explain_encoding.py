"""The constants the ``--explain`` kernel (``rcdiag.kernels.explain``) encodes its sums with: the series cut-off of
its ``expm1`` and the hash that deals rows into groups. Plain constants, without numba, so the state layout
(``rcdiag.engine.state_files.state_layout``) can name them without compiling anything."""

from __future__ import annotations

SERIES_TERMS = 15
"""Terms of the ``expm1`` Taylor series (degree 14)."""
SMALL = 0.34
"""Below this |d| (just under ln2/2) ``_expm1``'s reduction is the identity (k = 0): rows whose log-ratios all lie
below it take ``_expm1_series`` directly, with the same result."""
GOLDEN = 0x9E3779B97F4A7C15
"""The multiplier of the row-group hash (Fibonacci hashing of a row's valid length and first trainer log-prob)."""
GROUP_SHIFT = 60
"""The hash keeps its top 64 - 60 = 4 bits: 16 groups (``rcdiag.explain.breakdowns.GROUPS``)."""


def layout() -> dict[str, float | int]:
    """The constants a saved ``--explain`` state depends on (read when called, so a changed one shows)."""
    return {"SERIES_TERMS": SERIES_TERMS, "SMALL": SMALL, "GOLDEN": GOLDEN, "GROUP_SHIFT": GROUP_SHIFT}
