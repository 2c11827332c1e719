"""verl's 13 off-policy metrics (``compute_offpolicy_metrics``), always computed, on the original mask.

Row sets: the PPL, log-PPL, ``log_ppl_*``, ``ppl_ratio`` and ``chi2_seq`` metrics average over **all** rows of
the batch, empty rows included (their per-row mean log-prob is 0, so they contribute PPL 1 and chi2 term 1);
``kl``, ``k3_kl`` and ``chi2_token`` are token-weighted over valid tokens. ``kl``, ``k3_kl`` and the PPLs use the
unclamped log-ratio; ``chi2_token`` and ``chi2_seq`` clamp to [-20, 20] (chi2_seq clamps the per-row sum).
Nothing is computed as a difference of nearly equal numbers: k3 as ``expm1(d) - d`` and chi2 as the mean of
``expm1(2d)`` (not E[ratio^2] - 1), in float64.
"""

from __future__ import annotations

from typing import ClassVar

from rcdiag.core.formulas import clamp_log_ratio
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash
from rcdiag.metrics.block import Block

OFFPOLICY_KEYS = (
    "training_ppl",
    "training_log_ppl",
    "kl",
    "k3_kl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
)


class OffPolicyMetrics(Accumulator):
    """kl, k3_kl, chi2_token/seq, training/rollout PPL and log-PPL differences."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "rows": "sum",
        "tokens": "sum",
        "exp_neg_mo": "sum",
        "neg_mo": "sum",
        "exp_neg_mr": "sum",
        "neg_mr": "sum",
        "neg_lr": "sum",
        "k3": "sum",
        "delta": "sum",
        "abs_delta": "sum",
        "delta_max": "max",
        "delta_min": "min",
        "exp_delta": "sum",
        "chi2_token": "sum",
        "chi2_seq": "sum",
    }

    def update(self, block: Block) -> None:
        b = block.b
        mo, mr = block.row_mean_old, block.row_mean_rollout
        delta = mr - mo
        s = block.seq_log_ratio
        self.add(
            rows=block.n_rows,
            tokens=block.n_tokens,
            exp_neg_mo=b.sum(b.exp(-mo)),
            neg_mo=-b.sum(mo),
            exp_neg_mr=b.sum(b.exp(-mr)),
            neg_mr=-b.sum(mr),
            neg_lr=-b.sum(block.row_sum_lr),
            k3=block.sums.k3_sum,
            delta=b.sum(delta),
            abs_delta=b.sum(b.abs(delta)),
            delta_max=b.max(delta),
            delta_min=b.min(delta),
            exp_delta=b.sum(b.exp(delta)),
            chi2_token=block.sums.chi2_sum,
            chi2_seq=b.sum(b.expm1(2.0 * clamp_log_ratio(b, s))),
        )

    def keys(self) -> list[str]:
        return list(OFFPOLICY_KEYS)

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st = self.state
        rows, tokens = st["rows"], st["tokens"]
        if tokens == 0:
            return dict.fromkeys(OFFPOLICY_KEYS), []
        token_level = token_metrics(tokens, -st["neg_lr"], st["k3"], st["chi2_token"])
        values = {
            "training_ppl": st["exp_neg_mo"] / rows,
            "training_log_ppl": st["neg_mo"] / rows,
            "kl": token_level["kl"],
            "k3_kl": token_level["k3_kl"],
            "rollout_ppl": st["exp_neg_mr"] / rows,
            "rollout_log_ppl": st["neg_mr"] / rows,
            "log_ppl_diff": st["delta"] / rows,
            "log_ppl_abs_diff": st["abs_delta"] / rows,
            "log_ppl_diff_max": st["delta_max"],
            "log_ppl_diff_min": st["delta_min"],
            "ppl_ratio": st["exp_delta"] / rows,
            "chi2_token": token_level["chi2_token"],
            "chi2_seq": st["chi2_seq"] / rows,
        }
        return values, []


def token_metrics(tokens: float, lr_sum: float, k3_sum: float, chi2_sum: float) -> dict[str, float]:
    """verl's token-weighted off-policy metrics from sums of the per-token terms over any set of valid tokens (a
    batch, or one bucket of ``analyze --explain``'s breakdowns): kl = mean(rollout - old), k3_kl = mean of
    ``rcdiag.core.formulas.k3``, chi2_token = mean of ``rcdiag.core.formulas.chi2_term``."""
    return {"kl": -lr_sum / tokens, "k3_kl": k3_sum / tokens, "chi2_token": chi2_sum / tokens}
