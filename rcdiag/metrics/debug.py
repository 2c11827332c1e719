"""verl's five debug metrics (``verl.utils.debug.metrics.calculate_debug_metrics``), logged under ``training/``.

verl's trainer calls it every step in decoupled mode only (where it recomputes ``old_log_probs``; bypass mode
never does), right after that recomputation and before rollout correction changes the mask: so on the original
response mask, every valid token of the batch. It compares the two engines in probability space,
``p = exp(log-prob)``:

* ``rollout_probs_diff_valid``: 1 for a batch with a valid token; 0 without one (verl >= 0.8.0, the others
  NaN; verl 0.7.1 raises instead, ``rcdiag.settings.versions.VerlVersion.debug_metrics_on_empty``);
* ``rollout_probs_diff_max`` / ``_mean`` / ``_std``: of ``|p_old - p_rollout|`` over the valid tokens, the std
  with Bessel's correction (``torch.std``; NaN for a single token);
* ``rollout_actor_probs_pearson_corr``: ``torch.corrcoef`` of ``p_old`` and ``p_rollout`` (clipped to [-1, 1];
  NaN where either side has no spread).

The probabilities and their gaps are float32, as in verl (its exp and subtraction: the max is verl's value up to
the last bit of ``exp``); everything summed is summed in float64, as moments (Chan's merge) and a co-moment
(``rcdiag.core.formulas.chan_merge_comoment``), so chunks, workers and steps merge exactly, and verl's float32
mean, std and correlation lie within their float32 rounding of rcdiag's. A float32 ``exp`` costs a twentieth of a
float64 one here (numpy's SIMD loop), which keeps these metrics at a few ns per token.
"""

from __future__ import annotations

import math
from typing import ClassVar

from rcdiag.core.formulas import correlation
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash
from rcdiag.metrics.block import Block
from rcdiag.settings.versions import VerlVersion

DEBUG_KEYS = (
    "training/rollout_probs_diff_valid",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
)
"""verl's keys, in the order ``calculate_debug_metrics`` returns them."""


class DebugMetrics(Accumulator):
    """The ``training/rollout_*probs*`` keys of one batch (see the module docstring)."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "tokens": "sum",
        "diff": "moments",
        "diff_max": "max",
        "probs": "comoments",
    }

    def __init__(self, version: VerlVersion) -> None:
        super().__init__()
        self.on_empty = version.debug_metrics_on_empty
        """Whether an empty batch gives valid 0 and NaN (verl >= 0.8.0) rather than raising (0.7.1)."""

    def signature(self) -> tuple:
        return (type(self).__name__, self.on_empty)

    def update(self, block: Block) -> None:
        b = block.b
        p_old, p_rollout = b.exp(block.old), b.exp(block.rollout)
        diff = b.abs(p_old - p_rollout)
        self.add(
            tokens=block.n_tokens,
            diff=b.moments(diff),
            diff_max=b.max(diff),
            probs=b.comoments(p_old, p_rollout),
        )

    def keys(self) -> list[str]:
        return list(DEBUG_KEYS)

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """The five values; a batch without a valid token gives valid 0 and NaN (>= 0.8.0) or ``None`` everywhere
        (0.7.1, which raises: the batch's crash note says so, ``rcdiag.metrics.batch.empty_batch_crash``)."""
        st = self.state
        if st["tokens"] == 0:
            if not self.on_empty:
                return dict.fromkeys(DEBUG_KEYS), []
            return {DEBUG_KEYS[0]: 0.0, **dict.fromkeys(DEBUG_KEYS[1:], math.nan)}, []
        diff, probs = st["diff"], st["probs"]
        return {
            "training/rollout_probs_diff_valid": 1.0,
            "training/rollout_probs_diff_max": st["diff_max"],
            "training/rollout_probs_diff_mean": diff.mean,
            "training/rollout_probs_diff_std": math.sqrt(diff.unbiased_variance) if diff.n > 1 else math.nan,
            "training/rollout_actor_probs_pearson_corr": correlation(probs.m2_x, probs.m2_y, probs.c),
        }, []
