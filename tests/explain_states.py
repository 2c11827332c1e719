"""Explain states written by hand, for the detectors' boundary tests: the sums a run would have accumulated, set
directly so that a statistic lands exactly on a threshold."""

from __future__ import annotations

import numpy as np

from rcdiag.explain.breakdowns import GROUPS, N_DOUBLING, SUMS
from rcdiag.explain.state import ExplainState


def drift_state(early_k3: float, late_k3: float) -> ExplainState:
    """Every row group holds 1024 early and 1024 late tokens with the given k3_kl."""
    state = ExplainState()
    sums = np.zeros((GROUPS, N_DOUBLING, len(SUMS)))
    for bucket, k3 in ((0, early_k3), (4, late_k3)):
        sums[:, bucket, 0] = 1024
        sums[:, bucket, SUMS.index("k3")] = 1024 * k3
    state.breakdowns.position = sums
    return state
