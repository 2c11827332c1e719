"""The signature statistics' one pass over a block's rows (``rcdiag.metrics.signatures``; its numpy twin,
``signature_arrays`` there, serves a small dump and the tests).

One read of each row as it lies (padding included): the valid tokens' sums, each row's sums of the capped ratio,
the reverse ratio and the log-ratio, and the pairs of neighbouring valid tokens. Totals go into ``totals`` at the
slots ``TOTALS`` names (``rcdiag.kernels.signature_slots``). ``history_pass`` reads a block's token ids too
(only when they were read): which valid tokens repeat an id seen earlier in their row.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.signature_slots import CERTAIN, HISTORY, TOTALS  # noqa: F401 (the slots)


@njit(**JIT)
def signature_pass(
    old, rollout, old_bits, rollout_bits, mask, has_mask, lengths, cap, zero_trainer_max, certain, lowered, far, top1,
    row_ratio, row_reverse, row_d, row_n, row_certain, totals,
):  # fmt: skip
    """Fold a block's raw rows (``lengths`` tokens each; ``mask`` where ``has_mask``) into ``totals`` and the
    per-row sums (``row_*``, one entry per row; ``row_certain``: the ``CERTAIN`` columns); ``cap``: the largest
    ratio counted (e^3); ``certain``: the log-prob from which a side counts as near-certain of a token; ``lowered``:
    how many nats lower the other side must score such a token for it to count as lowered; ``far``: how many nats
    above the other side's log-prob a side's must be for the token to count as far higher there; ``top1``: the
    rollout log-prob from which its token is its most likely one."""
    n = ratio = reverse = dsum = d2 = mid = mid2 = dmid = 0.0
    pairs = same_sum = ahead_sum = behind_sum = 0.0
    valid = zero = both = ident = 0.0
    c_low = rc_low = r_far = r_far_top1 = t_far = 0.0
    start = 0
    for i in range(lengths.shape[0]):
        length = lengths[i]
        r_ratio = r_reverse = r_d = 0.0
        r_n = 0
        c_d = c_n = rc_d = rc_n = 0.0
        prev = False
        prev_o = np.float32(0.0)
        prev_r = np.float32(0.0)
        for k in range(length):
            t = start + k
            if has_mask and not mask[t]:
                prev = False
                continue
            o = old[t]
            r = rollout[t]
            valid += 1.0
            if r == 0.0:
                if o < zero_trainer_max:
                    zero += 1.0
                if o == 0.0:
                    both += 1.0
            if old_bits[t] == rollout_bits[t]:
                ident += 1.0
            if prev:
                same = abs(prev_o - prev_r)
                ahead = abs(prev_o - r)
                behind = abs(o - prev_r)
                if math.isfinite(same) and math.isfinite(ahead) and math.isfinite(behind):
                    pairs += 1.0
                    same_sum += same
                    ahead_sum += ahead
                    behind_sum += behind
            prev = True
            prev_o = o
            prev_r = r
            d = np.float64(o) - np.float64(r)
            if not math.isfinite(d):
                continue
            e = math.exp(d)  # one exp for both ratios (float64: e - 1 keeps |d| >= 1e-16 to its ulp)
            w = min(e, cap) - 1.0
            v = min(1.0 / e, cap) - 1.0
            m = 0.5 * (np.float64(o) + np.float64(r))
            n += 1.0
            ratio += w
            reverse += v
            dsum += d
            d2 += d * d
            mid += m
            mid2 += m * m
            dmid += d * m
            r_ratio += w
            r_reverse += v
            r_d += d
            r_n += 1
            if d < -far:
                r_far += 1.0
                if r >= top1:
                    r_far_top1 += 1.0
            elif d > far:
                t_far += 1.0
            if o >= certain:
                c_d += d
                c_n += 1.0
                if d > lowered:
                    c_low += 1.0
            if r >= certain:
                rc_d -= d
                rc_n += 1.0
                if -d > lowered:
                    rc_low += 1.0
        row_ratio[i] = r_ratio
        row_reverse[i] = r_reverse
        row_d[i] = r_d
        row_n[i] = r_n
        row_certain[i, 0] = c_d
        row_certain[i, 1] = c_n
        row_certain[i, 2] = rc_d
        row_certain[i, 3] = rc_n
        start += length
    totals[0] += n
    totals[1] += ratio
    totals[2] += reverse
    totals[3] += dsum
    totals[4] += d2
    totals[5] += mid
    totals[6] += mid2
    totals[7] += dmid
    totals[8] += pairs
    totals[9] += same_sum
    totals[10] += ahead_sum
    totals[11] += behind_sum
    totals[12] += valid
    totals[13] += zero
    totals[14] += both
    totals[15] += ident
    totals[16] += c_low
    totals[17] += rc_low
    totals[18] += r_far
    totals[19] += r_far_top1
    totals[20] += t_far


@njit(**JIT)
def history_pass(old, rollout, tokens, mask, has_mask, lengths, stamps, row_history):  # fmt: skip
    """Fold a block's raw rows into ``row_history`` (the ``HISTORY`` columns, one row per row): each valid token
    with a finite log-ratio is repeated when its id occurred at an earlier position of its row (masked positions
    count: the engine saw them), else first seen. ``stamps`` (one entry per id below its length, every entry -1 on
    entry) remembers the last row each id occurred in; ids beyond it take no part."""
    limit = stamps.shape[0]
    start = 0
    for i in range(lengths.shape[0]):
        length = lengths[i]
        for k in range(length):
            t = start + k
            token = tokens[t]
            if token < 0 or token >= limit:
                continue
            repeated = stamps[token] == i
            stamps[token] = i
            if has_mask and not mask[t]:
                continue
            o = np.float64(old[t])
            d = o - np.float64(rollout[t])
            if not math.isfinite(d):
                continue
            column = 0 if repeated else 3
            row_history[i, column] += d
            row_history[i, column + 1] += o
            row_history[i, column + 2] += 1.0
        start += length
