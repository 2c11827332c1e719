"""``analyze --explain``'s fused pass (``rcdiag.kernels.explain``) against a brute-force reference written from the
definitions (per row, per token, numpy's own ``expm1`` and ``exp``), over NaN, infinite and huge log-ratios, empty
and fully masked rows, long rows crossing the position buckets, and blocks split anywhere."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from explain_sums_reference import LOG_LIKELY, LOG_UNLIKELY, NAMES, assert_sums_match, blocks, empty_sums
from hypothesis import given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.engine.stream import Engine
from rcdiag.explain.breakdowns import DOUBLING_EDGES, LOG_PROB_THRESHOLDS, PROB_EDGES
from rcdiag.explain.state import ExplainState, number_rows
from rcdiag.explain.statistics import RATIO_CAP, SHIFT_TOL
from rcdiag.io.base import Chunk
from rcdiag.kernels.explain import explain_block
from rcdiag.kernels.series import expm1_reduced as _expm1


def fold_blocks(old, rollout, mask, lengths, cuts: list[int]) -> dict[str, np.ndarray]:
    """The kernel's sums, the rows fed in blocks split before each row index in ``cuts``."""
    out = empty_sums()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    bounds = [0, *sorted(set(cuts)), len(lengths)]
    for a, b in itertools.pairwise(bounds):
        t0, t1 = int(offsets[a]), int(offsets[b])
        block_mask = None if mask is None else mask[t0:t1]
        flags = np.ones(t1 - t0, dtype=bool) if block_mask is None else block_mask
        valid = np.array([np.count_nonzero(row) for row in np.split(flags, offsets[a + 1 : b] - t0)], dtype=np.int64)
        explain_block(
            old[t0:t1], rollout[t0:t1], valid, lengths[a:b].astype(np.int64),
            np.zeros(0, np.uint8) if block_mask is None else block_mask.view(np.uint8),
            np.asarray(DOUBLING_EDGES, dtype=np.int64), LOG_PROB_THRESHOLDS, RATIO_CAP, SHIFT_TOL,
            *(out[name] for name in NAMES[:-1]), float(LOG_UNLIKELY), float(LOG_LIKELY), out["shape"],
            np.zeros(0, np.int64), np.zeros((0, 6)),
        )  # fmt: skip
    return out


@settings(max_examples=150, deadline=None)
@given(data=blocks(), cuts=st.lists(st.integers(0, 10), max_size=4))
def test_kernel_matches_the_definitions_in_any_blocks(data, cuts: list[int]) -> None:
    old, rollout, mask, lengths = data
    cuts = [c for c in cuts if 0 < c < len(lengths)]
    assert_sums_match(fold_blocks(old, rollout, mask, lengths, cuts), old, rollout, mask, lengths)


def test_kernel_on_special_rows() -> None:
    """Empty, fully masked, one-token and long rows; log-ratios beyond the clamp, the float32 overflow, infinite
    and NaN; rollout probabilities exactly on the bucket edges."""
    edges = [np.float32(math.log(e)) for e in PROB_EDGES[1:-1]]
    rows = [
        ([], []),
        ([-1.0, -2.0], [-1.0, -2.5]),
        ([0.0], [-100.0]),  # d = 100: k3 = inf, chi2 at the clamp
        ([-np.inf, -1.0, -np.inf], [-1.0, -np.inf, -np.inf]),  # d = -inf, +inf, NaN
        ([np.nan, -0.5], [-0.5, np.nan]),
        (list(-np.abs(np.linspace(0, 3, 700))), [*edges, *([-0.01] * 693)]),
    ]
    lengths = np.array([len(o) for o, _ in rows], dtype=np.int64)
    old = np.concatenate([np.asarray(o, dtype=np.float32) for o, _ in rows])
    rollout = np.concatenate([np.asarray(r, dtype=np.float32) for _, r in rows])
    for mask in (None, np.arange(old.shape[0]) % 3 != 0, np.zeros(old.shape[0], dtype=bool)):
        assert_sums_match(fold_blocks(old, rollout, mask, lengths, []), old, rollout, mask, lengths)
        assert_sums_match(fold_blocks(old, rollout, mask, lengths, [1, 3, 5]), old, rollout, mask, lengths)


@settings(max_examples=25, deadline=None)
@given(data=blocks(nan=False), block_tokens=st.sampled_from([1, 7, 64, 1 << 17]), split=st.integers(1, 9))
def test_engine_feeds_the_kernel_every_valid_token_whatever_the_blocks(data, block_tokens: int, split: int) -> None:
    """Through the engine (chunks split anywhere, blocks of any size): the state's sums are the definitions'."""
    old, rollout, mask, lengths = data
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    split = min(split, len(lengths))
    chunks = []
    for a, b in ((0, split), (split, len(lengths))):
        t0, t1 = int(offsets[a]), int(offsets[b])
        part_mask = None if mask is None else mask[t0:t1]
        chunks.append(Chunk(old[t0:t1], rollout[t0:t1], offsets[a : b + 1] - t0, part_mask))
    state = ExplainState()
    engine = Engine(rcdiag.CorrectionConfig().resolve(), wholes=[state])
    engine.block_tokens = block_tokens
    engine.run(number_rows(chunks, [state]))
    got = {
        "prob": state.breakdowns.prob,
        "position": state.breakdowns.position,
        "length": state.breakdowns.length,
        "scale": state.scale.sums,
        "offset": state.offset.sums,
        "shape": state.shape.sums,
    }
    assert_sums_match(got, old, rollout, mask, lengths)


@pytest.mark.parametrize("scale", [1e-9, 1e-3, 0.3, 3.0, 30.0])
def test_expm1_is_within_two_ulps_of_numpy(scale: float) -> None:
    rng = np.random.default_rng(0)
    x = np.clip(np.concatenate([rng.normal(0.0, scale, 2_000), rng.uniform(-45.0, 88.0, 2_000)]), -1e3, 88.0)
    got, want = np.array([_expm1(v) for v in x]), np.expm1(x)
    assert (np.abs(got - want) <= 2 * np.spacing(np.abs(want))).all()
    special = [np.nan, -np.inf, 0.0, -41.0, -1e300]
    assert np.isnan(_expm1(np.nan))
    assert [_expm1(v) for v in special[1:]] == [-1.0, 0.0, -1.0, -1.0]


def test_rows_of_small_log_ratios_take_the_series_with_the_same_result() -> None:
    """Below ``SMALL`` the range reduction is the identity: the series alone gives every term bit for bit."""
    from rcdiag.kernels.explain import SMALL, _row_terms

    rng = np.random.default_rng(3)
    old = -np.abs(rng.normal(0.0, 2.0, 5000)).astype(np.float32)
    rollout = (old + rng.uniform(-SMALL, SMALL, 5000)).astype(np.float32)
    rollout[:3] = old[:3] - np.array([0.0, -0.0, np.float32(SMALL) * 0.999], dtype=np.float32)
    assert (np.abs(old - rollout) < np.float32(SMALL)).all()
    outputs = []
    for small in (True, False):
        k3, chi2 = np.empty(5000), np.empty(5000)
        outputs.append((_row_terms(old, rollout, k3, chi2, np.float32(RATIO_CAP), small), k3, chi2))
    (sums_a, k3_a, chi2_a), (sums_b, k3_b, chi2_b) = outputs
    assert sums_a == sums_b
    assert np.array_equal(k3_a, k3_b) and np.array_equal(chi2_a, chi2_b)
