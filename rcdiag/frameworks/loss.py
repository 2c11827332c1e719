"""The PPO loss's clipped surrogate, as the frameworks that reproduce it from the dump's loss inputs (the current
policy's log-probs and the advantages) compute it alike: float32, as torch does."""

from __future__ import annotations

import numpy as np


def ppo_clip(
    ratio: np.ndarray, advantages: np.ndarray, eps_low: float, eps_high: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each token's PPO loss ``max(-A r, -A clamp(r, 1 - eps_low, 1 + eps_high))`` (the bounds rounded to float32,
    as torch's clamp rounds them) and where the clip binds (the clipped term the larger loss: ``surr2 < surr1``)."""
    clipped = np.minimum(np.maximum(ratio, np.float32(1 - eps_low)), np.float32(1 + eps_high))
    unclipped_loss, clipped_loss = -advantages * ratio, -advantages * clipped
    return np.maximum(unclipped_loss, clipped_loss), unclipped_loss < clipped_loss
