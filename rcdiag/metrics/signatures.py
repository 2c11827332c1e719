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
* ``certain_drop`` (and ``_std_error``, responses as the units): the mean of d over the tokens the trainer gives
  p >= 0.99: how much probability the rollout takes off tokens the trainer is near-certain of. A temperature leaves
  them near-certain (at most 0.05 nats at T = 1.5 on the tests' real model); soft-capping compresses exactly the
  large logits that make them certain (0.4-2.9 nats). ``rollout_certain_drop``: the mean of -d over the tokens the
  rollout gives p >= 0.99 (the trainer soft-capped). ``certain_share`` and ``rollout_certain_share``: the share of
  the tokens each mean is over; ``certain_lowered_share`` and ``rollout_certain_lowered_share``: the share of those
  the other side scores more than 0.1 nats lower (at least 0.999 for soft-capping; at most 0.05 for a temperature up
  to 1.5, a penalty and every clean engine on the tests' real model; 0.27 where one engine gives only the stop token
  probability 1), so a drop confined to a few tokens is not read as one on near-certain tokens at large.
* ``rollout_far_higher_share``: the share of the tokens the rollout scores more than 2 nats above the trainer
  (d < -2: more than e^2 = 7.4 times its probability); ``rollout_far_higher_top1_share``: the share of those the
  rollout gives p >= 1/2 (so its most likely token); ``trainer_far_higher_share``: the mirror share (d > 2). A
  rollout that reports the most likely token's log-prob instead of the sampled token's scores every token that is
  not the argmax at the argmax's probability: 12% of the tokens past -2 on the tests' real model, a quarter of them
  at p >= 1/2, and none past +2. Renormalisation over a top-k/top-p set raises a kept token by at most 1/kept mass
  (never 2 nats on the tests' model), precision noise moves few tokens that far (at most 0.5%: a 4-bit rollout),
  and a flatter rollout (a temperature above 1, soft-capping) raises the unlikely tokens it samples, never to
  p >= 1/2.
* ``repeat_drop`` (and ``_std_error``), only where the token ids were read: over the valid tokens whose id occurred
  earlier in the response (masked positions included), the mean of d minus that of the tokens seen for the first
  time, each first corrected by the dump's linear fit of d on the trainer's log-prob (so a temperature's shape, which
  moves tokens by how likely they are, does not count): a repetition, presence or frequency penalty on the rollout
  lowers exactly the repeated tokens (0.25 nats at a penalty of 1.3; within 0.021 of 0 on every other planted cause).
  ``repeat_share``: the share of those tokens that are repeated.
* ``rollout_zero_fraction``: valid tokens the rollout scores exactly 0.0 (probability 1) where the trainer gives
  p < e^-0.1: tokens it never sampled (prompt tokens or padding inside the mask). ``both_zero_fraction``: valid
  tokens exactly 0.0 on both sides (padding read as valid: an inverted mask). ``identical_fraction``: valid tokens
  whose two float32 values are bit-identical.

Statistics are over the valid tokens whose log-ratio is a number (a token -inf on both sides has none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rcdiag.catalogue.keys import Key
from rcdiag.kernels.signature_slots import CERTAIN, HISTORY, ID_LIMIT, TOTALS
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash, cluster_std_error
from rcdiag.metrics.block import Block

RATIO_CAP_LOG = 3.0
"""Each token's ratio is capped at e^3 (as ``--explain``'s offset statistic), so a few outliers cannot move it."""
ZERO_TRAINER_MAX = -0.1
"""A rollout log-prob of exactly 0.0 counts as a token it never sampled where the trainer's is below this."""
CERTAIN_LOG = math.log(0.99)
"""A side is near-certain of a token from this log-prob (p >= 0.99)."""
LOWERED_NATS = 0.1
"""A near-certain token counts as lowered where the other side scores it more than this lower (10% of its
probability)."""
FAR_NATS = 2.0
"""A token counts as far higher on one side where that side's log-prob exceeds the other's by more than this (e^2:
7.4 times the probability)."""
TOP1_LOG = math.log(0.5)
"""A token the rollout gives at least this log-prob (p >= 1/2) is its most likely one."""

SIGNATURE_KEYS = (
    Key.CAPPED_RATIO_MEAN,
    Key.CAPPED_RATIO_STD_ERROR,
    Key.REVERSE_RATIO_MEAN,
    Key.REVERSE_RATIO_STD_ERROR,
    Key.SHAPE_CORR,
    Key.WITHIN_ROW_SHARE,
    Key.SHIFTED_AHEAD_RATIO,
    Key.SHIFTED_BEHIND_RATIO,
    Key.ROLLOUT_ZERO_FRACTION,
    Key.BOTH_ZERO_FRACTION,
    Key.IDENTICAL_FRACTION,
    Key.CERTAIN_DROP,
    Key.CERTAIN_DROP_STD_ERROR,
    Key.CERTAIN_SHARE,
    Key.CERTAIN_LOWERED_SHARE,
    Key.ROLLOUT_CERTAIN_DROP,
    Key.ROLLOUT_CERTAIN_DROP_STD_ERROR,
    Key.ROLLOUT_CERTAIN_SHARE,
    Key.ROLLOUT_CERTAIN_LOWERED_SHARE,
    Key.ROLLOUT_FAR_HIGHER_SHARE,
    Key.ROLLOUT_FAR_HIGHER_TOP1_SHARE,
    Key.TRAINER_FAR_HIGHER_SHARE,
    Key.REPEAT_DROP,
    Key.REPEAT_DROP_STD_ERROR,
    Key.REPEAT_SHARE,
)
HISTORY_KEYS = SIGNATURE_KEYS[-3:]
"""The statistics that need the token ids (the history test)."""
RATIO_KEYS = {
    "ratio": (Key.CAPPED_RATIO_MEAN, Key.CAPPED_RATIO_STD_ERROR),
    "reverse": (Key.REVERSE_RATIO_MEAN, Key.REVERSE_RATIO_STD_ERROR),
}
"""Each capped-ratio state's mean and standard error."""
FAR_KEYS = {"rollout_far_higher": Key.ROLLOUT_FAR_HIGHER_SHARE, "trainer_far_higher": Key.TRAINER_FAR_HIGHER_SHARE}
"""Each far-higher count's share."""
CERTAIN_KEYS = {
    "certain": (Key.CERTAIN_DROP, Key.CERTAIN_DROP_STD_ERROR, Key.CERTAIN_SHARE, Key.CERTAIN_LOWERED_SHARE),
    "rollout_certain": (
        Key.ROLLOUT_CERTAIN_DROP,
        Key.ROLLOUT_CERTAIN_DROP_STD_ERROR,
        Key.ROLLOUT_CERTAIN_SHARE,
        Key.ROLLOUT_CERTAIN_LOWERED_SHARE,
    ),
}
"""Each near-certain side's drop, its standard error, its share and its lowered share."""


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
        "certain": "sum",
        "certain_n": "sum",
        "certain_rows": "moments",
        "certain_lowered": "sum",
        "rollout_certain": "sum",
        "rollout_certain_n": "sum",
        "rollout_certain_rows": "moments",
        "rollout_certain_lowered": "sum",
        "rollout_far_higher": "sum",
        "rollout_far_higher_top1": "sum",
        "trainer_far_higher": "sum",
        "history": "sums",
        "history_cross": "sums",
    }
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {"history": (len(HISTORY),), "history_cross": (len(HISTORY),) * 2}
    """``history``: the ``HISTORY`` sums over the dump; ``history_cross``: the sum over responses of the outer
    product of each response's ``HISTORY`` sums (what ``repeat_drop``'s standard error needs)."""
    COUNTED: ClassVar[frozenset[str]] = Accumulator.COUNTED | frozenset(
        {"n", "pairs", "valid", "rollout_zero", "both_zero", "identical", "d2", "mid2", "row_energy"}
        | {"certain_n", "rollout_certain_n", "certain_lowered", "rollout_certain_lowered"}
        | {"rollout_far_higher", "rollout_far_higher_top1", "trainer_far_higher"}
    )

    def update(self, block: Block) -> None:
        self.fold(block.once(signature_sums))
        if block.tokens is not None:
            old, rollout, mask, lengths = contiguous(block)
            history = history_kernel if block.b.compiled else history_arrays
            rows = history(old, rollout, block.tokens, mask, lengths)
            self.add(history=rows.sum(axis=0), history_cross=rows.T @ rows)

    def fold(self, sums: SignatureSums) -> None:
        """Fold one block's sums into the state."""
        t = dict(zip(TOTALS, sums.totals.tolist(), strict=True))
        kept = sums.row_n > 0
        n = sums.row_n[kept].astype(np.float64)
        self.add(
            valid=t["valid"],
            rollout_zero=t["rollout_zero"],
            both_zero=t["both_zero"],
            identical=t["identical"],
            pairs=t["pairs"],
            pair_same=t["pair_same"],
            pair_ahead=t["pair_ahead"],
            pair_behind=t["pair_behind"],
            certain_lowered=t["certain_lowered"],
            rollout_certain_lowered=t["rollout_certain_lowered"],
            rollout_far_higher=t["rollout_far_higher"],
            rollout_far_higher_top1=t["rollout_far_higher_top1"],
            trainer_far_higher=t["trainer_far_higher"],
        )
        if not n.size:
            return
        row_d = sums.row_d[kept]
        c = dict(zip(CERTAIN, sums.row_certain.T, strict=True))
        self._fold_certain("certain", c["certain_d"], c["certain_n"])
        self._fold_certain("rollout_certain", c["rollout_certain_d"], c["rollout_certain_n"])
        self.add(
            n=t["n"],
            ratio=t["ratio"],
            ratio_rows=_row_moments(sums.row_ratio[kept], n),
            reverse=t["reverse"],
            reverse_rows=_row_moments(sums.row_reverse[kept], n),
            d=t["d"],
            d2=t["d2"],
            mid=t["mid"],
            mid2=t["mid2"],
            d_mid=t["d_mid"],
            row_energy=float(np.dot(row_d, row_d / n)),
        )

    def _fold_certain(self, name: str, row_sums: np.ndarray, row_counts: np.ndarray) -> None:
        held = row_counts > 0
        if held.any():
            moments = _row_moments(row_sums[held], row_counts[held])
            self.add(**{name: float(row_sums.sum()), f"{name}_n": float(row_counts.sum()), f"{name}_rows": moments})

    def keys(self) -> list[str]:
        return list(SIGNATURE_KEYS)

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st = self.state
        values: dict[str, MetricValue] = dict.fromkeys(SIGNATURE_KEYS)
        valid = st["valid"]
        if valid > 0:
            values[Key.ROLLOUT_ZERO_FRACTION] = st["rollout_zero"] / valid
            values[Key.BOTH_ZERO_FRACTION] = st["both_zero"] / valid
            values[Key.IDENTICAL_FRACTION] = st["identical"] / valid
        if st["pair_same"] > 0:
            values[Key.SHIFTED_AHEAD_RATIO] = st["pair_ahead"] / st["pair_same"]
            values[Key.SHIFTED_BEHIND_RATIO] = st["pair_behind"] / st["pair_same"]
        n = st["n"]
        if n == 0:
            return values, []
        for name, (mean_key, error_key) in RATIO_KEYS.items():
            mean = st[name] / n
            values[mean_key] = 1.0 + mean
            values[error_key] = cluster_std_error(st[f"{name}_rows"], mean, n)
        var_d = st["d2"] / n - (st["d"] / n) ** 2
        var_mid = st["mid2"] / n - (st["mid"] / n) ** 2
        cov = st["d_mid"] / n - (st["d"] / n) * (st["mid"] / n)
        if var_d > 1e-12 * max(st["d2"] / n, 1e-300) and var_mid > 0:
            values[Key.SHAPE_CORR] = max(-1.0, min(1.0, cov / math.sqrt(var_d * var_mid)))
        for name, key in FAR_KEYS.items():
            values[key] = st[name] / n
        if st["rollout_far_higher"] > 0:
            values[Key.ROLLOUT_FAR_HIGHER_TOP1_SHARE] = st["rollout_far_higher_top1"] / st["rollout_far_higher"]
        if st["d2"] > 0:
            values[Key.WITHIN_ROW_SHARE] = max(st["d2"] - st["row_energy"], 0.0) / st["d2"]
        for name, (drop, error, share, lowered) in CERTAIN_KEYS.items():
            count = st[f"{name}_n"]
            if count > 0:
                mean = st[name] / count
                values[drop] = mean
                values[error] = cluster_std_error(st[f"{name}_rows"], mean, count)
                values[share] = count / n
                values[lowered] = st[f"{name}_lowered"] / count
        values.update(self._repeat_drop())
        return values, []

    def _repeat_drop(self) -> dict[str, MetricValue]:
        """``repeat_drop``, its standard error (the delta method over responses, the fit's slope taken as known)
        and ``repeat_share``; nothing where no token ids were read or a group is empty."""
        st = self.state
        h = dict(zip(HISTORY, st["history"].tolist(), strict=True))
        n = st["n"]
        if h["repeat_n"] == 0 or h["first_n"] == 0 or n == 0:
            return {}
        # the slope of d on the trainer's log-prob o = mid + d / 2, from the sums of d and mid
        s_o = st["mid"] + st["d"] / 2
        s_do = st["d_mid"] + st["d2"] / 2
        s_oo = st["mid2"] + st["d_mid"] + st["d2"] / 4
        var_o = s_oo / n - (s_o / n) ** 2
        slope = (s_do / n - (st["d"] / n) * (s_o / n)) / var_o if var_o > 0 else 0.0
        repeat = (h["repeat_d"] - slope * h["repeat_old"]) / h["repeat_n"]
        first = (h["first_d"] - slope * h["first_old"]) / h["first_n"]
        nr, nf = h["repeat_n"], h["first_n"]
        weights = np.array([1 / nr, -slope / nr, -repeat / nr, -1 / nf, slope / nf, first / nf])
        variance = float(weights @ st["history_cross"] @ weights)
        return {
            Key.REPEAT_DROP: repeat - first,
            Key.REPEAT_DROP_STD_ERROR: math.sqrt(max(variance, 0.0)),
            Key.REPEAT_SHARE: nr / (nr + nf),
        }


def contiguous(block: Block) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """The block's raw rows as the compiled passes take them: float32 log-probs and int64 lengths, contiguous."""
    old, rollout, mask, lengths = block.raw
    return (
        np.ascontiguousarray(old, dtype=np.float32),
        np.ascontiguousarray(rollout, dtype=np.float32),
        mask,
        np.ascontiguousarray(lengths, dtype=np.int64),
    )


def signature_sums(block: Block) -> SignatureSums:
    """The block's signature sums (once per block: ``rcdiag.sections.slices`` reads its per-row sums too)."""
    old, rollout, mask, lengths = contiguous(block)
    if block.b.compiled:
        return signature_kernel(old, rollout, mask, lengths)
    return signature_arrays(old, rollout, mask, lengths)


def _row_moments(row_sums: np.ndarray, n: np.ndarray) -> tuple[float, float, float]:
    """Moments of the row means weighted by n_i^2 (``rcdiag.metrics.extras``' standard error of a token mean
    with responses as the units)."""
    weights = n * n
    means = row_sums / n
    total = float(weights.sum())
    mean = float(np.dot(weights, means) / total)
    return total, mean, float(np.dot(weights, (means - mean) ** 2))


@dataclass(frozen=True)
class SignatureSums:
    """One block's sums: ``totals`` at the slots ``rcdiag.kernels.signatures.TOTALS`` names, and per row the sums
    of the capped ratio - 1, the reverse ratio - 1, the log-ratio, the count of finite log-ratios and the
    ``CERTAIN`` columns."""

    totals: np.ndarray
    row_ratio: np.ndarray
    row_reverse: np.ndarray
    row_d: np.ndarray
    row_n: np.ndarray
    row_certain: np.ndarray


def signature_kernel(
    old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray
) -> SignatureSums:
    """The block's sums by the compiled pass (``rcdiag.kernels.signatures``)."""
    from rcdiag.kernels.signatures import signature_pass

    rows = lengths.shape[0]
    out = SignatureSums(
        np.zeros(len(TOTALS)), np.empty(rows), np.empty(rows), np.empty(rows), np.empty(rows, np.int64),
        np.empty((rows, len(CERTAIN))),
    )  # fmt: skip
    signature_pass(
        old, rollout, old.view(np.int32), rollout.view(np.int32), _flags(mask), mask is not None, lengths,
        math.exp(RATIO_CAP_LOG), ZERO_TRAINER_MAX, CERTAIN_LOG, LOWERED_NATS, FAR_NATS, TOP1_LOG,
        out.row_ratio, out.row_reverse, out.row_d, out.row_n, out.row_certain, out.totals,
    )  # fmt: skip
    return out


def _flags(mask: np.ndarray | None) -> np.ndarray:
    return np.zeros(0, dtype=np.bool_) if mask is None else np.ascontiguousarray(mask, dtype=np.bool_)


def history_kernel(
    old: np.ndarray, rollout: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray
) -> np.ndarray:
    """Each row's ``HISTORY`` sums by the compiled pass (``rcdiag.kernels.signatures.history_pass``)."""
    from rcdiag.kernels.arrays import id_array
    from rcdiag.kernels.signatures import history_pass

    ids = id_array(tokens)
    out = np.zeros((lengths.shape[0], len(HISTORY)))
    stamps = np.full(_id_span(ids), -1, dtype=np.int64)
    history_pass(old, rollout, ids, _flags(mask), mask is not None, lengths, stamps, out)
    return out


def _id_span(ids: np.ndarray) -> int:
    """How many ids the history test tracks: those below the block's largest (and below ``ID_LIMIT``)."""
    return min(max(int(ids.max()) + 1, 0), ID_LIMIT) if ids.size else 0


def history_arrays(
    old: np.ndarray, rollout: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray
) -> np.ndarray:
    """The same sums with numpy's array operations (a small dump's path): a position repeats an id when an earlier
    position of its row holds the same id."""
    rows = lengths.shape[0]
    row = np.repeat(np.arange(rows), lengths)
    ids = np.asarray(tokens, dtype=np.int64)
    tracked = (ids >= 0) & (ids < ID_LIMIT)
    order = np.lexsort((np.arange(ids.shape[0]), ids, row))
    order = order[tracked[order]]
    repeated = np.zeros(ids.shape[0], dtype=bool)
    same = (row[order][1:] == row[order][:-1]) & (ids[order][1:] == ids[order][:-1])
    repeated[order[1:]] = same
    keep = tracked if mask is None else tracked & np.asarray(mask, dtype=bool)
    o = old.astype(np.float64)
    d = o - rollout.astype(np.float64)
    keep &= np.isfinite(d)
    out = np.zeros((rows, len(HISTORY)))
    for column, group in ((0, keep & repeated), (3, keep & ~repeated)):
        out[:, column] = np.bincount(row[group], weights=d[group], minlength=rows)
        out[:, column + 1] = np.bincount(row[group], weights=o[group], minlength=rows)
        out[:, column + 2] = np.bincount(row[group], minlength=rows)
    return out


def signature_arrays(
    old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray
) -> SignatureSums:
    """The same sums with numpy's array operations (a small dump's path, which never imports numba)."""
    rows = lengths.shape[0]
    row = np.repeat(np.arange(rows), lengths)
    valid = np.ones(old.shape[0], dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    o32, r32, rw = old[valid], rollout[valid], row[valid]
    zero = r32 == 0.0
    pair = (row[1:] == row[:-1]) & valid[1:] & valid[:-1]
    same = np.abs(old[:-1] - rollout[:-1])
    ahead = np.abs(old[:-1] - rollout[1:])
    behind = np.abs(old[1:] - rollout[:-1])
    pair &= np.isfinite(same) & np.isfinite(ahead) & np.isfinite(behind)
    d = o32.astype(np.float64) - r32.astype(np.float64)
    finite = np.isfinite(d)
    d, rw = d[finite], rw[finite]
    mid = 0.5 * (o32.astype(np.float64) + r32.astype(np.float64))[finite]
    ratio = np.expm1(np.minimum(d, RATIO_CAP_LOG))
    reverse = np.expm1(np.minimum(-d, RATIO_CAP_LOG))
    r64 = r32[finite].astype(np.float64)
    trainer_certain = o32[finite].astype(np.float64) >= CERTAIN_LOG
    rollout_certain = r64 >= CERTAIN_LOG
    rollout_far = d < -FAR_NATS
    totals = {
        "n": float(d.shape[0]),
        "ratio": float(ratio.sum()),
        "reverse": float(reverse.sum()),
        "d": float(d.sum()),
        "d2": float(np.dot(d, d)),
        "mid": float(mid.sum()),
        "mid2": float(np.dot(mid, mid)),
        "d_mid": float(np.dot(d, mid)),
        "pairs": float(np.count_nonzero(pair)),
        "pair_same": float(same[pair].sum(dtype=np.float64)),
        "pair_ahead": float(ahead[pair].sum(dtype=np.float64)),
        "pair_behind": float(behind[pair].sum(dtype=np.float64)),
        "valid": float(o32.shape[0]),
        "rollout_zero": float(np.count_nonzero(zero & (o32 < ZERO_TRAINER_MAX))),
        "both_zero": float(np.count_nonzero(zero & (o32 == 0.0))),
        "identical": float(np.count_nonzero(o32.view(np.int32) == r32.view(np.int32))),
        "certain_lowered": float(np.count_nonzero(d[trainer_certain] > LOWERED_NATS)),
        "rollout_certain_lowered": float(np.count_nonzero(-d[rollout_certain] > LOWERED_NATS)),
        "rollout_far_higher": float(np.count_nonzero(rollout_far)),
        "rollout_far_higher_top1": float(np.count_nonzero(rollout_far & (r64 >= TOP1_LOG))),
        "trainer_far_higher": float(np.count_nonzero(d > FAR_NATS)),
    }
    return SignatureSums(
        np.array([totals[name] for name in TOTALS]),
        np.bincount(rw, weights=ratio, minlength=rows),
        np.bincount(rw, weights=reverse, minlength=rows),
        np.bincount(rw, weights=d, minlength=rows),
        np.bincount(rw, minlength=rows).astype(np.int64),
        np.stack(
            [
                np.bincount(rw[trainer_certain], weights=d[trainer_certain], minlength=rows),
                np.bincount(rw[trainer_certain], minlength=rows).astype(np.float64),
                np.bincount(rw[rollout_certain], weights=-d[rollout_certain], minlength=rows),
                np.bincount(rw[rollout_certain], minlength=rows).astype(np.float64),
            ],
            axis=1,
        ),
    )
