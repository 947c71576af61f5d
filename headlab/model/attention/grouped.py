"""MHA, GQA and MQA as one module: `kv_heads` K/V heads, each shared by n_head/kv_heads queries.

kv_heads = n_head is MHA, 1 is MQA, anything in between is GQA. The cache keeps the
un-repeated K/V heads (after RoPE and QK-norm): 2·kv_heads·d_h values per token.
"""

from __future__ import annotations

import torch
from torch import nn

from headlab.model.attention.common import AttentionCore, LayerCache, apply_rope
from headlab.model.config import ModelConfig


class GroupedQueryAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head, self.kv_heads, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.qk_norm = config.qk_norm
        self.c_q = nn.Linear(config.d_model, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(config.d_model, self.kv_heads * self.head_dim, bias=False)
        self.c_v = nn.Linear(config.d_model, self.kv_heads * self.head_dim, bias=False)
        self.c_proj = nn.Linear(self.n_head * self.head_dim, config.d_model, bias=False)
        self.core = AttentionCore()

    def rope_dim(self) -> int:
        return self.head_dim

    def cache_spec(self, mla_absorb: bool = True) -> dict[str, tuple[int, ...]]:
        return {"k": (self.kv_heads, self.head_dim), "v": (self.kv_heads, self.head_dim)}

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        """x (B, T, d_model) at positions [start, start + T); cos/sin cover all positions."""
        b, t, _ = x.shape
        start = cache.pos if cache is not None else 0
        cos, sin = cos[start:start + t], sin[start:start + t]
        q = self.c_q(x).view(b, t, self.n_head, self.head_dim)
        k = self.c_k(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.c_v(x).view(b, t, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin, self.qk_norm), apply_rope(k, cos, sin, self.qk_norm)
        if cache is not None:
            cached = cache.update(k=k, v=v)
            k, v = cached["k"], cached["v"]
        y = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=self.head_dim ** -0.5)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))
