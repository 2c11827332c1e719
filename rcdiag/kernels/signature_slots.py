"""The slots of the signature pass's totals and per-row sums (no numba: the accumulator and a small dump's numpy path
read them)."""

from __future__ import annotations

TOTALS = (
    "n", "ratio", "reverse", "d", "d2", "mid", "mid2", "d_mid",
    "pairs", "pair_same", "pair_ahead", "pair_behind", "valid", "rollout_zero", "both_zero", "identical",
    "certain_lowered", "rollout_certain_lowered", "rollout_far_higher", "rollout_far_higher_top1",
    "trainer_far_higher",
)  # fmt: skip
"""The slots of ``rcdiag.kernels.signatures.signature_pass``'s ``totals``, in order."""
CERTAIN = ("certain_d", "certain_n", "rollout_certain_d", "rollout_certain_n")
"""The columns of ``signature_pass``'s per-row ``row_certain``: the sum of the log-ratio d over the row's tokens the
trainer gives at least the certainty bound and their count; the sum of -d over those the rollout gives it, and
theirs."""
HISTORY = ("repeat_d", "repeat_old", "repeat_n", "first_d", "first_old", "first_n")
"""The columns of ``rcdiag.kernels.signatures.history_pass``'s per-row ``row_history``: over the row's valid tokens
whose id occurred earlier in the row (repeated) and those whose id did not (first seen), the sums of the log-ratio
d and of the trainer's log-prob, and the count."""
ID_LIMIT = 1 << 26
"""Token ids at or above this (beyond any vocabulary) take no part in the history test."""
