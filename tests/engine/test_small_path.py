"""The small-dump path (``rcdiag.kernels.small``): below the threshold a run never imports numba, and it gives the
kernels' findings, verdict and RS decisions, its metrics within float64 rounding of theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from compiled_paths import far_apart, flat, without_numba_then_forced
from conftest import SAMPLES
from hypothesis import given, settings
from hypothesis import strategies as st
from token_sums_reference import assert_chi2_close, raw_blocks, same_or_close, valid_per_row

import rcdiag
from rcdiag.kernels import small
from rcdiag.kernels.small import SMALL_DUMP_BYTES, SWITCH, compiled_for
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.block import Block
from rcdiag.metrics.token_passes import CompiledPasses, NumpyPasses
from rcdiag.runtime.errors import SettingError

RS_IS = rcdiag.CorrectionConfig(
    rollout_is="token",
    rollout_is_threshold=2.0,
    rollout_rs="token_k1,token_k2,token_k3,seq_mean_k1,seq_max_k3",
    rollout_rs_threshold="0.5_2.0,0.02,0.01,0.999_1.001,0.05",
)
def test_a_small_analyze_imports_no_numba_and_compiles_nothing(tmp_path: Path) -> None:
    """A fresh machine (empty numba cache): a small dump's analyze loads no numba module, says nothing about
    compiling and writes no kernel cache; forced to the kernels (``RCDIAG_SMALL_DUMP_BYTES=0``) it does all three."""
    without_numba_then_forced(tmp_path, "analyze", str(SAMPLES / "healthy.parquet"), "--format", "json")


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.parquet")))
@pytest.mark.parametrize("config", [None, RS_IS], ids=["default", "is_rs"])
def test_the_small_path_gives_the_kernels_report(sample: str, config: rcdiag.CorrectionConfig | None) -> None:
    """Every sample dump, forced to the kernels and to the numpy path: the same findings and verdict, every count
    (RS masked tokens and rows included) equal, every float within 1e-11 of the other (measured: 4e-13 at worst,
    a sequence chi2 whose row sums are exponentiated)."""
    path = SAMPLES / sample
    compiled = flat(rcdiag.analyze(path, config, device=NumpyBackend(compiled=True)).to_dict())
    numpy = flat(rcdiag.analyze(path, config, device=NumpyBackend(compiled=False)).to_dict())
    assert far_apart(compiled, numpy) == []
    masked = [k for k in compiled if k.endswith(("masked_tokens", "masked_rows")) or "rollout_rs_masked" in k]
    assert config is None or masked


def _blocks(block: tuple, bands: tuple = ()) -> tuple[Block, Block]:
    old, rollout, mask, lengths = block
    valid = lengths if mask is None else valid_per_row(mask, lengths)
    compiled = Block(NumpyBackend(), old, rollout, valid, mask=mask, raw_lengths=lengths, k1_bands=bands)
    numpy = Block(NumpyBackend(compiled=False), old, rollout, valid, mask=mask, raw_lengths=lengths)
    assert isinstance(compiled.passes, CompiledPasses) and isinstance(numpy.passes, NumpyPasses)
    return compiled, numpy


@pytest.fixture(autouse=True)
def _quiet():  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):  # -inf - -inf: NaN, on purpose
        yield


@settings(max_examples=200, deadline=None)
@given(raw_blocks())
def test_the_numpy_token_sums_are_the_kernels(block) -> None:  # type: ignore[no-untyped-def]
    """The token pass's sums, counts and histogram: counts equal, sums to float64 rounding (k3 and e^|d| by the
    same series, so without the array path's float32 exp and cancelling expm1)."""
    compiled, numpy = (b.sums for b in _blocks(block))
    assert (compiled.nan, compiled.clamped) == (numpy.nan, numpy.clamped)
    assert compiled.log_ratio_counts.tolist() == numpy.log_ratio_counts.tolist()
    assert same_or_close(compiled.lr_min, numpy.lr_min, 0) and same_or_close(compiled.lr_max, numpy.lr_max, 0)
    assert np.allclose(compiled.row_sum_old, numpy.row_sum_old, rtol=1e-12, atol=0, equal_nan=True)
    for name in ("abs_sum", "exp_abs_sum", "k3_sum"):
        assert same_or_close(getattr(compiled, name), getattr(numpy, name)), name
    assert_chi2_close(compiled.chi2_sum, numpy.chi2_sum, 2 * numpy.abs_sum + abs(numpy.chi2_sum))


@settings(max_examples=300, deadline=None)
@given(raw_blocks(), st.sampled_from(["k1", "k2", "k3"]), st.integers(0, 2**32 - 1), st.booleans())
def test_decisions_at_the_bounds_are_the_kernels(block, estimator, seed, fused) -> None:  # type: ignore[no-untyped-def]
    """The statistic bit for bit (k3 too: the kernel's series in numpy), and a band whose bounds are the block's own
    statistic values (ties at both bounds) rejects the same tokens in the same rows, with the same strict counts."""
    compiled, numpy = _blocks(block)
    a, b = compiled.statistic(estimator), numpy.statistic(estimator)
    assert np.array_equal(a.stat, b.stat, equal_nan=True)
    values = a.stat[~np.isnan(a.stat)]
    if not values.size:
        return
    rng = np.random.default_rng(seed)
    lo, hi = sorted(float(x) for x in rng.choice(values, 2))
    if estimator == "k1" and fused:  # the bands the token pass takes while it reads the rows
        compiled, _ = _blocks(block, ((lo, hi),))
    got, want = numpy.band(estimator, lo, hi), compiled.band(estimator, lo, hi)
    assert (got.masked_tokens, got.above) == (want.masked_tokens, want.above)
    assert estimator != "k1" or got.below == want.below
    assert np.array_equal(got.rows_hit, want.rows_hit)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=20), st.integers(0, 2**32 - 1), st.booleans())
def test_the_numpy_forms_of_the_screen_kernels(lengths, seed, all_valid) -> None:  # type: ignore[no-untyped-def]
    from rcdiag.kernels.metric_pass import valid_lengths
    from rcdiag.kernels.token_ids import valid_range

    rng = np.random.default_rng(seed)
    lengths_arr = np.array(lengths, dtype=np.int64)
    n = int(lengths_arr.sum())
    mask = rng.random(n) < 0.7
    ids = rng.integers(-5, 1000, n).astype(np.int64)
    flags = np.zeros(0, dtype=np.uint8) if all_valid else mask.view(np.uint8)
    assert small.valid_range(ids, flags) == tuple(int(x) for x in valid_range(ids, flags))
    out = np.empty(lengths_arr.shape[0], dtype=np.int64)
    valid_lengths(mask, lengths_arr, out)
    assert small.valid_lengths(mask, lengths_arr).tolist() == out.tolist()


def test_the_choice_is_made_from_the_files_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SWITCH, raising=False)
    assert not compiled_for([1 << 20, 1 << 20])
    assert compiled_for([SMALL_DUMP_BYTES]) and compiled_for([SMALL_DUMP_BYTES // 2, SMALL_DUMP_BYTES // 2])
    assert compiled_for([100, None])  # a file of unknown size: the kernels
    monkeypatch.setenv(SWITCH, "0")
    assert compiled_for([1])
    monkeypatch.setenv(SWITCH, "1_000_000_000")
    assert not compiled_for([SMALL_DUMP_BYTES])
    monkeypatch.setenv(SWITCH, "small")
    with pytest.raises(SettingError, match=f"variable {SWITCH} must be a whole number of bytes, got 'small'"):
        compiled_for([1])


def test_a_bad_override_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, SWITCH: "lots"}
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLES / "healthy.parquet")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"rcdiag: error: the environment variable {SWITCH} must be a whole number of bytes, got 'lots'"
    ]


def test_worker_processes_take_the_runs_path(tmp_path: Path) -> None:
    """A small dump read by two worker processes gives what one process gives, to the bit: the parts take the
    path the run chose (the kernels' sums would differ in their last bits)."""
    from rcdiag.io import synthetic

    dump = tmp_path / "two_parts.parquet"
    synthetic.write(synthetic.generate("healthy", rows=200, seed=0), dump, row_group_size=100)
    one = rcdiag.analyze(dump).to_dict()
    two = rcdiag.analyze(dump, workers=2).to_dict()
    assert two == one
