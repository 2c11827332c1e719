"""verl's sequence balancing, reimplemented step for step (``verl/utils/seqlen_balancing.py`` and the trainer's
``_balance_batch``, identical in v0.7.1 to v0.9.0): which rows land on which data-parallel rank and in which
micro-batch decides whether a micro-batch ends up without a valid token.

The partition is the Karmarkar-Karp largest differencing method with verl's exact tie-breaking (its heap order,
its set order, its final sort), so the split is the one verl made, not merely a balanced one; tests check it
against verl's own functions. Workloads are verl's attention-cost proxy ``24576 L + L^2``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


class SplitRefusedError(Exception):
    """verl refuses this split (an assertion in its code): the message is verl's condition."""


def workload(seqlens: np.ndarray) -> list[int]:
    """verl's ``calculate_workload``: ``24576 * L + L**2`` per sequence, in int64."""
    lengths = np.asarray(seqlens, dtype=np.int64)
    return (24576 * lengths + lengths * lengths).tolist()


class _Set:
    """One part of a partial partition: its items (index, value) and their sum."""

    __slots__ = ("items", "sum")

    def __init__(self) -> None:
        self.sum = 0
        self.items: list[tuple[int, int]] = []

    def add(self, idx: int, val: int) -> None:
        self.items.append((idx, val))
        self.sum += val

    def merge(self, other: _Set) -> None:
        for idx, val in other.items:
            self.add(idx, val)

    def key(self) -> tuple:
        return (self.sum, len(self.items), self.items)

    def __lt__(self, other: _Set) -> bool:
        return self.key() < other.key()


class _State:
    """A partial k-way partition; the heap pops the one with the largest spread first."""

    __slots__ = ("k", "sets")

    def __init__(self, items: list[tuple[int, int]], k: int) -> None:
        self.k = k
        self.sets = [_Set() for _ in range(k)]
        for part, (idx, val) in zip(self.sets, items, strict=False):
            part.add(idx, val)
        self.sets.sort(reverse=True)

    def merge(self, other: _State) -> None:
        for i in range(self.k):
            self.sets[i].merge(other.sets[self.k - 1 - i])
        self.sets.sort(reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0].key() > other.sets[0].key()


def karmarkar_karp(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """Indices of ``values`` in ``k`` parts of balanced sums (equal counts with ``equal_size``), in verl's order."""
    ordered = sorted((value, idx) for idx, value in enumerate(values))
    heap: list[_State] = []
    if equal_size:
        if len(ordered) % k:
            raise SplitRefusedError(f"{len(ordered)} % {k} != 0")
        for offset in range(0, len(ordered), k):
            heapq.heappush(heap, _State([(idx, value) for value, idx in ordered[offset : offset + k]], k))
    else:
        for value, idx in ordered:
            heapq.heappush(heap, _State([(idx, value)], k))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [[idx for idx, _ in part.items] for part in heap[0].sets]


def balanced_partitions(values: Sequence[int], k: int, equal_size: bool) -> list[list[int]]:
    """verl's ``get_seqlen_balanced_partitions``: the parts, each sorted; no part may be empty."""
    if len(values) < k:
        raise SplitRefusedError(f"number of items:[{len(values)}] < k_partitions:[{k}]")
    parts = [sorted(part) for part in karmarkar_karp(values, k, equal_size)]
    if any(not part for part in parts):
        raise SplitRefusedError(f"the {next(i for i, p in enumerate(parts) if not p)}-th partition is empty")
    return parts


def balance_batch_order(seqlens: np.ndarray, dp_size: int) -> list[int]:
    """The row order after verl's ``trainer.balance_batch`` (then cut into ``dp_size`` contiguous chunks): equal-size
    parts of balanced workload, each sorted by (workload, index) and laid out small-large-small."""
    loads = workload(seqlens)
    order: list[int] = []
    for part in balanced_partitions(loads, dp_size, equal_size=True):
        part.sort(key=lambda idx: (loads[idx], idx))
        order.extend(part[::2] + part[1::2][::-1])
    return order


def micro_batch_count(seqlens: np.ndarray, max_token_len: int) -> int:
    """How many micro-batches ``rearrange_micro_batches`` makes before any DP sync: ``min(rows, ceil(sum/max))``."""
    total = int(np.asarray(seqlens, dtype=np.int64).sum())
    return min(len(seqlens), -(-total // max_token_len))


def rearrange_micro_batches(
    seqlens: np.ndarray, max_token_len: int, max_seq_len: int, count: int | None = None
) -> list[list[int]]:
    """verl's ``rearrange_micro_batches`` (dynamic batch size): row indices of each micro-batch, in the order verl
    runs them. ``count`` is the micro-batch count after the DP all-reduce (``same_micro_num_in_dp``), if any."""
    if max_token_len < max_seq_len:
        raise SplitRefusedError(
            "max_token_len must be greater than the sequence length. "
            f"Got max_token_len={max_token_len} and max_seq_len={max_seq_len}"
        )
    k = micro_batch_count(seqlens, max_token_len) if count is None else count
    if k > len(seqlens):
        raise SplitRefusedError(f"{k} micro-batches (the largest count of the DP ranks) for {len(seqlens)} rows")
    loads = workload(seqlens)
    parts = balanced_partitions(loads, k, equal_size=False)
    parts.sort(key=lambda part: (sum(loads[idx] for idx in part), part[0] if part else 0), reverse=True)
    return parts[::2][::-1] + parts[1::2]
