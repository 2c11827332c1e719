"""Chunks built by hand (library use in a training loop): tensors are converted, integer masks select, and a
malformed chunk is one clear ``InputError``. Expected values come from the float64 reference (tests/reference.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import ROOT, assert_metrics_close, padded_chunk, random_batch
from reference import all_metrics

import rcdiag
from rcdiag.engine.stream import Engine
from rcdiag.io import Chunk

CONFIG = {"rollout_is": "token", "rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.5_2.0,0.01"}


def _batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return random_batch(np.random.default_rng(31), rows=12, width=20, noise=0.2, empty_rows=2, hole_rate=0.2)


def _engine_metrics(chunk: Chunk) -> dict:
    return Engine(rcdiag.CorrectionConfig(**CONFIG).resolve()).run([chunk]).pooled().compute().metrics


@pytest.mark.parametrize("screened", [False, True])
def test_an_integer_mask_given_to_the_engine_selects_tokens(screened: bool) -> None:
    """``old[mask]`` with a 0/1 integer mask would index positions 0 and 1; the engine must select instead."""
    old, rollout, mask = _batch()
    chunk = dataclasses.replace(padded_chunk(old, rollout, mask), mask=mask.reshape(-1), screened=screened)
    assert chunk.mask.dtype == np.int64
    assert_metrics_close(_engine_metrics(chunk), all_metrics(old, rollout, mask, **CONFIG), rel=2e-5, abs_tol=2e-6)


def test_a_bad_value_in_a_hand_built_chunk_names_chunk_row_and_column() -> None:
    old, rollout, mask = _batch()
    old[3, 0], mask[3, 0] = np.nan, 1
    with pytest.raises(rcdiag.InputError, match=r"^chunk, row 3, column 'old_log_prob': holds NaN"):
        _engine_metrics(padded_chunk(old, rollout, mask))
    good = padded_chunk(*_batch())
    with pytest.raises(rcdiag.InputError, match=r"^chunk 1, row 3, column 'old_log_prob': holds NaN"):
        rcdiag.analyze_chunks([good, padded_chunk(old, rollout, mask)])
    mask[3, 0] = 2
    with pytest.raises(rcdiag.InputError, match=r"row 3, column 'response_mask': holds the mask value 2"):
        _engine_metrics(dataclasses.replace(padded_chunk(old, rollout, mask), mask=mask.reshape(-1)))


def test_torch_tensors_are_accepted() -> None:
    torch = pytest.importorskip("torch")
    old, rollout, mask = _batch()
    expected = all_metrics(old, rollout, mask, **CONFIG)
    config = rcdiag.CorrectionConfig(**CONFIG)
    rows, width = old.shape
    flat = Chunk(
        old=torch.from_numpy(old).reshape(-1),
        rollout=torch.from_numpy(rollout).reshape(-1),
        offsets=torch.arange(rows + 1) * width,
        mask=torch.from_numpy(mask).reshape(-1),
    )
    padded = Chunk(
        old=torch.from_numpy(old), rollout=torch.from_numpy(rollout), mask=torch.from_numpy(mask) > 0, offsets=None
    )
    for chunk in (flat, padded):
        assert_metrics_close(rcdiag.analyze_chunks([chunk], config).metrics, expected, rel=2e-5, abs_tol=2e-6)
    # given to the engine directly, even marked as screened, tensors are converted and checked
    assert_metrics_close(_engine_metrics(dataclasses.replace(flat, screened=True)), expected, rel=2e-5, abs_tol=2e-6)
    # bfloat16 (numpy has no such type) and float64 tensors are converted; the values are the rounded ones
    half = Chunk(
        old=torch.from_numpy(old).bfloat16(), rollout=torch.from_numpy(rollout).double(), mask=None, offsets=None
    )
    rounded = torch.from_numpy(old).bfloat16().float().numpy()
    ones = np.ones_like(mask)
    got = rcdiag.analyze_chunks([half], config).metrics
    assert_metrics_close(got, all_metrics(rounded, rollout, ones, **CONFIG), rel=2e-5, abs_tol=2e-6)


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (Chunk(old=np.zeros(4), rollout=np.zeros(4), offsets=None), "chunk 0: has offsets=None: give offsets"),
        (
            Chunk(old=np.zeros(4), rollout=np.zeros(3), offsets=np.array([0, 4])),
            r"different lengths \(old 4, rollout 3\)",
        ),
        (Chunk(old=np.zeros(4), rollout=np.zeros(4), offsets=np.array([0, 4]), mask=np.ones(2)), "mask 2"),
        (Chunk(old=np.zeros(4), rollout=np.zeros(4), offsets=np.array([0, 3])), "offsets that do not cover the values"),
        (Chunk(old=np.zeros(4), rollout=np.zeros(4), offsets=np.array([0, 3, 2, 4])), "decreasing offsets"),
        (Chunk(old=np.zeros(4), rollout=np.zeros(4), offsets=np.array([0.0, 4.0])), "offsets that do not cover"),
        (Chunk(old=np.zeros(4, int), rollout=np.zeros(4), offsets=np.array([0, 4])), "must be floats"),
        (Chunk(old=np.zeros((2, 2, 1)), rollout=np.zeros(4), offsets=np.array([0, 4])), r"'old' has shape \(2, 2, 1\)"),
        (Chunk(old=np.zeros(4), rollout=np.zeros(4), offsets=np.array([0, 4]), steps=np.array([1, 2])), "'steps'"),
        ({"old": [-1.0]}, "chunk 0: is a dict, not an rcdiag.Chunk"),
    ],
)
def test_a_malformed_chunk_is_one_clear_input_error(chunk: Chunk, message: str) -> None:
    with pytest.raises(rcdiag.InputError, match=message):
        rcdiag.analyze_chunks([chunk])


def test_the_training_loop_example_in_the_docs_runs() -> None:
    pytest.importorskip("torch")
    page = (ROOT / "docs" / "index.md").read_text()
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "analyze_chunks" in block]
    namespace: dict = {}
    exec(compile(example, "docs/index.md", "exec"), namespace)
    old, rollout, mask = (namespace[k].numpy() for k in ("old_log_prob", "rollout_log_prob", "response_mask"))
    expected = all_metrics(old, rollout, mask, **rcdiag.preset("decoupled_token_is").to_dict())
    assert_metrics_close(namespace["report"].metrics, expected, rel=2e-5, abs_tol=2e-6)
