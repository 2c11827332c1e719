"""The by-token sums' faster path (docs/performance.md, "Explain with token ids"): the explain pass adds each valid
token to its id's row itself, from the terms it already took, and ids stay int32 as Parquet stores them. Its sums
are the stand-alone pass's bit for bit: padding, ids that arrive beyond the table as it was (it grows after the
pass), ids beyond the dense table (sparse), int32 and int64 ids, a table large enough that both prefetch its rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rcdiag.engine.stream import Engine
from rcdiag.explain.by_token import DENSE_IDS, TokenSums
from rcdiag.explain.state import ExplainState
from rcdiag.io import Chunk, open_dump
from rcdiag.io.record_batches import token_values
from rcdiag.kernels.token_rows import PREFETCH_TABLE_BYTES, prefetch_token_rows
from rcdiag.metrics.block import Block
from rcdiag.settings.correction import CorrectionConfig


class BothPasses(ExplainState):
    """The explain pass's by-token sums, and beside them the stand-alone pass's over the same blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.alone = TokenSums()

    def update(self, block: Block) -> None:
        super().update(block)
        self.alone.update(block)  # the stand-alone pass (``TokenSums.fold``) over the block's rows' ids


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_explain_pass_adds_the_stand_alone_pass_bits(dtype: type) -> None:
    rng = np.random.default_rng(11)
    state = BothPasses()
    engine = Engine(CorrectionConfig().resolve(), wholes=[state])
    for block in range(6):  # the id range widens block by block: the table grows after a pass left ids
        lengths = rng.integers(1, 60, 25)
        n = int(lengths.sum())
        top = 50 * 8**block
        ids = rng.integers(0, top, n)
        if block == 4:
            ids[::97] = DENSE_IDS + rng.integers(0, 5, ids[::97].shape[0])  # sparse, in a pass like any other
        old = -rng.exponential(1.0, n).astype(np.float32)
        rollout = np.minimum(old + rng.normal(0, 0.05, n), 0).astype(np.float32)
        rollout[::13] = old[::13]  # some |d| below the series' cut-off, some above
        mask = rng.random(n) > 0.2
        engine.update(
            Chunk(
                old=old,
                rollout=rollout,
                offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                mask=mask,
                tokens=ids.astype(dtype),
            )
        )
    assert state.tokens.dense.nbytes > PREFETCH_TABLE_BYTES  # the last blocks' passes prefetched the table's rows
    assert state.alone.dense.nbytes > PREFETCH_TABLE_BYTES
    ids, sums = state.tokens.table()
    alone_ids, alone = state.alone.table()
    assert 1 <= (ids >= DENSE_IDS).sum() <= 5
    assert ids.shape[0] > 1000
    assert np.array_equal(ids, alone_ids)
    assert np.array_equal(sums, alone)  # bit for bit, not to a tolerance


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_prefetching_the_table_rows_changes_nothing(dtype: type) -> None:
    """A hint only: over a table that is prefetched (above ``PREFETCH_TABLE_BYTES``) and one that is not, ids
    beyond the table (negative, past its end, the largest of the type) included, no value of the table changes."""
    rng = np.random.default_rng(3)
    for rows in (PREFETCH_TABLE_BYTES // 48 + 1000, 1000):
        table = rng.random((rows, 6))
        before = table.copy()
        ids = np.concatenate([rng.integers(0, rows, 5000), [-1, -(2**31), rows, rows + 1, 2**31 - 1]]).astype(dtype)
        prefetch_token_rows(ids, table)
        assert table.tobytes() == before.tobytes()


def test_token_ids_stay_int32_as_parquet_stores_them(tmp_path) -> None:
    assert token_values(pa.array([1, 2], pa.int32()), "t", "f", 0).dtype == np.int32
    assert token_values(pa.array([1, 2], pa.int64()), "t", "f", 0).dtype == np.int64
    assert token_values(pa.array([1, 2], pa.uint16()), "t", "f", 0).dtype == np.int64
    assert token_values(pa.array([1.0, 2.0], pa.float64()), "t", "f", 0).dtype == np.int64
    path = tmp_path / "d.parquet"
    table = pa.table(
        {
            "old_log_prob": pa.array([[-1.0, -2.0], [-0.5]], pa.list_(pa.float32())),
            "rollout_log_prob": pa.array([[-1.1, -2.0], [-0.4]], pa.list_(pa.float32())),
            "token_ids": pa.array([[3, 4], [5]], pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, path)
    source = open_dump(path)
    source.want_tokens(True)
    (chunk,) = list(source.chunks())
    assert chunk.tokens is not None
    assert chunk.tokens.dtype == np.int32
    assert chunk.tokens.tolist() == [3, 4, 5]
