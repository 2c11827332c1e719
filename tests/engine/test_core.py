"""``rcdiag.core``: each formula and constant written once, the same function serving Python floats, numpy arrays
and (compiled through ``rcdiag.kernels.scalar``) the kernels; and the per-token passes' two implementations
(``CompiledPasses``, ``ArrayPasses``) giving the same statistics and bands on the same block."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from token_sums_reference import raw_blocks, valid_per_row

from rcdiag.core import formulas
from rcdiag.core.limits import F32_MAX, LOG_F32_MAX, SAFETY_BOUND, finite, finite_f32, finite_tree
from rcdiag.kernels import scalar
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.block import Block
from rcdiag.metrics.token_passes import ArrayPasses, CompiledPasses

# What a formula or constant of rcdiag.core looks like when written again elsewhere.
COPIES = {
    "float32's largest value": r"finfo\(np\.float32\)\.max",
    "the order key": r">> 31\) &",
    "Chan's merge": r"delta \* delta",
    "chi2's term": r"\(\w+ \+ 2\.0\)",
    "the clamp's bound": r"\b20\.0\b",
    "expm1 at the clamp": r"expm1\(-?20",
    "a finite helper": r"def _finite\w*\b|!= float\(\"inf\"\) and",
    "an order key's bound": r"0x7F80000[01]\b|0x7FFFFFFF\b|0x80000000\b",
    "the RS keep rule": r"\(\w+ >= \w+\) & \(\w+ <= \w+\)",
    "a band's clip": r"\w+ if \w+ < \w+ else \(\w+ if \w+ > \w+ else \w+\)",
}


def test_no_module_writes_a_core_formula_again() -> None:
    found = []
    for path in sorted((ROOT / "rcdiag").rglob("*.py")):
        if path.parent.name == "core":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            found += [f"{path.relative_to(ROOT)}:{number}: {what}" for what, p in COPIES.items() if re.search(p, code)]
    assert found == []


def test_the_finder_sees_a_copy() -> None:
    assert re.search(COPIES["Chan's merge"], "m2 = a + b + delta * delta * n_a * n_b / n")
    assert re.search(COPIES["the RS keep rule"], "keep = (row >= lo) & (row <= hi)")
    assert re.search(COPIES["a band's clip"], "c = floor if x < floor else (hi if x > hi else x)")


@njit
def _compiled(d32: np.ndarray, em1: np.ndarray, d64: np.ndarray, lo: np.float32, hi: np.float32):  # type: ignore[no-untyped-def]
    n = d32.shape[0]
    k2 = np.empty(n, np.float32)
    k3 = np.empty(n)
    chi2 = np.empty(n)
    keep1 = np.empty(n, np.bool_)
    keep2 = np.empty(n, np.bool_)
    for i in range(n):
        dc = scalar.clamp(d32[i], np.float32(SAFETY_BOUND))
        k2[i] = scalar.k2(dc)
        k3[i] = scalar.k3_verl(em1[i], d64[i])
        chi2[i] = scalar.chi2_term(em1[i])
        keep1[i] = scalar.rs_keep(d32[i], lo, hi, True)
        keep2[i] = scalar.rs_keep(d32[i], lo, hi, False)
    return k2, k3, chi2, keep1, keep2


def test_compiled_formulas_are_the_array_formulas_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    d32 = np.concatenate([rng.normal(0, 3, 2000), [0.0, -0.0, 19.99, 20.0, 25.0, -25.0, 88.0, 89.0, np.inf, -np.inf]])
    d32 = np.append(d32, np.nan).astype(np.float32)
    d64 = d32.astype(np.float64)
    with np.errstate(all="ignore"):
        em1 = np.expm1(d64)
        lo, hi = np.float32(-0.5), np.float32(1.5)
        k2, k3, chi2, keep1, keep2 = _compiled(d32, em1, d64, lo, hi)
        dc = formulas.clamp_log_ratio(np, d32)
        assert np.array_equal(k2, formulas.k2(dc), equal_nan=True) and k2.dtype == formulas.k2(dc).dtype
        assert np.array_equal(k3, formulas.k3_verl_array(np, em1, d64), equal_nan=True)
        assert np.array_equal(chi2, formulas.chi2_term(em1), equal_nan=True)
    assert np.array_equal(keep1, formulas.rs_keep(d32, lo, hi, True))
    assert np.array_equal(keep2, formulas.rs_keep(d32, lo, hi, False))
    assert not keep1[-1] and not keep2[-1]  # NaN is never kept
    assert k3[d64 > LOG_F32_MAX].tolist() == [math.inf] * int((d64 > LOG_F32_MAX).sum())


def test_order_key_orders_as_the_floats_and_inverts_itself() -> None:
    values = np.array([-np.inf, -3.0, -1e-30, -0.0, 0.0, 1e-30, 2.0, np.inf], dtype=np.float32)
    keys = formulas.order_key(values.view(np.int32))
    assert (np.diff(keys.astype(np.int64)) >= 0).all()
    assert np.array_equal(formulas.order_key_floats(keys), values)


def test_order_key_bounds() -> None:
    keys = np.array([formulas.NEG_INF_KEY, formulas.POS_INF_KEY], dtype=np.int32)
    assert formulas.order_key_floats(keys).tolist() == [-math.inf, math.inf]
    assert formulas.KEY_LOWEST < formulas.NEG_INF_KEY < formulas.POS_INF_KEY < formulas.KEY_HIGHEST
    assert (int(formulas.KEY_LOWEST), int(formulas.KEY_HIGHEST)) == (-(2**31), 2**31 - 1)


def test_chan_merge_of_two_parts_is_one_pass() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(3, 2, 500), rng.normal(-1, 5, 700)
    whole = np.concatenate([a, b])
    for merge in (formulas.chan_merge, formulas.chan_merge_share):
        n, mean, m2 = merge(
            a.size, a.mean(), ((a - a.mean()) ** 2).sum(), b.size, b.mean(), ((b - b.mean()) ** 2).sum()
        )
        assert n == whole.size
        assert math.isclose(mean, whole.mean(), rel_tol=1e-13)
        assert math.isclose(m2, ((whole - whole.mean()) ** 2).sum(), rel_tol=1e-12)


def test_finite_helpers() -> None:
    assert [finite(v) for v in (1.0, math.inf, -math.inf, math.nan, None)] == [1.0, None, None, None, None]
    assert [finite_f32(v) for v in (F32_MAX, F32_MAX * 2, -F32_MAX * 2, math.nan, None)] == [F32_MAX] + [None] * 4
    tree = {"a": [1.0, math.inf, (math.nan, "x")], "b": {"c": -math.inf, "d": 2}, "e": np.float64(np.inf)}
    assert finite_tree(tree) == {"a": [1.0, None, [None, "x"]], "b": {"c": None, "d": 2}, "e": None}


@pytest.fixture(autouse=True)
def _quiet():  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):  # -inf - -inf: NaN, on purpose
        yield


@settings(max_examples=150, deadline=None)
@given(raw_blocks(), st.sampled_from(["k1", "k2", "k3"]), st.sampled_from([(-0.3, 0.3), (0.0, 1e-3), (0.2, -0.2)]))
def test_the_two_pass_implementations_agree(block, estimator, band) -> None:  # type: ignore[no-untyped-def]
    """The same numpy block through the compiled and the array passes: the same statistic (k1, k2 to the bit; k3 to
    one float32 ulp), the same per-row extremes, the same rejections and counts."""
    old, rollout, mask, lengths = block
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    blocks = {}
    for passes in (CompiledPasses(), ArrayPasses()):
        the_block = Block(NumpyBackend(), old, rollout, valid, mask=mask, raw_lengths=lengths)
        the_block.passes = passes
        blocks[type(passes).__name__] = the_block
    compiled, array = blocks["CompiledPasses"], blocks["ArrayPasses"]
    lo, hi = (float(np.float32(x)) for x in band)
    a, b = compiled.statistic(estimator), array.statistic(estimator)
    if estimator == "k3":
        assert np.allclose(a.stat, b.stat, rtol=2**-23, atol=0, equal_nan=True)
    else:
        assert np.array_equal(a.stat, b.stat, equal_nan=True)
        assert np.array_equal(a.row_max, b.row_max, equal_nan=True)
        assert np.array_equal(a.row_min, b.row_min, equal_nan=True)
        got, want = compiled.band(estimator, lo, hi), array.band(estimator, lo, hi)
        assert (got.masked_tokens, got.above) == (want.masked_tokens, want.above)
        assert estimator != "k1" or got.below == want.below  # (k2/k3: one-sided, their 'below' is never read)
        assert np.array_equal(got.rows_hit, want.rows_hit)
    assert np.array_equal(compiled.row_lr_range[0], array.row_lr_range[0], equal_nan=True)
    assert compiled.lr_range == pytest.approx(array.lr_range, nan_ok=True)
