"""How verl cuts one training step's batch: data-parallel ranks, mini-batches per rank, micro-batches per
mini-batch (reference section 11).

1. ``balance_batch`` (optional) reorders the rows; the batch is cut into ``dp_size`` contiguous chunks.
2. Each rank splits its rows into contiguous mini-batches of ``mini_batch_size`` (default: all its rows).
3. Each mini-batch is cut into contiguous micro-batches of ``micro_batch_size`` rows (default: one micro-batch), or by
   ``rearrange_micro_batches`` under a token budget (dynamic batch size), with the counts made equal across ranks
   where verl syncs them (always from v0.8.0; with ``sync_micro_num`` for v0.7.1, as its Megatron actor did).

A setup verl refuses (rows not divisible, a token budget below the longest sequence) is a ``SplitRefusedError`` with
verl's condition: rcdiag reports it, it does not crash.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.microbatch.partition import (
    SplitRefusedError,
    balance_batch_order,
    micro_batch_count,
    rearrange_micro_batches,
)
from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.option_checks import keyword
from rcdiag.settings.section_options import MICROBATCH
from rcdiag.settings.versions import VerlVersion


@dataclass(frozen=True)
class MicroBatchSettings:
    """The actor's batching configuration, per GPU (verl's ``ppo_*_per_gpu`` values after normalisation)."""

    micro_batch_size: int | None = None
    """Rows per static micro-batch (``ppo_micro_batch_size_per_gpu``); ``None`` without ``max_token_len``: the
    mini-batch (one micro-batch per mini-batch)."""
    mini_batch_size: int | None = None
    """Rows per mini-batch on each rank; ``None``: the rank's whole share of the step."""
    dp_size: int = 1
    """Data-parallel ranks."""
    max_token_len: int | None = None
    """Dynamic batch size: the token budget per micro-batch (``ppo_max_token_len_per_gpu`` x Ulysses size)."""
    prompt_len: int | None = None
    """Prompt tokens per row (dumps hold none): a sequence is this plus its response length."""
    balance_batch: bool = False
    """verl's ``trainer.balance_batch`` reorder before the DP split."""
    sync_micro_num: bool = False
    """Make dynamic micro-batch counts equal across ranks under v0.7.1 (always so from v0.8.0)."""

    def __post_init__(self) -> None:
        for name, check in MICROBATCH.items():
            if getattr(self, name) is not None:
                check(getattr(self, name), keyword(name))
        if self.micro_batch_size is not None and self.max_token_len is not None:
            raise ConfigError(
                "give one of --micro-batch-size N (static micro-batches) or --max-token-len L (dynamic batch size), "
                "not both."
            )
        needs_lengths = self.max_token_len is not None or self.balance_batch
        if needs_lengths and self.prompt_len is None:
            what = "--max-token-len" if self.max_token_len is not None else "--balance-batch"
            raise ConfigError(
                f"{what} balances sequence lengths, and a dump holds no prompt lengths: add --prompt-len P (the "
                "prompt tokens per row)."
            )
        if not needs_lengths and self.prompt_len is not None:
            raise ConfigError("--prompt-len has no effect without --max-token-len or --balance-batch: leave it out.")
        if self.sync_micro_num and self.max_token_len is None:
            raise ConfigError("--sync-micro-num has no effect with static micro-batches (--micro-batch-size).")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Layout:
    """Row indices (into the step's rows, in dump order) of every micro-batch: ``mini[m][rank][micro]``."""

    mini_batches: list[list[list[list[int]]]]
    rank_rows: list[list[int]]
    """Each rank's rows, in the order the rank holds them."""


def plan(
    settings: MicroBatchSettings,
    version: VerlVersion,
    response_lengths: np.ndarray,
    widths: np.ndarray,
) -> Layout:
    """The layout verl makes of one step's rows (``SplitRefusedError`` where verl asserts)."""
    n, dp = len(response_lengths), settings.dp_size
    seqlens = (settings.prompt_len or 0) + np.asarray(response_lengths, dtype=np.int64)
    if n % dp:
        raise SplitRefusedError(f"only support equal chunk. Got size of DataProto {n} and chunk {dp}.")
    order = balance_batch_order(seqlens, dp) if settings.balance_batch else list(range(n))
    per_rank = n // dp
    ranks = [order[r * per_rank : (r + 1) * per_rank] for r in range(dp)]
    mini = settings.mini_batch_size or per_rank
    micro = settings.micro_batch_size or (None if settings.max_token_len is not None else mini)
    if micro is not None and mini % micro:
        raise SplitRefusedError(
            f"normalized ppo_mini_batch_size {mini} should be divisible by ppo_micro_batch_size_per_gpu {micro}"
            if version.legacy_actor
            else "data size must be divisible by force_group_size * micro_batch_size_per_gpu"
        )
    if not version.legacy_actor and per_rank % mini:
        raise SplitRefusedError(f"{per_rank} % {mini} != 0")  # make_iterator; v0.7.1 split leaves a short last one
    starts = range(0, per_rank, mini)
    if micro is not None:
        mini_batches = [
            [[rows[i : i + micro] for i in range(s, min(s + mini, per_rank), micro)] for rows in ranks] for s in starts
        ]
        return Layout(mini_batches, ranks)
    assert settings.max_token_len is not None
    budget = settings.max_token_len
    # v0.7.1 padded the batch: verl's max_seq_len is the tensor width (prompt + the widest response list of the
    # step); later releases use nested tensors, whose max_seq_len is the longest sequence of the mini-batch.
    padded = (settings.prompt_len or 0) + int(np.max(widths, initial=0))
    mini_batches = []
    sync = settings.sync_micro_num or not version.legacy_actor
    for s in starts:
        chunks = [rows[s : s + mini] for rows in ranks]
        count = max(micro_batch_count(seqlens[c], budget) for c in chunks) if sync else None
        layout = []
        for rows in chunks:
            longest = padded if version.legacy_actor else int(seqlens[rows].max(initial=0))
            parts = rearrange_micro_batches(seqlens[rows], budget, longest, count)
            layout.append([[rows[i] for i in part] for part in parts])
        mini_batches.append(layout)
    return Layout(mini_batches, ranks)
