"""A tiny pre-norm transformer language model with rotary positions and a key-value cache.

The same module serves both engines: the trainer runs it teacher-forced over a whole sequence, the rollout engine
runs it one token at a time against its cache. ``rope_dtype`` is the dtype the rotary angles are computed in
(positions and inverse frequencies multiplied in it): float32 normally, bf16/fp16 to plant a position-dependent
error, as engines that build the angle table in the model's dtype do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    ffn: int = 256
    max_len: int = 320
    rope_base: float = 10000.0

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # computed in float32 and cast back, as inference engines and HF's Llama do
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * self.weight.float()).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple:
    """cos and sin of the rotary angles, shape (len, head_dim/2), float32; the angles themselves in ``dtype``."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.to(dtype)[:, None] * inv_freq.to(dtype)[None, :]
    angles = angles.float()
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, len, head_dim); rotates pairs (first half, second half)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads = c.heads
        self.max_len = c.max_len
        self.norm1 = RMSNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.proj = nn.Linear(c.d_model, c.d_model, bias=False)
        self.norm2 = RMSNorm(c.d_model)
        self.up = nn.Linear(c.d_model, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, cache: list | None
    ) -> torch.Tensor:
        batch, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        causal = True
        if cache is not None:  # [keys, values] buffers of max_len positions, filled up to start + length
            if not cache:
                shape = (batch, self.heads, self.max_len, d // self.heads)
                cache[:] = [k.new_zeros(shape), v.new_zeros(shape)]
            end = start + length
            cache[0][:, :, start:end], cache[1][:, :, start:end] = k, v
            k, v = cache[0][:, :, :end], cache[1][:, :, :end]
            causal = start == 0
        attn = functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, length, d))
        return x + self.down(functional.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(
        self,
        tokens: torch.Tensor,
        start: int = 0,
        caches: list[list] | None = None,
        rope_dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Logits (batch, len, vocab) in the model's dtype for ``tokens`` at positions ``start``..; with ``caches``
        (one list per block, empty at first) the keys and values are written there and all before attended to
        (a prefill at ``start`` 0 is causal; later calls must pass one token each)."""
        c = self.config
        positions = torch.arange(start, start + tokens.shape[1])
        cos, sin = rope_tables(positions, c.d_model // c.heads, c.rope_base, rope_dtype)
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, start, None if caches is None else caches[i])
        return self.head(self.norm(x))
