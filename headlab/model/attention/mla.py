"""Multi-head latent attention (MLA), as in DeepSeek-V2/V3.

    c_t   = RMSNorm(x_t W_dkv)                     shared latent, d_c          (wkv_a, kv_norm)
    k^R_t = RoPE(x_t W_kr)                         shared RoPE key, d_R        (wkv_a)
    k_h   = [c_t W^UK_h ; k^R_t],  v_h = c_t W^UV_h                          (wkv_b)
    q_h   = [q^C_h ; RoPE(q^R_h)]   from x, or from RMSNorm(x W_dq) when q_latent_dim > 0
    score = q_h·k_h / √(d_h + d_R)

With `qk_norm` (headlab's option, off in DeepSeek's layout) q^C_h, RoPE(q^R_h) and k^R_t each
get a parameter-free RMSNorm over their own width. These are the only parts a norm may touch:
the per-head no-RoPE key c_t W^UK_h never exists in the absorbed path, so it stays as it is
(its scale is held by the latent's RMSNorm); a norm of the query is applied before W^UK_h is
folded in, and k^R_t is normalised before it is cached, so absorbed and naive decode stay equal.

Two decode paths, chosen by the cache layout:
  * naive:    cache the decompressed k_h, v_h (H·(2·d_h + d_R) values per token);
  * absorbed: cache only c_t and k^R_t (d_c + d_R values per token). W^UK_h is folded into the
    query (q^C_h W^UKᵀ_h lives in latent space) and W^UV_h is applied after the softmax, so
    attention runs as one shared "latent head" of width d_c + d_R.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headlab.model.attention.common import AttentionCore, LayerCache, apply_rope
from headlab.model.config import ModelConfig
from headlab.model.ops import QK_NORM_EPS, RMSNorm, rms_norm

NORM_EPS = 1e-6


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, h, dh = config.d_model, config.n_head, config.head_dim
        self.n_head, self.head_dim = h, dh
        self.latent_dim, self.rope_head_dim = config.kv_latent_dim, config.rope_head_dim
        self.qk_norm = config.qk_norm
        q_width = h * (dh + self.rope_head_dim)
        if config.q_latent_dim:
            self.wq_a = nn.Linear(d, config.q_latent_dim, bias=False)
            self.q_norm = RMSNorm(config.q_latent_dim, eps=NORM_EPS, gain=config.norm_gains)
            self.wq_b = nn.Linear(config.q_latent_dim, q_width, bias=False)
        else:
            self.wq = nn.Linear(d, q_width, bias=False)
        self.wkv_a = nn.Linear(d, self.latent_dim + self.rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(self.latent_dim, eps=NORM_EPS, gain=config.norm_gains)
        self.wkv_b = nn.Linear(self.latent_dim, h * 2 * dh, bias=False)  # per head: [W^UK_h | W^UV_h]
        self.wo = nn.Linear(h * dh, d, bias=False)
        self.core = AttentionCore()
        self.scale = (dh + self.rope_head_dim) ** -0.5

    def rope_dim(self) -> int:
        return self.rope_head_dim

    def cache_spec(self, mla_absorb: bool = True) -> dict[str, tuple[int, ...]]:
        if mla_absorb:
            return {"latent": (self.latent_dim,), "k_rope": (self.rope_head_dim,)}
        h, dh = self.n_head, self.head_dim
        return {"k": (h, dh + self.rope_head_dim), "v": (h, dh)}

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W^UK, W^UV as (H, d_h, d_c) each: k^C_h = W^UK_h c, v_h = W^UV_h c."""
        w = self.wkv_b.weight.view(self.n_head, 2 * self.head_dim, self.latent_dim)
        return w[:, :self.head_dim], w[:, self.head_dim:]

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H, d_h + d_R): per head the no-RoPE part then the (un-rotated) RoPE part."""
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        return q.view(*x.shape[:2], self.n_head, self.head_dim + self.rope_head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        """x (B, T, d_model) at positions [start, start + T); cos/sin cover all positions."""
        b, t, _ = x.shape
        start = cache.pos if cache is not None else 0
        cos, sin = cos[start:start + t], sin[start:start + t]
        q_nope, q_rope = self.queries(x).split([self.head_dim, self.rope_head_dim], dim=-1)
        if self.qk_norm:
            q_nope = rms_norm(q_nope, None, QK_NORM_EPS)
        q_rope = apply_rope(q_rope, cos, sin, self.qk_norm)
        latent, k_rope = self.wkv_a(x).split([self.latent_dim, self.rope_head_dim], dim=-1)
        latent = self.kv_norm(latent)
        k_rope = apply_rope(k_rope[:, :, None, :], cos, sin, self.qk_norm)[:, :, 0]
        if cache is not None and "latent" in cache.buffers:
            cached = cache.update(latent=latent, k_rope=k_rope)
            y = self._absorbed(q_nope, q_rope, cached["latent"], cached["k_rope"])
        else:
            y = self._naive(q_nope, q_rope, latent, k_rope, cache)
        return self.wo(y.reshape(b, t, -1))

    def _naive(self, q_nope, q_rope, latent, k_rope, cache) -> torch.Tensor:
        b, t = latent.shape[:2]
        kv = self.wkv_b(latent).view(b, t, self.n_head, 2 * self.head_dim)
        k_nope, v = kv.split([self.head_dim, self.head_dim], dim=-1)
        k = torch.cat((k_nope, k_rope[:, :, None, :].expand(b, t, self.n_head, self.rope_head_dim)), dim=-1)
        if cache is not None:
            cached = cache.update(k=k, v=v)
            k, v = cached["k"], cached["v"]
        q = torch.cat((q_nope, q_rope), dim=-1)
        # Values padded to the query/key width: fused SDPA kernels need equal widths, and
        # without them CPU attention falls back to a path several times slower.
        v = F.pad(v, (0, self.rope_head_dim))
        y = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.scale)
        return y[..., :self.head_dim].transpose(1, 2)

    def _absorbed(self, q_nope, q_rope, latent, k_rope) -> torch.Tensor:
        w_uk, w_uv = self.up_projections()
        q_latent = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)
        q = torch.cat((q_latent, q_rope), dim=-1).transpose(1, 2)  # (B, H, Tq, d_c + d_R)
        k = torch.cat((latent, k_rope), dim=-1)[:, None]  # one shared latent head
        y_latent = self.core(q, k, latent[:, None], self.scale)  # (B, H, Tq, d_c)
        return torch.einsum("bhtc,hdc->bthd", y_latent, w_uv)
