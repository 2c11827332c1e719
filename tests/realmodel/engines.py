"""The two engines of an RL step over the tiny model: a rollout engine that samples, and a trainer that scores.

The rollout engine samples token by token against a key-value cache, in its own dtype and weights, and reports
the log-prob of each sampled token under the distribution it actually sampled from (after temperature, top-k /
top-p renormalisation and any spike), as vLLM does; or, where it is set so (``logprob_mode``), the raw model's
log-prob (vLLM's ``raw_logprobs``) or the most likely token's. Logit processing on the rollout side (a repetition
penalty, soft-capping) and a float8 key-value cache are planted here too. The trainer scores the same tokens teacher-forced, in one
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
    stale: float = 0.0
    """A constant weight gap at every step (a policy one optimizer step behind), along the same direction."""
    logprob_mode: str = "processed"
    """What it reports: ``processed`` (the log-prob of the sampled token under the distribution sampled from),
    ``raw`` (the model's own log-softmax, before temperature, penalties and truncation: vLLM's raw mode) or ``top1``
    (the most likely token's processed log-prob, whichever token was sampled)."""
    repetition_penalty: float = 1.0
    """HF/vLLM-style: a token seen in the prompt or the response so far has its logit divided by this (if positive)
    or multiplied by it (if negative)."""
    softcap: float | None = None
    """Logits soft-capped to ``softcap * tanh(logits / softcap)`` before sampling (Gemma-style)."""
    kv_dtype: str = "same"
    """``same`` (the engine's dtype) or ``fp8``: keys and values stored in float8 e4m3 and read back."""


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
    engine = copy.deepcopy(drifted(model, spec.drift * step + spec.stale))
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


def processed_logits(logits: torch.Tensor, seen: torch.Tensor, spec: Rollout) -> torch.Tensor:
    """The logits after the rollout's logit processors (soft-capping, then the repetition penalty over ``seen``)."""
    scores = logits.float()
    if spec.softcap is not None:
        scores = spec.softcap * torch.tanh(scores / spec.softcap)
    if spec.repetition_penalty != 1.0:
        penalised = torch.where(scores > 0, scores / spec.repetition_penalty, scores * spec.repetition_penalty)
        scores = torch.where(seen, penalised, scores)
    return scores


class Fp8Cache:
    """A key or value buffer kept in float8 e4m3 (as an fp8 KV cache), read back in the engine's dtype."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.dtype = buffer.dtype
        self.data = buffer.to(torch.float8_e4m3fn)

    def __setitem__(self, index: object, value: torch.Tensor) -> None:
        self.data[index] = value.to(torch.float8_e4m3fn)

    def __getitem__(self, index: object) -> torch.Tensor:
        return self.data[index].to(self.dtype)


def _stored(caches: list[list], spec: Rollout) -> None:
    """Put each cache buffer into the rollout's KV-cache dtype (a no-op unless it is fp8)."""
    if spec.kv_dtype == "fp8":
        for cache in caches:
            cache[:] = [kv if isinstance(kv, Fp8Cache) else Fp8Cache(kv) for kv in cache]


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
    _stored(caches, spec)
    seen = torch.zeros(rows, logits.shape[-1], dtype=torch.bool)
    if spec.repetition_penalty != 1.0:
        seen.scatter_(1, prompts, True)
    for t in range(width):
        active = int((lengths > t).sum())
        if active < logits.shape[0]:  # finished rows leave the batch (they are the last ones)
            logits, seen = logits[:active], seen[:active]
            for cache in caches:
                cache[:] = [kv[:active] for kv in cache]
            _stored(caches, spec)
        scores = processed_logits(logits, seen, spec)
        if spec.spike_rate > 0.0:
            hit = torch.rand(active, 1, generator=generator) < spec.spike_rate
            noise = torch.randn(scores.shape, generator=generator) * spec.spike_scale
            scores = scores + hit * noise
        lp = sampling_log_probs(scores, spec)
        token = torch.multinomial(lp.exp(), 1, generator=generator)
        tokens[:active, t] = token[:, 0]
        if spec.logprob_mode == "raw":
            log_probs[:active, t] = logits.float().log_softmax(-1).gather(1, token)[:, 0]
        elif spec.logprob_mode == "top1":
            log_probs[:active, t] = lp.max(-1).values
        else:
            log_probs[:active, t] = lp.gather(1, token)[:, 0]
        if spec.repetition_penalty != 1.0:
            seen.scatter_(1, token, True)
        if t + 1 < width:
            logits = engine(token, prompt_len + t, caches, rope)[:, -1]
    return tokens, log_probs


@torch.no_grad()
def score(
    trainer: TinyLM,
    prompts: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    *,
    shift: int = 0,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's float32 log-probs of ``tokens`` after ``prompts``, teacher-forced: one full forward pass per
    block of rows (rows sorted longest first, each block cut at its longest row, so padding costs little); and its
    log-probs of the prompt's tokens after the first. ``shift`` 1 plants an alignment bug: the trainer's log-prob
    at position t is that of token t+1 (labels sliced one position off; at the last position, the most likely
    next token's); ``temperature`` divides the logits first (verl's trainer applies the rollout's temperature)."""
    out = torch.zeros(tokens.shape, dtype=torch.float32)
    prompt_len = prompts.shape[1]
    prompt_out = torch.zeros(prompts.shape[0], prompt_len - 1, dtype=torch.float32)
    for first in range(0, tokens.shape[0], SCORE_ROWS):
        rows = slice(first, first + SCORE_ROWS)
        width = int(lengths[rows].max())
        sequence = torch.cat([prompts[rows], tokens[rows, :width]], dim=1)
        logits = trainer(sequence if shift else sequence[:, :-1]).float()
        logits = (logits if temperature == 1.0 else logits / temperature).log_softmax(-1)
        prompt_out[rows] = logits[:, : prompt_len - 1].gather(2, prompts[rows, 1:, None])[..., 0]
        scored = logits[:, prompt_len - 1 : prompt_len - 1 + width].gather(2, tokens[rows, :width, None])[..., 0]
        if shift:
            after = logits[torch.arange(scored.shape[0]), prompt_len - 1 + lengths[rows]].max(-1).values
            scored = torch.cat([scored[:, 1:], scored[:, :1]], dim=1)
            scored[torch.arange(scored.shape[0]), lengths[rows] - 1] = after
        out[rows, :width] = scored
    return out, prompt_out
