"""Diagnostics rcdiag adds beyond verl's keys; reported under ``rcdiag/``, never under ``rollout_corr/``.

* ``abs_log_ratio_mean`` / ``abs_log_ratio_max``: mean and max of |log pi_train - log pi_rollout| over valid
  tokens: the number TRL (``sampling_logp_difference``), slime (``train_rollout_logprob_abs_diff``) and SkyRL log.
* ``token_mult_prob_error``: mean of exp(|log-ratio|) over valid tokens (NeMo-RL's metric; 1.0 is exact).
* ``kl_std_error``: standard error of ``kl``, treating sequences (not tokens) as the independent units, since
  tokens of one response are correlated: sqrt(sum_i (S_i - kl_hat * n_i)^2) / N with S_i the row sum of
  log(pi_rollout/pi_train) and n_i its valid tokens. The sum of squares comes from the moments of the row means
  x_i = S_i / n_i weighted by n_i^2 (mean mu, M2) as M2 + sum(n_i^2) (mu - kl_hat)^2, a sum of non-negative terms,
  not from raw moments (sum S^2 - 2 kl_hat sum S n + ...), which cancel when the spread is small.
* ``kl_std_error_dof``: degrees of freedom of that standard error, (sum_i n_i^2)^2 / sum_i n_i^4 (Satterthwaite,
  with a response's variance growing as the square of its length): a few long responses leave few.
* ``clamped_token_fraction``: share of valid tokens whose |log-ratio| exceeds verl's safety bound of 20, where
  verl's clamps change the IS weights and chi2.
"""

from __future__ import annotations

import math
from typing import ClassVar

from rcdiag.catalogue.keys import Key
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash, cluster_std_error
from rcdiag.metrics.block import Block

EXTRA_KEYS = (
    Key.ABS_LOG_RATIO_MEAN,
    Key.ABS_LOG_RATIO_MAX,
    Key.TOKEN_MULT_PROB_ERROR,
    Key.KL_STD_ERROR,
    Key.KL_STD_ERROR_DOF,
    Key.CLAMPED_TOKEN_FRACTION,
)


class ExtraMetrics(Accumulator):
    """rcdiag's own mismatch diagnostics (see the module docstring)."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "tokens": "sum",
        "abs_sum": "sum",
        "abs_max": "max",
        "exp_abs": "sum",
        "clamped": "sum",
        "s_sum": "sum",
        "row_mean": "moments",
        "n_4": "sum",
    }

    def update(self, block: Block) -> None:
        b = block.b
        sums = block.sums
        s = block.row_sum_lr
        n = block.row_len
        low, high = block.lr_range
        self.add(
            tokens=block.n_tokens,
            abs_sum=sums.abs_sum,
            abs_max=max(-low, high) if block.n_tokens else -math.inf,
            exp_abs=sums.exp_abs_sum,
            clamped=sums.clamped,
            s_sum=b.sum(s),
            row_mean=b.moments(block.row_mean(s), n * n),
            n_4=b.dot(n * n, n * n),
        )

    def keys(self) -> list[str]:
        return list(EXTRA_KEYS)

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st = self.state
        n = st["tokens"]
        if n == 0:
            return dict.fromkeys(EXTRA_KEYS), []
        mean_lr = st["s_sum"] / n
        # sum_i (S_i - m n_i)^2 = sum_i n_i^2 (x_i - m)^2 = M2 + W (mu - m)^2 (x_i, mu, M2, W: row-mean moments)
        x = st["row_mean"]
        return {
            Key.ABS_LOG_RATIO_MEAN: st["abs_sum"] / n,
            Key.ABS_LOG_RATIO_MAX: st["abs_max"],
            Key.TOKEN_MULT_PROB_ERROR: st["exp_abs"] / n,
            Key.KL_STD_ERROR: cluster_std_error(x, mean_lr, n),
            Key.KL_STD_ERROR_DOF: x.n**2 / st["n_4"],  # x.n = sum_i n_i^2
            Key.CLAMPED_TOKEN_FRACTION: st["clamped"] / n,
        }, []
