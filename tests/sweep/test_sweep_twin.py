"""The sweep's array pass (``rcdiag.sweep.scan_arrays``) against its numba kernel (``rcdiag.kernels.sweep.scan``):
on random blocks, through a ``Block`` with a mask, on every sample dump's sweep report, and on torch tensors; and a
small dump's ``rcdiag sweep`` loads no numba."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from compiled_paths import far_apart, flat, without_numba_then_forced
from conftest import SAMPLES, padded_chunk, random_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from sweep_blocks import blocks
from token_sums_reference import raw_blocks, valid_per_row

from rcdiag.kernels.sweep import SUB_BLOCK, scan
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.block import Block
from rcdiag.sweep import scan_arrays, sweep, sweep_chunks
from rcdiag.sweep.cells import HISTOGRAM, HISTOGRAM_CLAMPED, NO_HISTOGRAM, Cells, Passes, uses_kernel
from rcdiag.sweep.collector import BUCKETS
from rcdiag.sweep.grid import build_grid

NAMES = ("n", "mean", "m2", "high", "low", "row_n", "row_sum", "row_high", "row_low", "row_total")


@pytest.fixture(autouse=True)
def _quiet():  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):  # inf - inf: NaN, on purpose
        yield


def test_the_sub_blocks_are_the_kernels() -> None:
    lengths = np.array([SUB_BLOCK - 1, 1, 0, 5, SUB_BLOCK + 3, 0, 2, 0], dtype=np.int64)
    assert scan_arrays.sub_blocks(lengths).tolist() == [0, 3, 4, 5, 8]
    assert scan_arrays.sub_blocks(np.zeros(0, dtype=np.int64)).tolist() == [0]


def _both(x: np.ndarray, lengths: np.ndarray, edges: list[float], extremes: bool, per_row: bool, mode: int) -> Any:
    cells = Cells(edges)
    kernel_hist, twin_hist = np.zeros(4 * BUCKETS, np.int64), np.zeros(4 * BUCKETS, np.int64)
    args = (cells.count, extremes, per_row, mode)
    want = scan(x, lengths, cells.table, cells.edges, *args, kernel_hist)
    got = scan_arrays.scan(None, x, lengths, cells.edges, *args, twin_hist, cells.table)
    compared_hist = np.zeros(4 * BUCKETS, np.int64)
    compared = scan_arrays.scan(None, x, lengths, cells.edges, *args, compared_hist)  # torch's way to the cells
    assert np.array_equal(compared_hist, twin_hist)
    for name, a, b in zip(NAMES, got, compared, strict=True):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name
    return dict(zip(NAMES, want, strict=True)), dict(zip(NAMES, got, strict=True)), kernel_hist, twin_hist


def _close(got: np.ndarray, want: np.ndarray, scale: np.ndarray | float = 0.0) -> bool:
    """Equal but for float64 rounding of the same sum taken in another order (``scale``: the sum of the terms'
    magnitudes, for sums that cancel)."""
    return bool(np.allclose(got, want, rtol=1e-12, atol=1e-13 * np.max(scale, initial=0.0), equal_nan=True))


def assert_twin(x: np.ndarray, lengths: np.ndarray, edges: list[float], extremes: bool, per_row: bool, mode: int):  # type: ignore[no-untyped-def]
    want, got, kernel_hist, twin_hist = _both(x, lengths, edges, extremes, per_row, mode)
    for name in NAMES:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
    assert np.array_equal(got["n"], want["n"]) and np.array_equal(got["row_n"], want["row_n"])
    assert np.array_equal(twin_hist, kernel_hist)  # every copy of every bucket
    for name in ("row_high", "row_low"):  # order keys: the same bits (signed zeros, NaN and empty rows included)
        assert np.array_equal(got[name].view(np.int32), want[name].view(np.int32)), name
    for name in ("high", "low"):  # the same values (a zero's sign may differ where 0.0 and -0.0 tie)
        assert np.array_equal(got[name], want[name], equal_nan=True), name
    magnitude = np.abs(x.astype(np.float64))
    finite = np.where(np.isfinite(magnitude), magnitude, 0.0)
    assert _close(got["mean"], want["mean"], finite.max(initial=0.0))
    assert _close(got["m2"], want["m2"], finite.max(initial=0.0) ** 2)
    assert _close(got["row_total"], want["row_total"], finite.sum())
    assert _close(got["row_sum"], want["row_sum"], finite.sum())


@settings(max_examples=300, deadline=None)
@given(
    blocks(),
    st.booleans(),
    st.booleans(),
    st.sampled_from([NO_HISTOGRAM, HISTOGRAM, HISTOGRAM_CLAMPED]),
    st.integers(0, 4),
    st.integers(0, 2**32 - 1),
)
def test_the_twin_is_the_kernel(block, extremes, per_row, mode, own, seed) -> None:  # type: ignore[no-untyped-def]
    """Random rows (empty ones too) of values near, on and one ulp beside the edges, NaN, infinities and signed
    zeros; edges from a fixed list plus ``own`` of the block's own values (thresholds exactly at tokens)."""
    x, lengths, edges = block
    values = x[np.isfinite(x)]
    if own and values.size:
        picked = np.random.default_rng(seed).choice(values, own).tolist()
        edges = sorted({*edges, *(float(v) for v in picked)})
    assert_twin(x, lengths, edges, extremes, per_row, mode)


@settings(max_examples=25, deadline=None)
@given(blocks(long=True), st.booleans(), st.sampled_from([NO_HISTOGRAM, HISTOGRAM, HISTOGRAM_CLAMPED]))
def test_the_twin_is_the_kernel_over_several_sub_blocks(block, per_row, mode) -> None:  # type: ignore[no-untyped-def]
    x, lengths, edges = block
    assert_twin(x, lengths, edges, True, per_row, mode)


def test_the_twin_at_the_edges_of_a_block() -> None:
    """No token, no row, one empty row, only NaN, one row longer than a sub-block."""
    empty = np.zeros(0, dtype=np.float32)
    assert_twin(empty, np.zeros(0, dtype=np.int64), [0.5], True, True, HISTOGRAM)
    assert_twin(empty, np.zeros(1, dtype=np.int64), [0.5], True, True, HISTOGRAM)
    assert_twin(np.full(3, np.nan, dtype=np.float32), np.array([3], dtype=np.int64), [], True, True, HISTOGRAM_CLAMPED)
    rng = np.random.default_rng(0)
    long = rng.normal(0, 1, SUB_BLOCK + 7).astype(np.float32)
    assert_twin(long, np.array([3, SUB_BLOCK, 4], dtype=np.int64), [-0.5, 0.0, 0.5], True, True, HISTOGRAM)


def _passes(block: Block, edges: dict[str, list[float]]) -> tuple[Passes, dict[str, np.ndarray]]:
    passes = Passes()
    hists = {}
    for statistic, cuts in edges.items():
        passes.cells[statistic] = Cells(cuts)
        hists[statistic] = np.zeros(4 * BUCKETS, np.int64)
        passes.histograms[statistic] = (HISTOGRAM_CLAMPED if statistic == "k3" else HISTOGRAM, hists[statistic])
    return passes, hists


@settings(max_examples=150, deadline=None)
@given(raw_blocks(), st.integers(0, 2**32 - 1))
def test_a_masked_block_takes_the_twin_on_the_numpy_path(block, seed) -> None:  # type: ignore[no-untyped-def]
    """Through ``Passes`` (the sweep's hook) on a ``Block`` with a mask and empty rows: the kernel on the compiled
    backend, the twin on the numpy path; the k statistics are the same bits on both paths (tests/engine/test_small_path.py),
    so each cell holds the same tokens, edges at the block's own values included."""
    old, rollout, mask, lengths = block
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    made = [Block(NumpyBackend(compiled=c), old, rollout, valid, mask=mask, raw_lengths=lengths) for c in (True, False)]
    assert uses_kernel(made[0].b) and not uses_kernel(made[1].b)
    rng = np.random.default_rng(seed)
    edges = {}
    for statistic in ("k1", "k2", "k3"):
        stat = made[0].statistic(statistic).stat
        finite = stat[np.isfinite(stat)]
        edges[statistic] = [float(v) for v in rng.choice(finite, min(3, finite.size))] + [0.1]
    (want_passes, want_hists), (got_passes, got_hists) = (_passes(b, edges) for b in made)
    want, got = want_passes.scans(made[0]), got_passes.scans(made[1])
    for statistic in edges:
        a, b = want[statistic].arrays, got[statistic].arrays
        assert np.array_equal(a.n, b.n), statistic
        assert np.array_equal(want_hists[statistic], got_hists[statistic]), statistic
        assert np.allclose(a.mean, b.mean, rtol=1e-12, atol=1e-300, equal_nan=True), statistic
        assert np.array_equal(want[statistic].row_max, got[statistic].row_max, equal_nan=True)
        assert np.array_equal(want[statistic].row_min, got[statistic].row_min, equal_nan=True)


COUNTED = ("masked_fraction", "fraction_high", "fraction_low", "oob_ratio", "_reject")
"""The sweep's metrics that are counts of tokens or rows over a count."""


def _sweep_json(path: Path, compiled: bool) -> dict[str, object]:
    return flat(sweep(path, device=NumpyBackend(compiled=compiled)).to_dict())


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.parquet")))
def test_every_sample_sweep_is_the_kernels(sample: str) -> None:
    """The default sweep of every sample dump on the twin and on the kernel: every count (the masked and
    out-of-band fractions of tokens and rows at every threshold, the recommendations from the histogram) equal,
    every float within 1e-11 (measured: 6.3e-13 at worst)."""
    want, got = _sweep_json(SAMPLES / sample, True), _sweep_json(SAMPLES / sample, False)
    assert got.keys() == want.keys()
    assert far_apart(want, got) == []
    counted = [k for k in want if k.endswith(COUNTED) or k.startswith(".recommendations")]
    assert len(counted) > 100
    assert [got[k] for k in counted] == [want[k] for k in counted]  # counts over counts: exactly


def test_a_small_sweep_imports_no_numba(tmp_path: Path) -> None:
    """A fresh machine (empty numba cache): a small dump's sweep loads no numba or llvmlite module, says nothing
    about compiling and writes no kernel cache; forced to the kernels it does all three, and prints the same
    counts."""
    done, forced = without_numba_then_forced(tmp_path, "sweep", str(SAMPLES / "healthy.parquet"), "--format", "json")
    counts = [line for line in done.stdout.splitlines() if "masked_fraction" in line]
    assert len(counts) > 100
    assert counts == [line for line in forced.stdout.splitlines() if "masked_fraction" in line]


# ------------------------------------------------------------------------------------------------------ torch


@settings(max_examples=60, deadline=None)
@given(blocks(), st.booleans(), st.sampled_from([NO_HISTOGRAM, HISTOGRAM, HISTOGRAM_CLAMPED]))
def test_the_cuda_paths_code_on_cpu_tensors_is_the_numpy_twin(block, per_row, mode) -> None:  # type: ignore[no-untyped-def]
    """The twin on torch tensors (``--device cuda``'s code, here on a CPU device) gives the numpy twin's results:
    counts, histograms and extremes equal, sums to float64 rounding."""
    pytest.importorskip("torch")
    from rcdiag.metrics.backend import TorchBackend

    x, lengths, edges = block
    backend = TorchBackend("cpu")
    assert not uses_kernel(backend)
    cells = Cells(edges)
    hists = np.zeros(4 * BUCKETS, np.int64), np.zeros(4 * BUCKETS, np.int64)
    args = (lengths, cells.edges, cells.count, True, per_row, mode)
    want = dict(zip(NAMES, scan_arrays.scan(None, x, *args, hists[0]), strict=True))
    got = dict(zip(NAMES, scan_arrays.scan(backend, backend.asarray(x), *args, hists[1]), strict=True))
    assert np.array_equal(hists[0], hists[1])
    for name in NAMES:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        if name in ("n", "row_n", "high", "low", "row_high", "row_low"):
            assert np.array_equal(got[name], want[name], equal_nan=True), name
    finite = np.abs(x[np.isfinite(x)].astype(np.float64))
    for name in ("mean", "m2", "row_sum", "row_total"):
        assert _close(got[name], want[name], finite.sum() * max(1.0, finite.max(initial=0.0))), name


def test_the_torch_sweep_keeps_its_tokens_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep on a torch backend brings no per-token array to the host (issue 20: it copied each block's statistics
    for the kernel): only per-row and per-cell arrays and the histograms' fixed-size counts."""
    torch = pytest.importorskip("torch")
    from rcdiag.metrics.backend import TorchBackend

    rng = np.random.default_rng(3)
    old, rollout, mask = random_batch(rng, rows=24, width=1000, noise=0.05, empty_rows=2, outliers=0.01)
    tokens = int(mask.sum())
    copied: list[int] = []
    cpu = torch.Tensor.cpu

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        copied.append(int(self.numel()))
        return cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", spy)
    grid = build_grid(["token", "sequence"], ["token_k1", "token_k3", "seq_max_k3"])
    report = sweep_chunks([padded_chunk(old, rollout, mask)], grid, device=TorchBackend("cpu"))
    assert report.rows and copied and tokens > 1000
    per_token = [n for n in copied if n >= tokens and n != 4 * BUCKETS]
    assert per_token == []
