"""The log-ratio histogram: counts checked by brute force, independent of chunking, merging, saving and device."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import padded_chunk, random_batch, write_dump
from hypothesis import given, settings
from hypothesis import strategies as st
from token_sums_reference import brute_force

import rcdiag
from rcdiag.metrics.histogram import EDGES, LogRatioHistogram


def test_edges_are_symmetric_logarithmic_and_float32() -> None:
    magnitudes = EDGES[EDGES > 0]
    assert np.array_equal(-magnitudes[::-1], EDGES[EDGES < 0])
    assert math.isclose(magnitudes[0], 1e-6, rel_tol=1e-7) and math.isclose(magnitudes[-1], 100.0)
    assert np.allclose(np.diff(np.log10(magnitudes)), 0.2, atol=1e-6)  # 5 bins a decade
    assert np.array_equal(EDGES.astype(np.float32).astype(np.float64), EDGES)


def test_counts_match_a_brute_force_count_on_edges_and_extremes() -> None:
    edge_values = EDGES.astype(np.float32)
    special = np.array([0.0, -0.0, 1e-9, -1e-9, 150.0, -150.0, np.inf, -np.inf], dtype=np.float32)
    below = np.nextafter(edge_values, np.float32(-np.inf))
    values = np.concatenate([edge_values, below, special]).astype(np.float32)
    old = np.minimum(values, 0)[None, :]  # a negative log-ratio v is old = v, rollout = 0; a positive one 0, -v
    rollout = np.minimum(-values, 0)[None, :]
    assert np.array_equal(old - rollout, values[None, :])
    report = rcdiag.analyze_chunks([padded_chunk(old, rollout, np.ones((1, values.size), bool))])
    assert report.log_ratio is not None
    assert list(report.log_ratio.counts) == brute_force(values)
    assert report.log_ratio.nan == 0
    assert sum(report.log_ratio.counts) == report.input.valid_tokens


def test_nan_log_ratio_from_minus_inf_on_both_sides_is_counted_outside_the_bins() -> None:
    old = np.array([[-np.inf, -1.0, -2.0]], dtype=np.float32)
    rollout = np.array([[-np.inf, -1.0, -2.5]], dtype=np.float32)
    report = rcdiag.analyze_chunks([padded_chunk(old, rollout, np.ones((1, 3), bool))])
    assert report.log_ratio is not None
    assert report.log_ratio.nan == 1 and sum(report.log_ratio.counts) == 2


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), cut=st.integers(1, 29))
def test_chunking_and_merging_do_not_change_the_counts(seed: int, cut: int) -> None:
    rng = np.random.default_rng(seed)
    old, rollout, mask = random_batch(rng, rows=30, width=25, noise=0.3, empty_rows=3, outliers=0.05)
    whole = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)])
    parts = [padded_chunk(old[:cut], rollout[:cut], mask[:cut]), padded_chunk(old[cut:], rollout[cut:], mask[cut:])]
    chunked = rcdiag.analyze_chunks(parts)
    assert whole.log_ratio == chunked.log_ratio
    assert list(whole.log_ratio.counts) == brute_force((old - rollout)[mask.astype(bool)])  # type: ignore[union-attr]


def test_merge_adds_counts_and_the_state_round_trips() -> None:
    a, b = LogRatioHistogram(), LogRatioHistogram()
    a.add(counts=np.arange(LogRatioHistogram.BINS), nan=1)
    b.add(counts=np.ones(LogRatioHistogram.BINS, dtype=np.int64), nan=2)
    a.merge(b)
    assert a.counts.tolist() == [i + 1 for i in range(LogRatioHistogram.BINS)] and a.state["nan"] == 3
    assert b.counts.tolist() == [1] * LogRatioHistogram.BINS  # merging never aliases the other's array
    restored = LogRatioHistogram()
    restored.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert restored.counts.dtype == np.int64 and restored.counts.tolist() == a.counts.tolist()
    with pytest.raises(ValueError, match=f"must hold {LogRatioHistogram.BINS} values, holds 2"):
        restored.load_state_dict({"counts": [1, 2], "nan": 0})


def dump(path: Path, old: np.ndarray, rollout: np.ndarray, mask: np.ndarray) -> Path:
    columns = {"old_log_prob": old.tolist(), "rollout_log_probs": rollout.tolist(), "response_mask": mask.tolist()}
    return write_dump(path, columns)


def test_saved_states_merge_into_the_whole_dumps_histogram(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    old, rollout, mask = random_batch(rng, rows=40, width=20, noise=0.5, empty_rows=2, outliers=0.05)
    whole = dump(tmp_path / "whole.parquet", old, rollout, mask)
    first = dump(tmp_path / "a.parquet", old[:25], rollout[:25], mask[:25])
    second = dump(tmp_path / "b.parquet", old[25:], rollout[25:], mask[25:])
    rcdiag.analyze(first, save_state=tmp_path / "a.json")
    rcdiag.analyze(second, save_state=tmp_path / "b.json")
    merged = rcdiag.merge_states([tmp_path / "a.json", tmp_path / "b.json"])
    assert merged.log_ratio is not None
    assert merged.log_ratio.counts == rcdiag.analyze(whole).log_ratio.counts  # type: ignore[union-attr]


def edge_batch() -> list:
    """Random log-ratios plus every edge and its float32 neighbours: where float64 and float32 comparisons would
    disagree if the edges were not float32 numbers."""
    rng = np.random.default_rng(5)
    old, rollout, mask = random_batch(rng, rows=20, width=30, noise=1.0, empty_rows=1, outliers=0.1)
    edges = EDGES.astype(np.float32)
    values = np.concatenate([edges, np.nextafter(edges, np.float32(-np.inf)), np.nextafter(edges, np.float32(np.inf))])
    exact = (np.minimum(values, 0)[None, :], np.minimum(-values, 0)[None, :], np.ones((1, values.size), bool))
    return [padded_chunk(old, rollout, mask), padded_chunk(*exact)]


def test_torch_backend_bins_like_numpy() -> None:
    pytest.importorskip("torch")
    chunks = edge_batch()
    assert rcdiag.analyze_chunks(chunks).log_ratio == rcdiag.analyze_chunks(chunks, device="torch-cpu").log_ratio


@pytest.mark.gpu
def test_cuda_bins_like_numpy() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    chunks = edge_batch()
    assert rcdiag.analyze_chunks(chunks).log_ratio == rcdiag.analyze_chunks(chunks, device="cuda").log_ratio


def test_the_lookup_table_bins_every_float32_as_the_binary_search_does() -> None:
    """The numpy backend bins float32 values through a table of their top 16 bits (docs/performance.md); every
    bit pattern, the edges and their neighbours included, lands where ``searchsorted`` over the edges puts it."""
    from rcdiag.metrics.backend import NumpyBackend

    rng = np.random.default_rng(5)
    edges32 = EDGES.astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38], dtype=np.float32)
    neighbours = [np.nextafter(edges32, np.float32(side)) for side in (np.inf, -np.inf)]
    bits = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for x in (np.concatenate([edges32, *neighbours, special]), bits[~np.isnan(bits)], bits):
        with np.errstate(invalid="ignore"):  # signalling NaN payloads, cast to float64 by the binary search
            index = np.searchsorted(EDGES, x, side="right")
        expected = np.bincount(index, minlength=EDGES.shape[0] + 1)
        expected[-1] -= np.count_nonzero(np.isnan(x))
        assert NumpyBackend().bin_counts(x, EDGES).tolist() == expected.tolist()
