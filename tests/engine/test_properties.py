"""Invariants: chunk size, block size, row order, padding, step grouping, merging and device never change a
metric beyond float tolerance."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import padded_chunk, ragged_lists, random_batch, write_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.engine.stream import Engine
from rcdiag.io import Chunk

CONFIG = rcdiag.CorrectionConfig(
    rollout_is="sequence",
    rollout_is_batch_normalize=True,
    rollout_rs="token_k1,seq_mean_k3,seq_max_k2,seq_sum_k1",
    rollout_rs_threshold="0.6_1.5,0.01,0.5,0.3_3.0",
)
TOKEN_IS = rcdiag.CorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_3.0")
OLDER = (  # the releases' variation points (raw-weight IS metrics, clamped-mean seq fractions)
    CONFIG.replace(verl_version="0.7.1"),
    rcdiag.CorrectionConfig(rollout_is="token", rollout_is_threshold=1.5, verl_version="0.7.1"),
    TOKEN_IS.replace(verl_version="0.8.0"),
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def close(a: dict, b: dict, rel: float = 1e-9, abs_tol: float = 1e-12) -> None:
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        if x is None or y is None:
            assert x is None and y is None, key
        else:
            assert math.isclose(x, y, rel_tol=rel, abs_tol=abs_tol), (key, x, y)


def ragged_chunks(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, cuts: list[int]) -> list[Chunk]:
    """Split a padded batch into chunks of whole rows at the given row cuts (padding kept, mask 0)."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < old.shape[0]}), old.shape[0]]
    return [padded_chunk(old[a:b], rollout[a:b], mask[a:b]) for a, b in itertools.pairwise(bounds)]


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(0, 30), max_size=6),
    config=st.sampled_from([CONFIG, TOKEN_IS, *OLDER]),
)
def test_chunking_and_row_order_do_not_matter(seed: int, cuts: list[int], config: rcdiag.CorrectionConfig) -> None:
    rng = np.random.default_rng(seed)
    old, rollout, mask = random_batch(rng, rows=30, width=25, noise=0.3, empty_rows=3, outliers=0.02)
    whole = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config)
    chunked = rcdiag.analyze_chunks(ragged_chunks(old, rollout, mask, cuts), config)
    close(whole.metrics, chunked.metrics)
    close(whole.extras, chunked.extras)
    order = rng.permutation(old.shape[0])
    shuffled = rcdiag.analyze_chunks([padded_chunk(old[order], rollout[order], mask[order])], config)
    close(whole.metrics, shuffled.metrics)


@SETTINGS
@given(seed=st.integers(0, 10_000), extra=st.integers(1, 9), garbage=st.sampled_from([0.0, -5.0, np.nan, np.inf]))
def test_padding_with_mask_zero_changes_nothing(seed: int, extra: int, garbage: float) -> None:
    rng = np.random.default_rng(seed)
    old, rollout, mask = random_batch(rng, rows=12, width=16, noise=0.2)
    base = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], CONFIG)
    pad = np.full((old.shape[0], extra), garbage, np.float32)
    padded = rcdiag.analyze_chunks(
        [
            padded_chunk(
                np.hstack([old, pad]),
                np.hstack([rollout, pad]),
                np.hstack([mask, np.zeros((old.shape[0], extra), np.int64)]),
            )
        ],
        CONFIG,
    )
    close(base.metrics, padded.metrics)
    assert padded.input.valid_tokens == base.input.valid_tokens
    assert padded.input.tokens == base.input.tokens + extra * old.shape[0]


@pytest.mark.parametrize("block_tokens", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("extreme", [False, True])
def test_block_size_does_not_matter(block_tokens: int, extreme: bool) -> None:
    """Also with log-ratios beyond verl's clamp and -inf log-probs in some rows: the way a row's sums are
    taken depends on the row alone, never on the block it falls in."""
    rng = np.random.default_rng(3)
    old, rollout, mask = random_batch(rng, rows=40, width=30, noise=0.5, empty_rows=4)
    if extreme:
        rollout[3, :4] = old[3, :4] - 30.0
        old[11, 2] = -np.inf
        rollout[17, 5] = -np.inf
    chunk = padded_chunk(old, rollout, mask)
    reference = Engine(CONFIG.resolve()).run([chunk]).pooled().compute()
    engine = Engine(CONFIG.resolve())
    engine.block_tokens = block_tokens
    close(engine.run([chunk]).pooled().compute().metrics, reference.metrics)


def test_steps_are_batches_and_pooled_is_all_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    old, rollout, mask = random_batch(rng, rows=36, width=20, noise=0.3, empty_rows=2)
    steps = np.array([7, 7, 3, 3, 3, 9] * 6)  # interleaved: rows of a step are not contiguous
    with_steps = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask, steps=steps)], CONFIG)
    assert [s.step for s in with_steps.steps] == [3, 7, 9]
    for step in with_steps.steps:
        rows = steps == step.step
        alone = rcdiag.analyze_chunks([padded_chunk(old[rows], rollout[rows], mask[rows])], CONFIG)
        close(step.metrics, alone.metrics)
        assert step.rows == int(rows.sum())
    no_steps = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], CONFIG)
    close(with_steps.metrics, no_steps.metrics)
    assert with_steps.input.steps == 3 and no_steps.input.steps == 0


def test_merge_of_states_equals_one_run() -> None:
    rng = np.random.default_rng(12)
    old, rollout, mask = random_batch(rng, rows=30, width=20, noise=0.3, empty_rows=2)
    steps = np.repeat([0, 1, 2], 10)
    chunk = padded_chunk(old, rollout, mask, steps=steps)
    one = Engine(CONFIG.resolve()).run([chunk])
    first = Engine(CONFIG.resolve()).run([padded_chunk(old[:13], rollout[:13], mask[:13], steps=steps[:13])])
    second = Engine(CONFIG.resolve()).run([padded_chunk(old[13:], rollout[13:], mask[13:], steps=steps[13:])])
    merged = first.merge(second)
    for step in (0, 1, 2):
        close(merged.batches[step].compute().metrics, one.batches[step].compute().metrics)
    close(merged.pooled().compute().metrics, one.pooled().compute().metrics)
    # merging must not be a no-op: the second half alone differs
    assert second.pooled().compute().metrics != one.pooled().compute().metrics


def test_merge_refuses_a_different_config() -> None:
    a = Engine(CONFIG.resolve()).state
    b = Engine(TOKEN_IS.resolve()).state
    with pytest.raises(ValueError, match="different configurations"):
        a.merge(b)


@pytest.mark.parametrize("chunk_tokens", [1, 50, 333, 1 << 20])
def test_reader_chunk_size_does_not_matter(tmp_path: Path, chunk_tokens: int) -> None:
    rng = np.random.default_rng(4)
    old, rollout, mask = random_batch(rng, rows=50, width=30, noise=0.3, empty_rows=3)
    columns = ragged_lists(old, rollout, mask)
    columns["step"] = [i // 20 for i in range(50)]
    path = write_dump(tmp_path / "d.parquet", columns)
    reference = rcdiag.analyze(path, CONFIG)
    report = rcdiag.analyze(path, CONFIG, chunk_tokens=chunk_tokens)
    close(report.metrics, reference.metrics)
    for a, b in zip(report.steps, reference.steps, strict=True):
        close(a.metrics, b.metrics)


def test_torch_backend_matches_numpy() -> None:
    pytest.importorskip("torch")
    from rcdiag.metrics.backend import TorchBackend

    rng = np.random.default_rng(21)
    old, rollout, mask = random_batch(rng, rows=40, width=30, noise=0.4, empty_rows=3, outliers=0.02)
    for config in (CONFIG, TOKEN_IS, rcdiag.CorrectionConfig(), *OLDER):
        cpu = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config)
        torch_cpu = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config, device=TorchBackend("cpu"))
        close(cpu.metrics, torch_cpu.metrics, rel=1e-5, abs_tol=1e-7)
        close(cpu.extras, torch_cpu.extras, rel=1e-5, abs_tol=1e-7)


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(22)
    old, rollout, mask = random_batch(rng, rows=64, width=50, noise=0.4, empty_rows=3, outliers=0.02)
    for config in (CONFIG, TOKEN_IS, rcdiag.CorrectionConfig(), *OLDER):
        cpu = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config)
        gpu = rcdiag.analyze_chunks([padded_chunk(old, rollout, mask)], config, device="cuda")
        close(cpu.metrics, gpu.metrics, rel=1e-5, abs_tol=1e-7)
