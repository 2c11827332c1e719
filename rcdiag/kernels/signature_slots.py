"""The slots of the signature pass's totals (no numba: the accumulator and a small dump's numpy path read them)."""

from __future__ import annotations

TOTALS = (
    "n", "ratio", "reverse", "d", "d2", "mid", "mid2", "d_mid",
    "pairs", "pair_same", "pair_ahead", "pair_behind", "valid", "rollout_zero", "both_zero", "identical",
)  # fmt: skip
"""The slots of ``rcdiag.kernels.signatures.signature_pass``'s ``totals``, in order."""
