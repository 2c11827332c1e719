"""The two engines of an RL step over the tiny model: a rollout engine that samples, and a trainer that scores.

The rollout engine samples token by token against a key-value cache, in its own dtype and weights, and reports
the log-prob of each sampled token under the distribution it actually sampled from (after temperature, top-k /
top-p renormalisation and any spike), as vLLM does. The trainer scores the same tokens teacher-forced, in one
full forward pass, in float32, at temperature 1 with no truncation (``old_log_prob``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .model import TinyLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INT4_GROUP = 32
SCORE_ROWS = 64


@dataclass(frozen=True)
class Rollout:
    """How the rollout engine differs from the trainer (all defaults: it does not)."""

    dtype: str = "fp32"
    """Weights and activations: fp32, bf16 or fp16 (log-probs are taken in float32 from its logits)."""
    int4: bool = False
    """Weights of every linear layer but the LM head fake-quantised to 4 bits, groups of 32 (as GPTQ/AWQ do)."""
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    rope_dtype: str = "fp32"
    """The dtype the rotary angles (position x inverse frequency) are computed in."""
    spike_rate: float = 0.0
    """Chance per sampled token that the rollout's logits get a large random perturbation (a routing flip)."""
    spike_scale: float = 0.0
    """Standard deviation (nats) of that perturbation, per vocabulary entry."""
    drift: float = 0.0
    """Weight gap at step s: s x drift x a fixed random direction (scaled per tensor by its mean |weight|)."""


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """Symmetric 4-bit fake quantisation per group of ``group`` input columns (levels -8..7, absmax / 7 scale)."""
    out_features, in_features = weight.shape
    w = weight.reshape(out_features, in_features // group, group)
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 7.0
    return ((w / scale).round().clamp(-8, 7) * scale).reshape(out_features, in_features)


def drifted(model: TinyLM, amount: float, seed: int = 1234) -> TinyLM:
    """``model`` moved by ``amount`` along a fixed random direction (each tensor scaled by its mean |weight|)."""
    if amount == 0.0:
        return model
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in moved.parameters():
            direction = torch.randn(parameter.shape, generator=generator)
            parameter.add_(amount * parameter.abs().mean() * direction)
    return moved


def rollout_model(model: TinyLM, spec: Rollout, step: int) -> TinyLM:
    """The rollout engine's copy of the weights at ``step``."""
    engine = copy.deepcopy(drifted(model, spec.drift * step))
    if spec.int4:
        with torch.no_grad():
            for block in engine.blocks:
                for layer in (block.qkv, block.proj, block.up, block.down):
                    layer.weight.copy_(quantize_int4(layer.weight))
    return engine.to(DTYPES[spec.dtype]).eval()


def sampling_log_probs(logits: torch.Tensor, spec: Rollout) -> torch.Tensor:
    """Log-probs (float32) of the distribution the engine samples from: temperature, then top-k, then top-p, each
    truncation renormalised over the kept set (dropped entries are -inf)."""
    scores = logits.float() / spec.temperature
    if spec.top_k is not None and spec.top_k < scores.shape[-1]:
        kth = scores.topk(spec.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    log_probs = scores.log_softmax(-1)
    if spec.top_p is not None and spec.top_p < 1.0:
        ordered, index = log_probs.sort(dim=-1, descending=True)
        before = ordered.exp().cumsum(-1) - ordered.exp()  # mass strictly above each entry
        drop = before >= spec.top_p  # keep the smallest prefix whose mass reaches top_p
        log_probs = log_probs.masked_fill(drop.scatter(-1, index, drop), float("-inf")).log_softmax(-1)
    return log_probs


@torch.no_grad()
def sample(
    engine: TinyLM, prompts: torch.Tensor, lengths: torch.Tensor, spec: Rollout, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``lengths[i]`` tokens after each prompt (rows sorted by length, longest first); returns the tokens
    and the engine's log-prob of each, both (rows, max length), zero past a row's length."""
    rows, prompt_len = prompts.shape
    width = int(lengths.max())
    assert bool((lengths[:-1] >= lengths[1:]).all()), "rows must come longest first"
    tokens = torch.zeros(rows, width, dtype=torch.long)
    log_probs = torch.zeros(rows, width, dtype=torch.float32)
    rope = DTYPES[spec.rope_dtype]
    caches: list[list] = [[] for _ in engine.blocks]
    logits = engine(prompts, 0, caches, rope)[:, -1]
    for t in range(width):
        active = int((lengths > t).sum())
        if active < logits.shape[0]:  # finished rows leave the batch (they are the last ones)
            logits = logits[:active]
            for cache in caches:
                cache[:] = [kv[:active] for kv in cache]
        scores = logits.float()
        if spec.spike_rate > 0.0:
            hit = torch.rand(active, 1, generator=generator) < spec.spike_rate
            noise = torch.randn(scores.shape, generator=generator) * spec.spike_scale
            scores = scores + hit * noise
        lp = sampling_log_probs(scores, spec)
        token = torch.multinomial(lp.exp(), 1, generator=generator)
        tokens[:active, t] = token[:, 0]
        log_probs[:active, t] = lp.gather(1, token)[:, 0]
        if t + 1 < width:
            logits = engine(token, prompt_len + t, caches, rope)[:, -1]
    return tokens, log_probs


@torch.no_grad()
def score(trainer: TinyLM, prompts: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The trainer's float32 log-probs of ``tokens`` after ``prompts``, teacher-forced: one full forward pass per
    block of rows (rows sorted longest first, each block cut at its longest row, so padding costs little)."""
    out = torch.zeros(tokens.shape, dtype=torch.float32)
    for first in range(0, tokens.shape[0], SCORE_ROWS):
        rows = slice(first, first + SCORE_ROWS)
        width = int(lengths[rows].max())
        sequence = torch.cat([prompts[rows], tokens[rows, :width]], dim=1)
        logits = trainer(sequence[:, :-1])[:, prompts.shape[1] - 1 :].float()
        out[rows, :width] = logits.log_softmax(-1).gather(2, tokens[rows, :width, None])[..., 0]
    return out
