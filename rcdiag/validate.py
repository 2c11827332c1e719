"""Value checks on the valid tokens of a chunk: what is not a log-prob is an input error, never a silent NaN."""

from __future__ import annotations

import numpy as np

from rcdiag.errors import InputError
from rcdiag.io.base import Chunk

POSITIVE_TOLERANCE = 1e-3
"""A log-prob above this is not a log-prob (probabilities, logits or a sign error); see docs/input.md."""


def check_values(chunk: Chunk, old: np.ndarray, rollout: np.ndarray, lengths: np.ndarray) -> None:
    """NaN, +inf or a positive log-prob at a valid position is an ``InputError`` (``-inf`` is legal)."""
    for name, values in zip(chunk.column_names, (old, rollout), strict=True):
        if not values.size or values.max() <= POSITIVE_TOLERANCE:  # one pass, no allocation; NaN fails it
            continue
        ok = values <= POSITIVE_TOLERANCE
        bad_index = np.flatnonzero(~ok)
        first = int(bad_index[0])
        value = float(values[first])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        rows = np.searchsorted(offsets, bad_index, side="right") - 1
        row = int(rows[0])
        if value != value:
            what = "NaN"
        elif value == float("inf"):
            what = "+inf"
        else:
            what = f"a positive log-prob ({value:.6g}); log-probs are <= 0 (is this column probabilities or logits?)"
        raise InputError(
            f"holds {what} at valid position {first - int(offsets[row])} of the response; "
            f"{len(np.unique(rows))} row(s) of this chunk are affected",
            path=chunk.source or None,
            row=chunk.first_row + row,
            column=name,
        )
