"""The small-dump path's numpy forms of ``--explain``'s passes (``rcdiag.kernels.small_explain``) against the brute-force
reference of tests/explain_sums_reference.py and against the kernels they stand in for (``rcdiag.kernels.explain``,
``rcdiag.kernels.token_ids``): counts and skipped ids exactly, sums to float64 rounding, over NaN, infinite and huge
log-ratios, empty and fully masked rows, values on the probability-bucket edges and the series cut-off, token ids
beyond the table and blocks split anywhere; then whole reports, and a real small ``--explain`` that loads no numba."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
from compiled_paths import cli_modules, far_apart, flat
from conftest import SAMPLES
from explain_sums_reference import LOG_LIKELY, LOG_UNLIKELY, NAMES, SHAPE_RATIO, assert_sums_match, blocks, empty_sums
from hypothesis import given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.explain.breakdowns import DOUBLING_EDGES, LOG_PROB_THRESHOLDS
from rcdiag.explain.statistics import RATIO_CAP, SHIFT_TOL
from rcdiag.kernels import explain, small_explain, token_ids
from rcdiag.kernels.explain_encoding import SMALL
from rcdiag.metrics.backend import NumpyBackend

EDGES = np.asarray(DOUBLING_EDGES, dtype=np.int64)
TABLE = 50
"""Rows of the by-token table in the block tests: ids are drawn from -3 to 70, so some lie beyond it."""


@pytest.fixture(autouse=True)
def _quiet():  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):  # inf - inf: NaN, on purpose
        yield


def _valid(mask: np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
    if mask is None:
        return lengths.astype(np.int64)
    return np.array([np.count_nonzero(r) for r in np.split(mask, np.cumsum(lengths)[:-1])], dtype=np.int64)


def fold(block_pass, old, rollout, mask, lengths, tokens, cuts=()):  # type: ignore[no-untyped-def]
    """``block_pass`` (the kernel's ``explain_block`` or the twin's) over the rows split into blocks before each row
    index in ``cuts``: the sums, the by-token table and the skipped ids per block."""
    out, table, skipped = empty_sums(), np.zeros((TABLE, 6)), []
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    for a, b in itertools.pairwise([0, *sorted(set(cuts)), len(lengths)]):
        t0, t1 = int(offsets[a]), int(offsets[b])
        block_mask = None if mask is None else mask[t0:t1]
        rows = (_valid(block_mask, lengths[a:b]), lengths[a:b].astype(np.int64))
        flags = np.zeros(0, np.uint8) if block_mask is None else block_mask.view(np.uint8)
        sums = [out[name] for name in NAMES[:-1]]
        bounds = (float(LOG_UNLIKELY), float(LOG_LIKELY))
        block_ids = tokens[t0:t1] if tokens.shape[0] else tokens
        constants = (EDGES, LOG_PROB_THRESHOLDS, RATIO_CAP, SHIFT_TOL)
        args = (old[t0:t1], rollout[t0:t1], *rows, flags, *constants, *sums, *bounds, out["shape"], block_ids, table)
        skipped.append(block_pass(*args))
    return out, table, skipped


def token_magnitude(old, rollout, mask, tokens) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Per id of the table, the sums of the terms' absolute values (the scale of a rounding tolerance)."""
    valid = np.ones(old.shape[0], dtype=bool) if mask is None else mask
    ids = tokens[valid]
    d = (old[valid] - rollout[valid]).astype(np.float64)
    k3, chi2, _ = small_explain.token_terms(d, np.float32(RATIO_CAP))
    inside = (ids >= 0) & (ids < TABLE)
    out = np.zeros((TABLE, 6))
    terms = np.stack([np.ones_like(d), np.abs(d), np.abs(d), np.abs(k3), np.abs(chi2), d * d], axis=1)
    np.add.at(out, ids[inside], terms[inside])
    return out


def assert_close(got: np.ndarray, want: np.ndarray, size: np.ndarray, rtol: np.ndarray | float, name: str) -> None:
    """NaN and inf where ``want`` has them; finite values within ``rtol`` of ``size`` (the terms' magnitudes)."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    infinite = np.isinf(want)
    assert np.array_equal(got[infinite], want[infinite]), name
    finite = np.isfinite(want)
    rtol = np.broadcast_to(rtol, want.shape)
    assert (np.abs(got[finite] - want[finite]) <= rtol[finite] * size[finite] + 1e-300).all(), name


def assert_twin_is_the_kernel(data, tokens, cuts=()) -> None:  # type: ignore[no-untyped-def]
    """The twin's sums against the definitions (as the kernel is held) and against the kernel itself: counts and
    skipped ids exactly, sums within 1e-12 of their terms' magnitudes (the capped IS ratio: 1e-6, float32)."""
    old, rollout, mask, lengths = data
    got, got_table, got_skipped = fold(small_explain.explain_block, old, rollout, mask, lengths, tokens, cuts)
    want, want_table, want_skipped = fold(explain.explain_block, old, rollout, mask, lengths, tokens, cuts)
    assert_sums_match(got, old, rollout, mask, lengths)
    assert got_skipped == want_skipped
    from explain_sums_reference import reference

    size = reference(old, rollout, mask, lengths, magnitude=True)
    for name in NAMES:
        rtol = np.full(want[name].shape, 1e-12)
        if name == "offset":
            rtol[..., 1] = 1e-6
        if name == "shape":
            rtol[SHAPE_RATIO] = 1e-6
        assert_close(got[name], want[name], size[name], rtol, name)
    if tokens.shape[0]:
        assert np.array_equal(got_table[:, 0], want_table[:, 0])
        assert_close(got_table, want_table, token_magnitude(old, rollout, mask, tokens), 1e-12, "tokens")
    else:
        assert not got_table.any()


@settings(max_examples=150, deadline=None)
@given(
    data=blocks(),
    cuts=st.lists(st.integers(0, 10), max_size=4),
    ids=st.sampled_from([None, np.int32, np.int64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_twin_is_the_definitions_and_the_kernel_in_any_blocks(data, cuts, ids, seed) -> None:  # type: ignore[no-untyped-def]
    old = data[0]
    rng = np.random.default_rng(seed)
    tokens = np.zeros(0, np.int64) if ids is None else rng.integers(-3, 70, old.shape[0]).astype(ids)
    assert_twin_is_the_kernel(data, tokens, [c for c in cuts if 0 < c < len(data[3])])


@st.composite
def edge_blocks(draw):  # type: ignore[no-untyped-def]
    """``blocks`` with a share of their values moved onto the edges: rollout log-probs on the probability buckets'
    thresholds and a float32 step below, old log-probs on the unlikely and likely thresholds, log-ratios on the series
    cut-off (``SMALL``) and a step either side, on the clamp and beyond float32's exp."""
    old, rollout, mask, lengths = draw(blocks())
    old, rollout = old.copy(), rollout.copy()
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = old.shape[0]
    down = np.float32(-np.inf)
    on_prob = [*LOG_PROB_THRESHOLDS, *np.nextafter(LOG_PROB_THRESHOLDS, down)]
    small = np.float32(SMALL)
    shifts = [small, -small, np.nextafter(small, down), np.nextafter(small, np.float32(1)), 20.0, -20.0, 88.8, 0.0]
    share = draw(st.sampled_from([0.1, 0.5]))
    for values, choices in ((rollout, on_prob), (old, [np.float32(LOG_UNLIKELY), np.float32(LOG_LIKELY)])):
        chosen = rng.random(n) < share
        values[chosen] = rng.choice(np.asarray(choices, dtype=np.float32), int(chosen.sum()))
    chosen = rng.random(n) < share
    old[chosen] = rollout[chosen] + rng.choice(np.asarray(shifts, dtype=np.float32), int(chosen.sum()))
    return old, rollout, mask, lengths


@settings(max_examples=100, deadline=None)
@given(data=edge_blocks(), seed=st.integers(0, 2**32 - 1))
def test_the_twin_is_the_kernel_on_the_edges(data, seed: int) -> None:  # type: ignore[no-untyped-def]
    tokens = np.random.default_rng(seed).integers(-3, 70, data[0].shape[0]).astype(np.int32)
    assert_twin_is_the_kernel(data, tokens)


@settings(max_examples=50, deadline=None)
@given(data=blocks(), piece=st.integers(1, 400), seed=st.integers(0, 2**32 - 1))
def test_the_pieces_of_a_block_change_no_bit(data, piece: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    """The twin takes a block ``PIECE`` raw tokens (whole rows) at a time: any piece size gives the same bits."""
    old, rollout, mask, lengths = data
    tokens = np.random.default_rng(seed).integers(-3, 70, old.shape[0]).astype(np.int64)
    whole = fold(small_explain.explain_block, old, rollout, mask, lengths, tokens)
    with patch.object(small_explain, "PIECE", piece):
        pieces = fold(small_explain.explain_block, old, rollout, mask, lengths, tokens)
    for name in NAMES:
        assert np.array_equal(pieces[0][name], whole[0][name], equal_nan=True), name
    assert np.array_equal(pieces[1], whole[1], equal_nan=True) and sum(pieces[2]) == sum(whole[2])


def test_the_twin_on_edges_and_special_rows() -> None:
    """Empty, fully masked, one-token and long rows (positions across the 32, 64, 128 and 256 edges); rollout
    log-probs exactly on each probability bucket's threshold and one float32 step below; log-ratios on the series
    cut-off (``SMALL``) and a step either side, on the clamp (20), beyond float32's exp (88.72), infinite and NaN;
    old log-probs on the unlikely and likely thresholds and shifts on the tolerance."""
    down = np.float32(-np.inf)
    thresholds = [float(t) for t in LOG_PROB_THRESHOLDS]
    below = [float(np.nextafter(t, down)) for t in LOG_PROB_THRESHOLDS]
    small = np.float32(SMALL)
    cut = [float(v) for v in (small, np.nextafter(small, down), np.nextafter(small, np.float32(1)), -small)]
    ratios = [*cut, 20.0, -20.0, 20.5, 88.7, 88.8, 100.0, 1e-7, -1e-7]
    tol = float(np.float32(SHIFT_TOL))
    unlikely, likely = float(LOG_UNLIKELY), float(LOG_LIKELY)
    shape_old = [unlikely, likely, likely, likely, float(np.nextafter(np.float32(likely), down))]
    rows = [
        ([], []),
        ([-1.0, -2.0], [-1.0, -2.5]),
        ([-0.5] * len(thresholds + below), thresholds + below),
        ([-1.0 + r for r in ratios], [-1.0] * len(ratios)),
        (shape_old, [-3.0, likely + tol, likely - tol, likely, -1.0]),
        ([-np.inf, -1.0, -np.inf, np.nan, -0.5, 0.0], [-1.0, -np.inf, -np.inf, -0.5, np.nan, -100.0]),
        (list(-np.abs(np.linspace(0, 3, 300))), list(-np.abs(np.linspace(0, 3, 300)) - 0.01)),
        ([-0.2], [-0.1]),
    ]
    lengths = np.array([len(o) for o, _ in rows], dtype=np.int64)
    old = np.concatenate([np.asarray(o, dtype=np.float32) for o, _ in rows])
    rollout = np.concatenate([np.asarray(r, dtype=np.float32) for _, r in rows])
    tokens = (np.arange(old.shape[0]) % 80 - 5).astype(np.int32)
    n = old.shape[0]
    for mask in (None, np.arange(n) % 3 != 0, np.zeros(n, dtype=bool), np.arange(n) > 40):
        for cuts in ([], [1, 3, 5], [7]):
            assert_twin_is_the_kernel((old, rollout, mask, lengths), tokens, cuts)
            assert_twin_is_the_kernel((old, rollout, mask, lengths), np.zeros(0, np.int64), cuts)


@settings(max_examples=100, deadline=None)
@given(data=blocks())
def test_the_per_token_terms_are_the_kernels(data) -> None:  # type: ignore[no-untyped-def]
    """k3 and chi2 within a few ulps of e^d - 1 of the kernel's (numpy's ``expm1`` against ``expm1_reduced``), so
    k3 of a tiny log-ratio keeps its digits; the capped ratio's sum to float32 rounding."""
    old, rollout, _, _ = data
    k3, chi2 = np.empty(old.shape[0]), np.empty(old.shape[0])
    capped = explain._row_terms(old, rollout, k3, chi2, np.float32(RATIO_CAP), False)
    d = (old - rollout).astype(np.float64)
    got_k3, got_chi2, got_capped = small_explain.token_terms(d, np.float32(RATIO_CAP))
    em1 = np.abs(np.expm1(np.clip(d, -40, 90)))
    ulps = 2 * np.spacing(em1)  # e^d - 1: numpy's and the kernel's within two ulps; then one rounding
    slack = {"k3": ulps + np.spacing(np.abs(k3)), "chi2": 2 * ulps * (em1 + 1) + 2 * np.spacing(np.abs(chi2))}
    for name, got, want in (("k3", got_k3, k3), ("chi2", got_chi2, chi2)):
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want)), name
        finite = np.isfinite(want)
        assert (np.abs(got[finite] - want[finite]) <= slack[name][finite]).all(), name
    total = float(got_capped.sum())
    assert math.isclose(total, capped, rel_tol=1e-6) or (math.isnan(capped) and math.isnan(total))


@settings(max_examples=150, deadline=None)
@given(data=blocks(), ids=st.sampled_from([np.int32, np.int64]), rows=st.integers(0, 80), seed=st.integers(0, 2**32))
def test_the_by_token_pass_is_the_kernels(data, ids, rows: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    """``scatter_token_sums`` (the ids the explain pass left, a block folded on its own): the same ids added, the same
    count left, the sums to float64 rounding."""
    old, rollout, mask, _ = data
    tokens = np.random.default_rng(seed).integers(-3, 90, old.shape[0]).astype(ids)
    flags = np.zeros(0, np.uint8) if mask is None else mask.view(np.uint8)
    got, want = np.zeros((rows, 6)), np.zeros((rows, 6))
    left = small_explain.scatter_token_sums(old, rollout, tokens, flags, got)
    assert left == token_ids.scatter_token_sums(old, rollout, tokens, flags, want)
    assert np.array_equal(got[:, 0], want[:, 0])
    valid = np.ones(old.shape[0], dtype=bool) if mask is None else mask
    d = (old[valid] - rollout[valid]).astype(np.float64)
    k3, chi2, _ = small_explain.token_terms(d, np.float32(1.0))
    size = np.zeros((rows, 6))
    inside = (tokens[valid] >= 0) & (tokens[valid] < rows)
    terms = np.stack([np.ones_like(d), np.abs(d), np.abs(d), np.abs(k3), np.abs(chi2), d * d], axis=1)
    np.add.at(size, tokens[valid][inside], terms[inside])
    assert_close(got, want, size, 1e-12, "scatter")


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.parquet")))
def test_a_small_explain_report_is_the_kernels(sample: str) -> None:
    """Every sample dump's ``--explain`` report on the numpy path and on the kernels: the same findings, verdict,
    worst responses and ranked token ids, every count equal and every float within 1e-11 of the other."""
    path = SAMPLES / sample
    reports = [rcdiag.analyze(path, explain=True, device=NumpyBackend(compiled=c)).to_dict() for c in (True, False)]
    compiled, numpy = (flat(r) for r in reports)
    assert far_apart(compiled, numpy) == []
    kernel, twin = reports  # strings (messages, the verdict) and lists compared whole above; restated:
    assert twin["verdict"] == kernel["verdict"]
    codes = [[(f["code"], f["severity"]) for f in report["findings"]] for report in reports]
    assert codes[0] == codes[1]
    assert [w["row"] for w in twin["worst_sequences"]] == [w["row"] for w in kernel["worst_sequences"]]
    if sample == "stop_token.parquet":  # the sample with token ids: the same ids ranked, in the same order
        token, want = twin["breakdowns"]["token"], kernel["breakdowns"]["token"]
        assert token["ids"] == want["ids"] > 0
        for ranking in ("by_k3_share", "by_abs_log_ratio"):
            assert [e["id"] for e in token[ranking]] == [e["id"] for e in want[ranking]]


def test_a_small_explain_imports_no_numba(tmp_path: Path) -> None:
    """A real small ``analyze --explain`` with token ids, on a fresh machine (empty numba cache): no numba or llvmlite
    module loaded, nothing compiled or said, the by-token ranking in its JSON."""
    args = ("analyze", str(SAMPLES / "stop_token.parquet"), "--explain", "--format", "json")
    done, loaded = cli_modules(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert loaded == [] and done.stderr == ""
    assert not any((tmp_path / "numba_cache").rglob("*.nbi"))
    assert '"by_k3_share"' in done.stdout
