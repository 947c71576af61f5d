"""Low-rank KV attention (LRKV, arXiv 2601.11471, Eq. 2-7).

Per layer one shared K and one shared V projection (d -> d_h) plus, per head h, a rank-r
residual:  W^K_h = W^K_shared + U^K_h B^K_hᵀ,  W^V_h = W^V_shared + U^V_h B^V_hᵀ,
with U_h (d x r) and B_h (d_h x r). Queries are ordinary per-head projections.

Training materialises K_h and V_h. Decoding caches only K_shared, V_shared (d_h each) and the
latents R_h = X U_h (r per head): 2·(d_h + H·r) values per token (Eq. 8).
  * Values use Eq. 7 exactly: a·V_h = a·V_shared + (a·R^V_h) B^V_hᵀ, never forming V_h
    (the pattern a is formed explicitly: one query row per head at decode time).
  * Keys cannot use Eq. 6 once RoPE or QK-norm is on: RoPE rotates the d_h-dim key
    K_shared + R_h B_hᵀ, and a rotation does not pass through B_h (paper digest, C1). So each
    step rebuilds K_h for the cached positions, O(T·H·r·d_h) extra FLOPs per layer, which is
    r times the O(T·H·d_h) of the scores themselves; memory stays at the Eq. 8 size.
"""

from __future__ import annotations

import torch
from torch import nn

from headlab.model.attention.common import AttentionCore, LayerCache, apply_rope, attention_probabilities
from headlab.model.config import ModelConfig


class LowRankKVAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, d, dh, r = config.n_head, config.d_model, config.head_dim, config.kv_rank
        self.n_head, self.head_dim, self.rank, self.qk_norm = h, dh, r, config.qk_norm
        self.residual_init = config.kv_residual_init  # read as the module is built, as every setting of a model is
        self.c_q = nn.Linear(d, h * dh, bias=False)
        self.k_shared = nn.Linear(d, dh, bias=False)  # W^K_shared
        self.v_shared = nn.Linear(d, dh, bias=False)  # W^V_shared
        self.u_k = nn.Linear(d, h * r, bias=False)  # rows h·r:(h+1)·r hold U^K_hᵀ
        self.u_v = nn.Linear(d, h * r, bias=False)  # rows h·r:(h+1)·r hold U^V_hᵀ
        self.b_k = nn.Parameter(torch.empty(h, dh, r))  # B^K_h
        self.b_v = nn.Parameter(torch.empty(h, dh, r))  # B^V_h
        self.c_proj = nn.Linear(h * dh, d, bias=False)
        self.core = AttentionCore()

    def rope_dim(self) -> int:
        return self.head_dim

    def cache_spec(self, mla_absorb: bool = True) -> dict[str, tuple[int, ...]]:
        h, dh, r = self.n_head, self.head_dim, self.rank
        return {"k_shared": (dh,), "v_shared": (dh,), "k_latent": (h, r), "v_latent": (h, r)}

    @torch.no_grad()
    def init_residuals(self, std: float, ratio: float = 0.1) -> None:
        """The paper's init: U, B ~ N(0, std²)/√r, then each head's U_h B_hᵀ rescaled so that
        ‖U_h B_hᵀ‖_F = ratio·‖W_shared‖_F (shared projections already initialised). The paper does
        not give the ratio; 0.1 is headlab's default, 1 makes each residual as large as an
        independent head's projection, and 0 starts every head at W_shared with B_h = 0 (U_h
        random, so both factors still get gradients)."""
        for u, b, shared in ((self.u_k, self.b_k, self.k_shared), (self.u_v, self.b_v, self.v_shared)):
            nn.init.normal_(u.weight, std=std / self.rank ** 0.5)
            nn.init.normal_(b, std=std / self.rank ** 0.5)
            if ratio == 0:
                b.zero_()
                continue
            u_heads = u.weight.view(self.n_head, self.rank, -1)  # (h, r, d) = U_hᵀ
            residual_norms = torch.linalg.matrix_norm(b @ u_heads)  # ‖B_h U_hᵀ‖_F per head
            scale = (ratio * torch.linalg.matrix_norm(shared.weight) / residual_norms).sqrt()
            u_heads.mul_(scale[:, None, None])
            b.mul_(scale[:, None, None])

    def residual_weights(self, which: str = "k") -> torch.Tensor:
        """U_h B_hᵀ for every head, shape (H, d, d_h): the per-head deviation from W_shared."""
        u, b = (self.u_k, self.b_k) if which == "k" else (self.u_v, self.b_v)
        return torch.einsum("hrd,her->hde", u.weight.view(self.n_head, self.rank, -1), b)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        """x (B, T, d_model) at positions [start, start + T); cos/sin cover all positions."""
        b, t, _ = x.shape
        start = cache.pos if cache is not None else 0
        q = apply_rope(self.c_q(x).view(b, t, self.n_head, self.head_dim), cos[start:start + t], sin[start:start + t],
                       self.qk_norm)
        k_shared, v_shared = self.k_shared(x), self.v_shared(x)
        k_latent = self.u_k(x).view(b, t, self.n_head, self.rank)
        v_latent = self.u_v(x).view(b, t, self.n_head, self.rank)
        if cache is not None:
            cached = cache.update(k_shared=k_shared, v_shared=v_shared, k_latent=k_latent, v_latent=v_latent)
            k_shared, v_shared, k_latent, v_latent = (
                cached["k_shared"], cached["v_shared"], cached["k_latent"], cached["v_latent"])
        k = self._keys(k_shared, k_latent, cos, sin)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        scale = self.head_dim ** -0.5
        if cache is None:
            v = v_shared[:, :, None, :] + torch.einsum("bthr,hdr->bthd", v_latent, self.b_v)
            y = self.core(q, k, v.transpose(1, 2), scale)
        else:
            y = self._attend_factored_values(q, k, v_shared, v_latent, scale)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))

    def _keys(self, k_shared, k_latent, cos, sin) -> torch.Tensor:
        """K_h = RoPE(K_shared + R^K_h B^K_hᵀ) (then QK-norm) for positions [0, T)."""
        k = k_shared[:, :, None, :] + torch.einsum("bthr,hdr->bthd", k_latent, self.b_k)
        return apply_rope(k, cos[:k.size(1)], sin[:k.size(1)], self.qk_norm)

    def _attend_factored_values(self, q, k, v_shared, v_latent, scale) -> torch.Tensor:
        """Eq. 7 with the pattern a = softmax(q K_hᵀ):  a·V_h = a·V_shared + (a·R^V_h) B^V_hᵀ."""
        probs = attention_probabilities(q, k, scale)  # (B, H, Tq, T)
        shared = probs @ v_shared[:, None]  # one V_shared for every head
        latent = probs @ v_latent.transpose(1, 2)  # (B, H, Tq, r)
        return shared + torch.einsum("bhtr,hdr->bhtd", latent, self.b_v)
