"""The fused CPU token pass (``rcdiag.kernels.metric_pass``) against brute force in extended precision, and against the
generic path (the backend's elementwise operations, which torch runs) on the same blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_sums_reference import SPECIAL, assert_chi2_close, brute_force, raw_blocks, same_or_close, valid_per_row

from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.block import Block
from rcdiag.metrics.token_passes import fused_token_sums, generic_token_sums

LOG_F32_MAX = math.log(float(np.finfo(np.float32).max))

def reference(old, rollout, mask, lengths) -> dict:
    """Token by token in Python floats (and long double for e^x - 1), the rules of verl's float32 arithmetic."""
    valid = np.ones(old.shape[0], dtype=bool) if mask is None else mask
    rows_old, rows_rollout, terms = [], [], {"abs": [], "exp": [], "k3": [], "chi2": []}
    lr, clamped, t = [], 0, 0
    row_lo, row_hi = [], []
    for n in lengths.tolist():
        keep = valid[t : t + n]
        rows_old.append(math.fsum(old[t : t + n][keep].astype(np.float64).tolist()))
        rows_rollout.append(math.fsum(rollout[t : t + n][keep].astype(np.float64).tolist()))
        d_row = (old[t : t + n] - rollout[t : t + n])[keep]
        nan_row = bool(np.isnan(d_row).any())
        row_lo.append(math.nan if nan_row else min(d_row.tolist(), default=math.inf))
        row_hi.append(math.nan if nan_row else max(d_row.tolist(), default=-math.inf))
        for d32 in d_row.tolist():
            d = float(np.float32(d32))
            lr.append(d)
            ld = np.longdouble(d)
            terms["abs"].append(abs(d))
            terms["exp"].append(math.inf if abs(d) > LOG_F32_MAX else float(np.exp(np.longdouble(abs(d)))))
            terms["k3"].append(math.inf if d > LOG_F32_MAX else float(np.expm1(ld) - ld))
            dc = np.longdouble(min(max(d, -20.0), 20.0)) if d == d else ld
            terms["chi2"].append(float(np.expm1(2 * dc)))
            clamped += abs(d) > 20.0
        t += n
    lr_arr = np.array(lr, dtype=np.float32)
    has_nan = bool(np.isnan(lr_arr).any())
    return {
        "rows": (np.array(rows_old), np.array(rows_rollout)),
        "row_range": (np.array(row_lo), np.array(row_hi)),
        "sums": {k: _sum(v) for k, v in terms.items()},
        "chi2_scale": _sum([abs(v) for v in terms["chi2"]]),
        "range": (math.nan, math.nan) if has_nan else (min(lr, default=math.inf), max(lr, default=-math.inf)),
        "nan": int(np.isnan(lr_arr).sum()),
        "clamped": int(clamped),
        "counts": brute_force(lr_arr),
    }


def _sum(values: list[float]) -> float:
    if any(v != v for v in values) or (math.inf in values and -math.inf in values):
        return math.nan
    if math.inf in values:
        return math.inf
    return math.fsum(values)


@pytest.fixture(autouse=True)
def _quiet():
    with np.errstate(all="ignore"):  # -inf - -inf: NaN, on purpose
        yield


@settings(max_examples=300, deadline=None)
@given(raw_blocks())
def test_fused_pass_matches_brute_force(block) -> None:
    old, rollout, mask, lengths = block
    got = fused_token_sums(old, rollout, mask, lengths)
    ref = reference(old, rollout, mask, lengths)
    assert np.allclose(got.row_sum_old, ref["rows"][0], rtol=1e-12, atol=0, equal_nan=True)
    assert np.allclose(got.row_sum_rollout, ref["rows"][1], rtol=1e-12, atol=0, equal_nan=True)
    lo, hi = ref["range"]
    assert same_or_close(got.lr_min, lo, 0) and same_or_close(got.lr_max, hi, 0)
    assert np.array_equal(got.row_lr_min, ref["row_range"][0], equal_nan=True)
    assert np.array_equal(got.row_lr_max, ref["row_range"][1], equal_nan=True)
    assert (got.nan, got.clamped) == (ref["nan"], ref["clamped"])
    assert got.log_ratio_counts.tolist() == ref["counts"]
    for name, value in (("abs", got.abs_sum), ("exp", got.exp_abs_sum), ("k3", got.k3_sum)):
        assert same_or_close(value, ref["sums"][name]), (name, value, ref["sums"][name])
    assert_chi2_close(got.chi2_sum, ref["sums"]["chi2"], ref["chi2_scale"])


@settings(max_examples=200, deadline=None)
@given(raw_blocks())
def test_fused_pass_matches_the_generic_path(block) -> None:
    old, rollout, mask, lengths = block
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    fused = fused_token_sums(old, rollout, mask, lengths)
    generic = generic_token_sums(Block(NumpyBackend(), old, rollout, valid, mask=mask, raw_lengths=lengths))
    assert np.allclose(fused.row_sum_old, generic.row_sum_old, rtol=1e-12, atol=0, equal_nan=True)
    assert np.allclose(fused.row_sum_rollout, generic.row_sum_rollout, rtol=1e-12, atol=0, equal_nan=True)
    assert same_or_close(fused.lr_min, generic.lr_min, 0) and same_or_close(fused.lr_max, generic.lr_max, 0)
    assert (fused.nan, fused.clamped) == (generic.nan, generic.clamped)
    assert fused.log_ratio_counts.tolist() == generic.log_ratio_counts.tolist()
    # the generic path computes e^|d| with numpy's float32 exp (as verl would): equal within its few ulps
    assert same_or_close(fused.exp_abs_sum, generic.exp_abs_sum, 4e-7)
    assert same_or_close(fused.abs_sum, generic.abs_sum, 1e-10)
    assert_chi2_close(fused.chi2_sum, generic.chi2_sum, 2 * generic.abs_sum + abs(generic.chi2_sum))
    # the generic path's expm1(d) - d cancels: about one ulp of d per token, absolute (the series does not)
    k3, k3_generic = fused.k3_sum, generic.k3_sum
    if math.isfinite(k3_generic):
        assert math.isclose(k3, k3_generic, rel_tol=1e-10, abs_tol=1e-15 * generic.abs_sum), (k3, k3_generic)
    else:
        assert same_or_close(k3, k3_generic)


def _block(old, rollout, mask, lengths) -> Block:
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    return Block(NumpyBackend(), old, rollout, valid, mask=mask, raw_lengths=lengths)


@pytest.mark.parametrize("d", [0.2499999, 0.25, -0.25, 0.2500001, 1e-30, -1e-8, 19.999, 20.0, 20.0001, 88.7, 88.8])
def test_series_edge_and_bounds(d: float) -> None:
    """Values on both sides of the series' edge, verl's clamp and float32's exp overflow, one token each."""
    old = np.array([-100.0 + d], dtype=np.float32)
    rollout = np.array([-100.0], dtype=np.float32)
    got = fused_token_sums(old, rollout, None, np.array([1]))
    ref = reference(old, rollout, None, np.array([1]))
    for name, value in (("exp", got.exp_abs_sum), ("k3", got.k3_sum), ("chi2", got.chi2_sum)):
        assert same_or_close(value, ref["sums"][name]), (d, name, value, ref["sums"][name])  # one token: no cancelling
    assert got.clamped == ref["clamped"]


def test_empty_block() -> None:
    none = np.zeros(0, dtype=np.float32)
    got = fused_token_sums(none, none, None, np.zeros(3, dtype=np.int64))
    assert got.row_sum_old.tolist() == [0.0, 0.0, 0.0]
    assert (got.lr_min, got.lr_max, got.nan, got.abs_sum, got.exp_abs_sum) == (math.inf, -math.inf, 0, 0.0, 0.0)
    assert int(got.log_ratio_counts.sum()) == 0


@settings(max_examples=200, deadline=None)
@given(raw_blocks(), st.sampled_from(["k1", "k2", "k3"]))
def test_statistic_pass_matches_numpy(block, estimator) -> None:
    """The fused statistic equals numpy's per-token arrays (k1, k2 to the bit; k3, rounded once from float64, to
    one float32 ulp) and its per-row sums and extremes equal numpy's segment reductions."""
    old, rollout, mask, lengths = block
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    keep = np.ones(old.shape[0], dtype=bool) if mask is None else mask
    d = np.clip(old[keep] - rollout[keep], np.float32(-20), np.float32(20))
    expected = {
        "k1": -d,
        "k2": 0.5 * d * d,
        "k3": (np.expm1(d.astype(np.float64)) - d.astype(np.float64)).astype(np.float32),
    }[estimator]
    got = _block(old, rollout, mask, lengths).statistic(estimator)
    if estimator == "k3":
        assert np.allclose(got.stat, expected, rtol=2**-23, atol=0, equal_nan=True)
    else:
        assert np.array_equal(got.stat, expected, equal_nan=True)
    ends = np.cumsum(valid)
    for r, (n, end) in enumerate(zip(valid.tolist(), ends.tolist(), strict=True)):
        row = got.stat[end - n : end].astype(np.float64)
        assert same_or_close(got.row_sum[r], math.fsum(row.tolist()) if not np.isnan(row).any() else math.nan, 1e-12)
        top = np.max(row) if n else -math.inf  # NaN propagates, as torch's max
        bottom = np.min(row) if n else math.inf
        assert same_or_close(got.row_max[r], top, 0) and same_or_close(got.row_min[r], bottom, 0)


BANDS = [(-0.3, 0.3), (0.0, 1e-3), (0.2, -0.2), (-20.0, 20.0), (-25.0, 3.0), (-0.6931472, 0.6931472)]


@settings(max_examples=300, deadline=None)
@given(
    raw_blocks(),
    st.sampled_from(["k1", "k2", "k3"]),
    st.sampled_from(BANDS),
    st.sampled_from(["statistic", "token pass"]),
)
def test_band_matches_brute_force(block, estimator, thresholds, path) -> None:
    """Rejections per row, strict counts and the clipped moments, token by token (bounds included, NaN
    rejected, an inverted k1 band rejecting everything, bounds at and beyond the clamp), from the statistic's
    own pass and, for k1, from the token pass that takes the configuration's bands while it reads the rows."""
    old, rollout, mask, lengths = block
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    lo, hi = (float(np.float32(x)) for x in thresholds)
    two_sided = estimator == "k1"
    fused = path == "token pass" and two_sided
    bands = ((lo, hi),) if fused else ()
    the_block = Block(NumpyBackend(), old, rollout, valid, mask=mask, raw_lengths=lengths, k1_bands=bands)
    stat = the_block.statistic(estimator)
    got = the_block.band(estimator, lo, hi)
    assert ((lo, hi) in the_block.sums.bands) == fused
    values = stat.stat.astype(np.float64).tolist()
    kept = [(x <= hi) and (x >= lo or not two_sided) for x in values]
    ends = np.cumsum(valid)
    per_row = [sum(not k for k in kept[e - n : e]) for n, e in zip(valid.tolist(), ends.tolist(), strict=True)]
    assert got.row_rejected.tolist() == per_row
    assert (got.above, got.below) == (sum(x > hi for x in values), sum(x < lo for x in values))
    clipped = [min(max(x, lo), hi) for x in values]  # torch's clamp: hi everywhere for an inverted band
    n = len(clipped)
    if n and not any(x != x for x in clipped):
        mean = math.fsum(clipped) / n
        m2 = math.fsum((x - mean) ** 2 for x in clipped)
        # (a mean near 0 is a difference of sums: its rounding is relative to the values, not to the mean)
        scale = max(abs(x) for x in clipped)
        assert got.clipped[0] == n and math.isclose(got.clipped[1], mean, rel_tol=1e-12, abs_tol=1e-15 * scale)
        assert math.isclose(got.clipped[2], m2, rel_tol=1e-9, abs_tol=1e-12 * max(1.0, abs(mean)) ** 2 * n)
    elif n:
        assert math.isnan(got.clipped[1])
    else:
        assert got.clipped == (0.0, 0.0, 0.0)


@settings(max_examples=150, deadline=None)
@given(raw_blocks(), st.integers(0, 2**32 - 1))
def test_padding_anywhere_changes_no_bit(block, seed) -> None:
    """The same valid tokens with padding inserted anywhere in the rows (any values under mask 0) give the very
    same sums, bit for bit: every sum is taken over the compacted row."""
    old, rollout, mask, lengths = block
    keep = np.ones(old.shape[0], dtype=bool) if mask is None else mask
    rng = np.random.default_rng(seed)
    rows_old, rows_rollout, rows_mask = [], [], []
    t = 0
    for n in lengths.tolist():
        o, q = old[t : t + n][keep[t : t + n]], rollout[t : t + n][keep[t : t + n]]
        slots = np.sort(rng.integers(0, o.shape[0] + 1, rng.integers(0, 6)))
        rows_old.append(np.insert(o, slots, rng.choice(SPECIAL, slots.shape[0])))
        rows_rollout.append(np.insert(q, slots, rng.normal(size=slots.shape[0])))
        rows_mask.append(np.insert(np.ones(o.shape[0], dtype=bool), slots, False))
        t += n
    plain = fused_token_sums(
        np.concatenate([r[m] for r, m in zip(rows_old, rows_mask, strict=True)]).astype(np.float32),
        np.concatenate([r[m] for r, m in zip(rows_rollout, rows_mask, strict=True)]).astype(np.float32),
        None,
        np.array([int(m.sum()) for m in rows_mask], dtype=np.int64),
    )
    padded = fused_token_sums(
        np.concatenate(rows_old).astype(np.float32),
        np.concatenate(rows_rollout).astype(np.float32),
        np.concatenate(rows_mask),
        np.array([m.shape[0] for m in rows_mask], dtype=np.int64),
    )
    for name in ("lr", "row_lr_min", "row_lr_max", "row_sum_old", "row_sum_rollout", "log_ratio_counts"):
        assert np.array_equal(getattr(plain, name), getattr(padded, name), equal_nan=True), name
    for name in ("lr_min", "lr_max", "nan", "abs_sum", "exp_abs_sum", "k3_sum", "chi2_sum", "clamped"):
        assert same_or_close(getattr(plain, name), getattr(padded, name), 0), name


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300), st.integers(0, 2**32 - 1))
def test_screen_range_matches_numpy(patterns, seed) -> None:
    """The screen's one-pass (min, max) equals numpy's on any float32 bit patterns: both NaN when a NaN of either
    sign is present, infinities and subnormals included."""
    from rcdiag.kernels.screen import value_range

    rng = np.random.default_rng(seed)
    values = np.array(patterns, dtype=np.uint32).view(np.float32)
    if rng.random() < 0.7:  # mostly ordinary numbers, a few bit patterns of every kind
        values = np.where(rng.random(values.shape[0]) < 0.9, rng.normal(0, 10, values.shape[0]), values)
        values = values.astype(np.float32)
    lo, hi = value_range(values)
    assert same_or_close(lo, float(values.min()), 0) and same_or_close(hi, float(values.max()), 0)


def test_a_block_is_freed_without_the_cycle_collector() -> None:
    """What the RS options keep of a block (their token-mask closures) holds no reference to the block itself:
    a cycle would keep every block's arrays alive until the cycle collector ran, and memory grew with the dump."""
    import gc
    import weakref

    import rcdiag
    from rcdiag.metrics.batch import BatchMetrics

    config = rcdiag.CorrectionConfig(
        rollout_is="sequence",
        rollout_is_threshold=2.0,
        rollout_rs="token_k1,seq_mean_k1",
        rollout_rs_threshold="0.5_2.0,0.999_1.001",
    ).resolve()
    rng = np.random.default_rng(0)
    old = -np.abs(rng.normal(size=1000)).astype(np.float32)
    rollout = (old + rng.normal(0, 0.05, 1000)).astype(np.float32)
    lengths = np.array([400, 600])
    batch = BatchMetrics(config)
    gc.disable()
    try:
        block = Block(NumpyBackend(), old, rollout, lengths, k1_bands=((-0.6931472, 0.6931472),))
        batch.update(block)
        alive = weakref.ref(block)
        del block
        assert alive() is None
    finally:
        gc.enable()
