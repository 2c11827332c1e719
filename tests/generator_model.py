"""What the synthetic generator's parameters imply, computed without sampling tokens: an independent oracle for
values measured on generated dumps (``rcdiag.io.synthetic``).

At each position the generator draws logits z (vocabulary ``vocab``, scale lognormal(log 2.5, 0.5)) and engine
noise eps; the rollout engine's distribution is q = softmax((z + eps) / T_rollout) (renormalised over its top-k),
the trainer's is p = softmax(z / T_train), and the token is drawn from q. So per token, with d = log p(y) - log q(y)
and y ~ q, the expectations over y are exact sums over the vocabulary:

* kl (mean of log q - log p): KL(q || p);
* k3_kl (mean of e^d - 1 - d): sum_{y in supp q} p(y) - 1 + KL(q || p);
* token_mult_prob_error (mean of e^|d|): sum_y q(y) e^|d(y)|.

Averaging them over many drawn positions gives the population mean, and their spread (across positions, plus
the token draw within one) the token-level standard deviation, so a dump of N tokens measures each within a few
sd / sqrt(N) of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rcdiag.io.synthetic import SCENARIOS, Scenario


@dataclass(frozen=True)
class Expected:
    """Population mean and token-level standard deviation of a per-token quantity."""

    mean: float
    sd: float
    positions: int
    """Positions the mean was averaged over (its own Monte Carlo error is at most sd / sqrt(positions))."""

    def bracket(self, tokens: int, sigmas: float = 4.0) -> tuple[float, float]:
        """Where a dump of ``tokens`` tokens measures the mean: ``sigmas`` standard errors either side (the
        dump's, sd / sqrt(tokens), and this estimate's own)."""
        half = sigmas * self.sd * math.sqrt(1.0 / tokens + 1.0 / self.positions)
        return self.mean - half, self.mean + half

    def holds(self, value: float, tokens: int) -> bool:
        low, high = self.bracket(tokens)
        return low <= value <= high


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = np.max(x, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def _per_position(spec: Scenario, noise: float, positions: int, vocab: int, rng: np.random.Generator) -> dict:
    """Per position: E_y[x] and E_y[x^2] of each quantity x, for the given engine-noise level."""
    scale = rng.lognormal(math.log(2.5), 0.5, (positions, 1))
    z = rng.standard_normal((positions, vocab)) * scale
    rollout_logits = (z + rng.standard_normal((positions, vocab)) * noise) / spec.t_rollout
    if spec.top_k is not None:
        kth = np.sort(rollout_logits, axis=1)[:, vocab - spec.top_k : vocab - spec.top_k + 1]
        rollout_logits = np.where(rollout_logits >= kth, rollout_logits, -np.inf)
    log_q = _log_softmax(rollout_logits)
    log_p = _log_softmax(z / spec.t_train)
    q = np.exp(log_q)
    with np.errstate(invalid="ignore"):
        d = np.where(q > 0, log_p - log_q, 0.0)
    values = {"kl": -d, "k3_kl": np.expm1(d) - d, "token_mult_prob_error": np.exp(np.abs(d))}
    return {name: ((q * x).sum(1), (q * x * x).sum(1)) for name, x in values.items()}


def expected(scenario: str | Scenario, *, positions: int = 60_000, vocab: int = 48, seed: int = 12345) -> dict:
    """``{"kl" | "k3_kl" | "token_mult_prob_error": Expected}`` for a scenario (outliers as a mixture)."""
    spec = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    rng = np.random.default_rng(seed)
    parts = [(1.0 - spec.outlier_rate, _per_position(spec, spec.noise, positions, vocab, rng))]
    if spec.outlier_rate:
        parts.append((spec.outlier_rate, _per_position(spec, spec.outlier_noise, positions, vocab, rng)))
    out = {}
    for name in parts[0][1]:
        mean = sum(w * float(p[name][0].mean()) for w, p in parts)
        second = sum(w * float(p[name][1].mean()) for w, p in parts)
        out[name] = Expected(mean, math.sqrt(max(second - mean * mean, 0.0)), positions)
    return out
