"""The signature statistics: what tells precision noise from a bug, computed on every run (docs/verdict.md).

Precision noise (bf16, fp8, a 4-bit rollout, MoE routing) has a shape: for tokens sampled from the rollout, the
capped importance ratio pi_train / pi_rollout has mean at most 1 (the trainer's mass on what the rollout can
sample), the log-ratio d = old - rollout barely depends on how likely the token is, its energy is spread over the
tokens (not a constant per row), and no neighbouring position agrees better than the token's own. Each statistic
here tests one of these, so the verdict names ``noise`` only when every one holds, and names a bug class by its
own evidence when one fails:

* ``capped_ratio_mean`` (and ``_std_error``, responses as the units): E[min(e^d, e^3)]. Above 1 beyond noise, the
  rollout's log-probs are not those of the distribution its tokens were drawn from (raw log-probs, an offset,
  swapped columns, a misaligned trainer). ``reverse_ratio_mean``: the same with the columns exchanged, at most 1
  when the columns are swapped.
* ``shape_corr``: the correlation of d with the mean of the two log-probs: a temperature, a penalty or soft-capping
  moves likely and unlikely tokens apart (|r| 0.4-0.9 on the tests' real model), noise barely (|r| <= 0.27).
* ``within_row_share``: the share of sum d^2 left after each response's mean d is taken out: about 1 for noise,
  about 0 for a constant offset on some or all responses.
* ``shifted_ahead_ratio`` / ``shifted_behind_ratio``: mean |old[t] - rollout[t+1]| (and |old[t+1] - rollout[t]|)
  over mean |old[t] - rollout[t]|, over pairs of neighbouring valid tokens of one response: far below 1 when the two
  columns are offset by a position (an alignment bug), far above 1 otherwise.
* ``rollout_zero_fraction``: valid tokens the rollout scores exactly 0.0 (probability 1) where the trainer gives
  p < e^-0.1: tokens it never sampled (prompt tokens or padding inside the mask). ``both_zero_fraction``: valid
  tokens exactly 0.0 on both sides (padding read as valid: an inverted mask). ``identical_fraction``: valid tokens
  whose two float32 values are bit-identical.

Statistics are over the valid tokens whose log-ratio is a number (a token -inf on both sides has none).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from rcdiag.metrics.base import Accumulator, MetricValue, Moments, Reduce, VerlCrash
from rcdiag.metrics.block import Block

RATIO_CAP_LOG = 3.0
"""Each token's ratio is capped at e^3 (as ``--explain``'s offset statistic), so a few outliers cannot move it."""
ZERO_TRAINER_MAX = -0.1
"""A rollout log-prob of exactly 0.0 counts as a token it never sampled where the trainer's is below this."""

SIGNATURE_KEYS = (
    "rcdiag/capped_ratio_mean",
    "rcdiag/capped_ratio_std_error",
    "rcdiag/reverse_ratio_mean",
    "rcdiag/reverse_ratio_std_error",
    "rcdiag/shape_corr",
    "rcdiag/within_row_share",
    "rcdiag/shifted_ahead_ratio",
    "rcdiag/shifted_behind_ratio",
    "rcdiag/rollout_zero_fraction",
    "rcdiag/both_zero_fraction",
    "rcdiag/identical_fraction",
)


class SignatureMetrics(Accumulator):
    """The signature statistics (see the module docstring)."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "n": "sum",
        "ratio": "sum",
        "ratio_rows": "moments",
        "reverse": "sum",
        "reverse_rows": "moments",
        "d": "sum",
        "d2": "sum",
        "mid": "sum",
        "mid2": "sum",
        "d_mid": "sum",
        "row_energy": "sum",
        "pairs": "sum",
        "pair_same": "sum",
        "pair_ahead": "sum",
        "pair_behind": "sum",
        "valid": "sum",
        "rollout_zero": "sum",
        "both_zero": "sum",
        "identical": "sum",
    }
    COUNTED: ClassVar[frozenset[str]] = Accumulator.COUNTED | frozenset(
        {"n", "pairs", "valid", "rollout_zero", "both_zero", "identical", "d2", "mid2", "row_energy"}
    )

    def update(self, block: Block) -> None:
        old32 = np.ascontiguousarray(block.b.to_numpy(block.old), dtype=np.float32)
        rollout32 = np.ascontiguousarray(block.b.to_numpy(block.rollout), dtype=np.float32)
        lengths = np.asarray(block.b.to_numpy(block.row_len)).astype(np.int64)
        zero = rollout32 == 0.0
        self.add(
            valid=old32.shape[0],
            rollout_zero=int(np.count_nonzero(zero & (old32 < ZERO_TRAINER_MAX))),
            both_zero=int(np.count_nonzero(zero & (old32 == 0.0))),
            identical=int(np.count_nonzero(old32.view(np.int32) == rollout32.view(np.int32))),
        )
        old, rollout = old32.astype(np.float64), rollout32.astype(np.float64)
        d = old - rollout
        finite = np.isfinite(d)
        if not finite.all():
            rows = np.repeat(np.arange(lengths.shape[0]), lengths)[finite]
            lengths = np.bincount(rows, minlength=lengths.shape[0])
            old, rollout, d = old[finite], rollout[finite], d[finite]
        self._update_tokens(old, rollout, d, lengths)
        self._update_pairs(block)

    def _update_tokens(self, old: np.ndarray, rollout: np.ndarray, d: np.ndarray, lengths: np.ndarray) -> None:
        if d.shape[0] == 0:
            return
        ratio = np.expm1(np.minimum(d, RATIO_CAP_LOG))  # ratio - 1: small sums, no cancellation against 1
        reverse = np.expm1(np.minimum(-d, RATIO_CAP_LOG))
        mid = 0.5 * (old + rollout)
        kept = lengths > 0
        starts = (np.cumsum(lengths) - lengths)[kept]
        n = lengths[kept].astype(np.float64)
        row_d = np.add.reduceat(d, starts)
        self.add(
            n=float(d.shape[0]),
            ratio=float(ratio.sum()),
            ratio_rows=_row_moments(np.add.reduceat(ratio, starts), n),
            reverse=float(reverse.sum()),
            reverse_rows=_row_moments(np.add.reduceat(reverse, starts), n),
            d=float(d.sum()),
            d2=float(np.dot(d, d)),
            mid=float(mid.sum()),
            mid2=float(np.dot(mid, mid)),
            d_mid=float(np.dot(d, mid)),
            row_energy=float(np.dot(row_d, row_d / n)),
        )

    def _update_pairs(self, block: Block) -> None:
        """Neighbouring valid tokens of one response, on the rows as read (padding included)."""
        old, rollout, mask, raw_lengths = block.raw
        old = np.asarray(old, dtype=np.float32)
        rollout = np.asarray(rollout, dtype=np.float32)
        if old.shape[0] < 2:
            return
        ok = np.ones(old.shape[0] - 1, dtype=bool)
        ends = np.cumsum(np.asarray(raw_lengths, dtype=np.int64))[:-1] - 1  # a row's last token: no pair after it
        ok[ends[(ends >= 0) & (ends < ok.shape[0])]] = False
        if mask is not None:
            ok &= mask[:-1] & mask[1:]
        same = np.abs(old[:-1] - rollout[:-1])
        ahead = np.abs(old[:-1] - rollout[1:])
        behind = np.abs(old[1:] - rollout[:-1])
        ok &= np.isfinite(same) & np.isfinite(ahead) & np.isfinite(behind)
        self.add(
            pairs=int(np.count_nonzero(ok)),
            pair_same=float(same[ok].sum(dtype=np.float64)),
            pair_ahead=float(ahead[ok].sum(dtype=np.float64)),
            pair_behind=float(behind[ok].sum(dtype=np.float64)),
        )

    def keys(self) -> list[str]:
        return list(SIGNATURE_KEYS)

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st = self.state
        values: dict[str, MetricValue] = dict.fromkeys(SIGNATURE_KEYS)
        valid = st["valid"]
        if valid > 0:
            values["rcdiag/rollout_zero_fraction"] = st["rollout_zero"] / valid
            values["rcdiag/both_zero_fraction"] = st["both_zero"] / valid
            values["rcdiag/identical_fraction"] = st["identical"] / valid
        if st["pair_same"] > 0:
            values["rcdiag/shifted_ahead_ratio"] = st["pair_ahead"] / st["pair_same"]
            values["rcdiag/shifted_behind_ratio"] = st["pair_behind"] / st["pair_same"]
        n = st["n"]
        if n == 0:
            return values, []
        for name in ("ratio", "reverse"):
            mean = st[name] / n
            values[f"rcdiag/{'capped' if name == 'ratio' else 'reverse'}_ratio_mean"] = 1.0 + mean
            values[f"rcdiag/{'capped' if name == 'ratio' else 'reverse'}_ratio_std_error"] = _cluster_error(
                st[f"{name}_rows"], mean, n
            )
        var_d = st["d2"] / n - (st["d"] / n) ** 2
        var_mid = st["mid2"] / n - (st["mid"] / n) ** 2
        cov = st["d_mid"] / n - (st["d"] / n) * (st["mid"] / n)
        if var_d > 1e-12 * max(st["d2"] / n, 1e-300) and var_mid > 0:
            values["rcdiag/shape_corr"] = max(-1.0, min(1.0, cov / math.sqrt(var_d * var_mid)))
        if st["d2"] > 0:
            values["rcdiag/within_row_share"] = max(st["d2"] - st["row_energy"], 0.0) / st["d2"]
        return values, []


def _row_moments(row_sums: np.ndarray, n: np.ndarray) -> tuple[float, float, float]:
    """Moments of the row means weighted by n_i^2 (``rcdiag.metrics.extras``' standard error of a token mean
    with responses as the units)."""
    weights = n * n
    means = row_sums / n
    total = float(weights.sum())
    mean = float(np.dot(weights, means) / total)
    return total, mean, float(np.dot(weights, (means - mean) ** 2))


def _cluster_error(rows: Moments, mean: float, n: float) -> float:
    """sqrt(sum_i (S_i - mean n_i)^2) / N from the weighted row-mean moments (M2 + W (mu - mean)^2)."""
    spread = rows.m2 + rows.n * (rows.mean - mean) ** 2
    return math.sqrt(max(spread, 0.0)) / n if spread == spread else math.nan
