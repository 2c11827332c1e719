"""Seeded synthetic dumps with a realistic mismatch model, for samples, tests, docs and benchmarks.

Each token position gets "true" logits z over a small vocabulary. The rollout engine sees z + eps (its
numerical noise), samples the token from softmax((z + eps) / T_rollout), and reports that token's log-prob; the
trainer reports log_softmax(z / T_train) of the same token. Scenarios add the failure modes users hit:
a trainer that forgot the temperature, a rollout engine that renormalises over its top-k, rare large outliers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class Scenario:
    """How the two engines differ."""

    name: str
    description: str
    noise: float = 0.03
    """Std of the rollout engine's logit noise (bf16-like kernels: a few hundredths)."""
    t_rollout: float = 1.0
    t_train: float = 1.0
    top_k: int | None = None
    """Rollout log-probs renormalised over the top-k tokens (the trainer uses the full softmax)."""
    outlier_rate: float = 0.0
    outlier_noise: float = 2.0
    quantize_bits: int | None = None
    """Rollout logits rounded to 2^bits levels over each position's range (a weight-quantised rollout model)."""
    position_scale: float | None = None
    """Logit noise grows along the response: std x (1 + position / position_scale)."""
    step_growth: float = 1.0
    """Logit noise grows across training steps: std x step_growth^step."""


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", "both engines at T=1.0, small logit noise: kl ~ 1e-4, nothing to fix"),
        Scenario("healthy_t06", "both engines at T=0.6, small logit noise", t_rollout=0.6, t_train=0.6),
        Scenario(
            "train_forgot_temperature",
            "rollout samples at T=0.6 but the trainer computes log-probs at T=1.0",
            t_rollout=0.6,
        ),
        Scenario(
            "topk_offset",
            "rollout samples with top-k=8 and reports log-probs renormalised over those 8 tokens",
            top_k=8,
        ),
        Scenario(
            "outliers",
            "healthy, except 0.3% of tokens see large logit errors (a buggy kernel path)",
            outlier_rate=0.003,
            outlier_noise=4.0,
        ),
        Scenario(
            "rollout_temperature_only",
            "rollout samples and scores at T=0.7; the trainer scores at T=1.0 (temperature applied on one side only)",
            t_rollout=0.7,
        ),
        Scenario(
            "position_drift",
            "logit noise grows along the response, std 0.02 x (1 + position/64): precision lost with context",
            noise=0.02,
            position_scale=64.0,
        ),
        Scenario(
            "step_trend",
            "logit noise grows 1.5x per training step from std 0.02: mismatch that feeds on itself",
            noise=0.02,
            step_growth=1.5,
        ),
        Scenario(
            "quantized_4bit",
            "rollout logits rounded to 16 levels per position (a 4-bit rollout model) plus logit noise 0.03",
            quantize_bits=4,
        ),
    )
}


def generate(
    scenario: str | Scenario = "healthy",
    *,
    rows: int = 384,
    steps: int = 6,
    seed: int = 0,
    vocab: int = 48,
    median_length: int = 200,
    max_length: int = 2048,
    masked_span_rate: float = 0.2,
    empty_rows: int = 2,
) -> pa.Table:
    """A canonical dump: one row per response with ``old_log_prob``, ``rollout_log_prob``,
    ``response_mask`` and ``step``; run facts go into the schema metadata."""
    spec = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(median_length), 0.8, rows)), 8, max_length).astype(np.int64)
    if empty_rows:
        lengths[rng.choice(rows, size=min(empty_rows, rows), replace=False)] = 0
    total = int(lengths.sum())
    old = np.empty(total, dtype=np.float32)
    rollout = np.empty(total, dtype=np.float32)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    step = np.repeat(np.arange(steps, dtype=np.int64), -(-rows // steps))[:rows]
    scale = _noise_scale(spec, lengths, offsets, step)
    for start in range(0, total, 1 << 15):
        stop = min(start + (1 << 15), total)
        part = None if scale is None else scale[start:stop, None]
        old[start:stop], rollout[start:stop] = _token_logprobs(rng, stop - start, vocab, spec, part)
    mask = np.ones(total, dtype=np.int8)
    for row in np.flatnonzero((rng.random(rows) < masked_span_rate) & (lengths >= 8)):
        n = int(lengths[row])
        span = int(rng.integers(n // 10 + 1, n * 4 // 10 + 2))
        begin = int(offsets[row]) + int(rng.integers(0, n - span + 1))
        mask[begin : begin + span] = 0
    table = pa.table(
        {
            "old_log_prob": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(old)),
            "rollout_log_prob": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(rollout)),
            "response_mask": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(mask)),
            "step": pa.array(step),
        }
    )
    metadata = {
        "rcdiag.scenario": spec.name,
        "rcdiag.description": spec.description,
        "rcdiag.seed": str(seed),
        "temperature": str(spec.t_rollout),
        "train_temperature": str(spec.t_train),
    }
    if spec.top_k is not None:
        metadata["top_k"] = str(spec.top_k)
    return table.replace_schema_metadata(metadata)


def _noise_scale(spec: Scenario, lengths: np.ndarray, offsets: np.ndarray, step: np.ndarray) -> np.ndarray | None:
    """Per-token multiplier of the logit noise (``None``: constant noise)."""
    if spec.position_scale is None and spec.step_growth == 1.0:
        return None
    total = int(offsets[-1])
    scale = np.ones(total)
    if spec.position_scale is not None:
        scale *= 1.0 + (np.arange(total) - np.repeat(offsets[:-1], lengths)) / spec.position_scale
    if spec.step_growth != 1.0:
        scale *= np.repeat(spec.step_growth ** step.astype(np.float64), lengths)
    return scale


def _token_logprobs(
    rng: np.random.Generator, n: int, vocab: int, spec: Scenario, noise_scale: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    # Confident and uncertain positions: per-position logit scale, as in a language model.
    scale = rng.lognormal(np.log(2.5), 0.5, (n, 1))
    z = rng.standard_normal((n, vocab)) * scale
    noise = rng.standard_normal((n, vocab)) * spec.noise
    if noise_scale is not None:
        noise *= noise_scale
    if spec.outlier_rate:
        hit = rng.random(n) < spec.outlier_rate
        noise[hit] = rng.standard_normal((int(hit.sum()), vocab)) * spec.outlier_noise
    rollout_logits = z + noise
    if spec.quantize_bits is not None:
        low, high = rollout_logits.min(axis=1, keepdims=True), rollout_logits.max(axis=1, keepdims=True)
        grid = (high - low) / (2**spec.quantize_bits - 1)
        rollout_logits = low + np.rint((rollout_logits - low) / grid) * grid
    rollout_logits = rollout_logits / spec.t_rollout
    rollout_lp = _log_softmax(rollout_logits)
    if spec.top_k is not None:
        kth = np.partition(rollout_logits, vocab - spec.top_k, axis=1)[:, vocab - spec.top_k : vocab - spec.top_k + 1]
        kept = rollout_logits >= kth
        rollout_logits = np.where(kept, rollout_logits, -np.inf)
        rollout_lp = _log_softmax(rollout_logits)
    gumbel = -np.log(-np.log(rng.random((n, vocab))))
    token = np.argmax(rollout_logits + gumbel, axis=1)
    train_lp = _log_softmax(z / spec.t_train)
    rows = np.arange(n)
    return train_lp[rows, token].astype(np.float32), rollout_lp[rows, token].astype(np.float32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = np.max(x, axis=1, keepdims=True)
    shifted = x - top
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))


def write(table: pa.Table, path: str | Path, *, compression: str = "zstd", row_group_size: int | None = None) -> None:
    """Write a dump as Parquet (zstd by default)."""
    pq.write_table(table, str(path), compression=compression, row_group_size=row_group_size)


def with_overrides(scenario: str, **changes: Any) -> Scenario:
    """A named scenario with some fields changed (e.g. more noise)."""
    return replace(SCENARIOS[scenario], **changes)
