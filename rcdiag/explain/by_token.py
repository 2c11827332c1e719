"""Which tokens carry the mismatch: exact per-id sums over the dump's token ids (``--explain`` with ids read).

For every token id, six float64 sums over its valid tokens (``SUMS``): the count, the log-ratio d = old - rollout,
|d|, verl's k3 and chi2 terms (taken by the breakdowns' own per-token function, so the same bits) and d^2 (for the
noise test). Ids below ``DENSE_IDS`` sit in a dense table that grows to the largest id seen (added to by the
explain pass itself, ``rcdiag.kernels.explain``, or on its own by ``rcdiag.kernels.token_ids``; on a small dump their
numpy forms, ``rcdiag.kernels.small_explain``); larger ids (a hostile dump, or a vocabulary beyond any real one) in a
sorted sparse table. Sums merge by addition, so chunking, row order, ``--workers``, Ray and merged shard states change
nothing beyond float64 rounding.

Ranking. ``MIN_COUNT`` tokens at least, and a test so that a rare id is not ranked on noise: an id's mean |d|
against the mean |d| of every other token, z = (a_id - a_rest) / sqrt(s_id^2 / n_id + s_rest^2 / n_rest) (each
side's own variance, so one outlier token inflates its id's spread as much as its mean), significant when z
exceeds the one-sided normal quantile of ``ALPHA`` Bonferroni-divided by the ids tested. Tokens of one response are
correlated, so the test is approximate; the detector (``token_detector``) also needs a large effect.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, ClassVar

import numpy as np

from rcdiag.core.limits import finite
from rcdiag.metrics.base import Accumulator, Reduce
from rcdiag.metrics.block import Block
from rcdiag.records.report import TokenBreakdown, TokenRow

SUMS = ("tokens", "lr", "abs_lr", "k3", "chi2", "lr_sq")
"""Per-id sums: valid tokens, log-ratio, |log-ratio|, k3 and chi2 terms, log-ratio squared."""
DENSE_IDS = 1 << 21
"""Ids below this are kept in a dense table (at most 2M ids x 6 sums x 8 bytes = 96 MiB); larger ones sparsely."""
MIN_COUNT = 20
"""An id is ranked only with at least this many valid tokens."""
ALPHA = 0.01
"""Family-wise false-positive rate of the significance test over the ids tested (Bonferroni)."""
TOP = 20
"""Entries in each ranked list."""


_NO_MASK = np.zeros(0, dtype=np.uint8)
NO_TOKENS = np.zeros(0, dtype=np.int64)
"""The explain pass's ids argument when a block has none."""


class TokenSums(Accumulator):
    """Per-id sums (a ``table`` state: dense for small ids, sparse for the rest); merged by addition."""

    STATES: ClassVar[dict[str, Reduce]] = {"seen": "max", "table": "table"}
    OWNER: ClassVar[str | None] = "explain"
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {"table": (len(SUMS),)}
    DENSE_IDS: ClassVar[int] = DENSE_IDS

    def __init__(self) -> None:
        super().__init__()
        self.stats: TokenStats | None = None
        """``token_stats`` of the table as it is now (the report asks several times; any change drops it)."""

    @property
    def seen(self) -> bool:
        """Whether any block had token ids (a dump without them has an empty table and no ``token`` breakdown)."""
        return bool(self.state["seen"] > 0)

    @seen.setter
    def seen(self, value: bool) -> None:
        self.state["seen"] = 1.0 if value else -math.inf

    @property
    def dense(self) -> np.ndarray:
        return self.state["table"].dense

    @property
    def sparse_ids(self) -> np.ndarray:
        return self.state["table"].sparse_ids

    @property
    def sparse(self) -> np.ndarray:
        return self.state["table"].sparse

    def update(self, block: Block) -> None:
        """Fold in a block whose rows carry their raw token ids (``block.rows.tokens``; none: nothing to add)."""
        rows = block.rows
        if rows is not None and rows.tokens is not None:
            self.fold(block, rows.tokens, rows.mask)

    def fold(self, block: Block, tokens: np.ndarray, mask: np.ndarray | None) -> None:
        """Fold in a (numpy) block whose rows' raw token ids are ``tokens`` (padding included, as ``mask``), on its
        own (the explain pass adds them itself: ``pass_table`` and ``add_left``)."""
        from rcdiag.kernels.arrays import id_array

        scatter_token_sums = _scatter(block)
        tokens = id_array(tokens)
        table = self.pass_table()
        old, rollout, _, _ = block.raw  # the raw rows: the pass skips the padding itself
        old = np.ascontiguousarray(old, dtype=np.float32)
        rollout = np.ascontiguousarray(rollout, dtype=np.float32)
        flags = _NO_MASK if mask is None else np.ascontiguousarray(mask).view(np.uint8)
        if scatter_token_sums(old, rollout, tokens, flags, table):
            self.add_left(block, tokens, mask, table.shape[0])

    def pass_table(self) -> np.ndarray:
        """The dense table, for a pass adding a block's valid tokens to it (ids beyond it are left for
        ``add_left``)."""
        self.seen = True
        self.stats = None
        return self.dense

    def add_left(self, block: Block, tokens: np.ndarray, mask: np.ndarray | None, rows: int) -> None:
        """Add a block's valid tokens whose ids are ``rows`` or more, left by a pass over a dense table of ``rows``
        ids: the table grows to hold those below ``DENSE_IDS``, the rest go to the sparse table. An id's tokens
        are all added by the pass or all here, in order, so the sums are those of one pass over a table large
        enough (growing first would cost every block a pass over its ids for their range)."""
        scatter_token_sums = _scatter(block)
        old, rollout, _, _ = block.raw
        valid = slice(None) if mask is None else mask
        ids = tokens[valid]
        left = ids >= rows
        ids = ids[left]
        old = np.ascontiguousarray(old[valid][left], dtype=np.float32)
        rollout = np.ascontiguousarray(rollout[valid][left], dtype=np.float32)
        dense = ids[ids < DENSE_IDS]
        if dense.size and int(dense.max()) >= self.dense.shape[0]:
            self._grow(int(dense.max()) + 1)
        if scatter_token_sums(old, rollout, ids, _NO_MASK, self.dense):  # ids beyond the dense table: sparse
            big = ids >= self.dense.shape[0]
            unique, local = np.unique(ids[big], return_inverse=True)
            sums = np.zeros((unique.shape[0], len(SUMS)))
            scatter_token_sums(old[big], rollout[big], local.astype(np.int64), _NO_MASK, sums)
            self._merge_sparse(unique.astype(np.int64), sums)

    def _grow(self, size: int) -> None:
        self.state["table"].grow(size)

    def _merge_sparse(self, ids: np.ndarray, sums: np.ndarray) -> None:
        self.state["table"].add_sparse(ids, sums)

    def merge(self, other: TokenSums) -> TokenSums:
        self.stats = None
        return super().merge(other)

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, sums)`` of every id with a token, ids ascending."""
        return self.state["table"].rows()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = None
        super().load_state_dict(state)

    def compute(self) -> tuple[dict[str, Any], list]:
        """The table's statistics are read by ``token_breakdown`` and the detector (``token_stats``)."""
        return {}, []


def _scatter(block: Block) -> Callable[..., int]:
    """The stand-alone by-token pass of the block's path: the kernel (``rcdiag.kernels.token_ids``), or its numpy form
    on a small dump's numpy path (``rcdiag.kernels.small_explain``, which imports no numba)."""
    if block.b.compiled:
        from rcdiag.kernels import token_ids

        return token_ids.scatter_token_sums
    from rcdiag.kernels import small_explain

    return small_explain.scatter_token_sums


@dataclass(frozen=True)
class TokenStats:
    """Per-id statistics of the whole table (arrays aligned with ``ids``), for the breakdown and the detector."""

    ids: np.ndarray
    sums: np.ndarray
    total: np.ndarray
    """Column sums over every id."""
    z: np.ndarray
    """The significance statistic of each id's mean |log-ratio| (NaN below ``MIN_COUNT`` tokens)."""
    z_critical: float
    tested: int

    @property
    def significant(self) -> np.ndarray:
        return np.nan_to_num(self.z, nan=-np.inf) > self.z_critical

    @property
    def k3_share(self) -> np.ndarray:
        total = self.total[3]
        if not (math.isfinite(total) and total > 0):
            return np.full(self.ids.shape[0], np.nan)
        return self.sums[:, 3] / total

    @property
    def token_share(self) -> np.ndarray:
        return self.sums[:, 0] / max(self.total[0], 1.0)

    def k3_order(self) -> np.ndarray:
        """Indices of ids with ``MIN_COUNT`` tokens, largest share of k3 first (ties: the smaller id)."""
        counted = np.flatnonzero(self.sums[:, 0] >= MIN_COUNT)
        share = np.nan_to_num(self.sums[counted, 3], nan=np.inf)
        return counted[np.lexsort((self.ids[counted], -share))]

    def abs_order(self) -> np.ndarray:
        """Indices of significant ids, largest mean |log-ratio| first."""
        chosen = np.flatnonzero(self.significant)
        mean = self.sums[chosen, 2] / self.sums[chosen, 0]
        return chosen[np.lexsort((self.ids[chosen], -mean))]


def token_stats(sums: TokenSums) -> TokenStats:
    """The table with its significance test (computed once per state of the table)."""
    if sums.stats is None:
        sums.stats = _token_stats(sums)
    return sums.stats


def _token_stats(sums: TokenSums) -> TokenStats:
    ids, table = sums.table()
    total = table.sum(axis=0) if ids.size else np.zeros(len(SUMS))
    n, abs_lr, lr_sq = table[:, 0], table[:, 2], table[:, 5]
    tested = n >= MIN_COUNT
    rest_n = total[0] - n
    with np.errstate(all="ignore"):
        mean = abs_lr / n
        var = np.maximum(lr_sq / n - mean**2, 0.0) * n / np.maximum(n - 1, 1)
        rest_mean = (total[2] - abs_lr) / rest_n
        rest_var = np.maximum((total[5] - lr_sq) / rest_n - rest_mean**2, 0.0) * rest_n / np.maximum(rest_n - 1, 1)
        spread = np.sqrt(var / n + rest_var / rest_n)
        z = np.where(spread > 0, (mean - rest_mean) / spread, np.where(mean > rest_mean, np.inf, 0.0))
    z = np.where(tested & (rest_n >= MIN_COUNT), z, np.nan)
    count = int(np.count_nonzero(~np.isnan(z)))
    critical = NormalDist().inv_cdf(1.0 - ALPHA / max(count, 1))
    return TokenStats(ids, table, total, z, critical, count)


def token_breakdown(sums: TokenSums, texts: dict[int, str] | None = None) -> TokenBreakdown:
    """The report's by-token table: its size and the two ranked lists (JSON ``breakdowns.token``, docs/explain.md)."""
    from rcdiag.explain.breakdowns import bucket_metrics

    stats = token_stats(sums)
    shares, token_shares = stats.k3_share, stats.token_share

    def entry(i: int) -> TokenRow:
        tokens, lr, abs_lr, k3, chi2, _ = (float(v) for v in stats.sums[i])
        metrics = bucket_metrics(np.array([tokens, lr, abs_lr, k3, chi2]))
        token_id = int(stats.ids[i])
        return TokenRow(
            id=token_id,
            text=None if texts is None else texts.get(token_id),
            tokens=int(tokens),
            token_share=float(token_shares[i]),
            k3_share=finite(float(shares[i])),
            **metrics,
            z=finite(float(stats.z[i])),
            significant=bool(stats.significant[i]),
        )

    return TokenBreakdown(
        ids=int(stats.ids.shape[0]),
        tokens=int(stats.total[0]),
        min_count=MIN_COUNT,
        ids_tested=stats.tested,
        z_critical=stats.z_critical,
        by_k3_share=tuple(entry(int(i)) for i in stats.k3_order()[:TOP]),
        by_abs_log_ratio=tuple(entry(int(i)) for i in stats.abs_order()[:TOP]),
    )


def ranked_ids(sums: TokenSums) -> list[int]:
    """The ids either list shows (for decoding their text)."""
    stats = token_stats(sums)
    chosen = [*stats.k3_order()[:TOP].tolist(), *stats.abs_order()[:TOP].tolist()]
    return sorted({int(stats.ids[i]) for i in chosen})
