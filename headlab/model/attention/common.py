"""Pieces every attention family shares: RoPE, the masked-softmax kernel and the decode cache.

Tensors are laid out (batch, time, heads, dim) until the kernel, which wants (batch, heads,
time, dim). RoPE uses the half-split convention (pairs are (i, i + D/2)), as Llama and HF do.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from headlab.model.ops import QK_NORM_EPS, rotate_and_normalize, rotate_pairs

_BACKENDS = ("sdpa", "manual")
_backend = "sdpa"  # "manual": the explicit softmax, a reference for tests


def rope_tables(seq_len: int, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of angle p·base^(-2i/dim) for positions p < seq_len, pairs i < dim/2, on the
    default device. Computed on the CPU and moved: on the meta device these ops would need torch's
    Python meta kernels, whose first use costs a process 1 CPU-s (`headlab.model.gpt.build_on_meta`)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64, device="cpu"), inv_freq)
    device = torch.get_default_device()
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qk_norm: bool = False) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+D/2}) of x (B, T, H, D) by the angles in cos/sin (T, D/2); with
    `qk_norm`, then a parameter-free RMSNorm over the head dimension (QK-norm), in the same pass."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    if qk_norm:
        return rotate_and_normalize(x, cos, sin, QK_NORM_EPS)
    return rotate_pairs(x, cos, sin)


@contextlib.contextmanager
def attention_backend(name: str):
    """Temporarily run every attention kernel through `name` ('sdpa' or 'manual')."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown: allowed values are {', '.join(_BACKENDS)}")
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax(q kᵀ · scale) v for q (B, H, Tq, D), k (B, Hk, Tk, D), v (B, Hk, Tk, Dv).

    Queries are the last Tq of the Tk positions (decoding against a cache). Each of the Hk
    key/value heads serves H/Hk consecutive query heads.
    """
    b, h, tq, _ = q.shape
    hk = k.size(1)
    if tq == 1:
        # One new token sees every key, so no mask; a group's query heads become query rows
        # of their shared K/V head and the cache is read once, never repeated.
        y = _kernel(q.reshape(b, hk, h // hk, q.size(-1)), k, v, scale, causal=False)
        return y.reshape(b, h, 1, v.size(-1))
    if hk != h and _backend != "sdpa":  # SDPA groups heads itself (enable_gqa), never copying K/V
        k, v = k.repeat_interleave(h // hk, dim=1), v.repeat_interleave(h // hk, dim=1)
    return _kernel(q, k, v, scale, causal=True)


class AttentionCore(nn.Module):
    """`attend` as a module: the one call through which every family hands its post-RoPE,
    post-QK-norm queries, keys and values to the kernel. It holds no weights; it is where a
    forward (pre-)hook sees (q, k, v, scale) exactly as the model scores them (the analysis
    records attention maps this way, `headlab.analysis.attention_maps.recorded_attention`)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return attend(q, k, v, scale)


def attention_probabilities(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) with the end-aligned causal mask, for q (B, H, Tq, D) and k
    (B, H, Tk, D): the explicit attention pattern, (B, H, Tq, Tk)."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if q.size(-2) > 1:
        scores = scores.masked_fill(~_causal_mask(q.size(-2), k.size(-2), q.device), -math.inf)
    return scores.softmax(dim=-1)


def _kernel(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    """softmax(q kᵀ · scale) v, end-aligned causal mask if asked; SDPA or the explicit formula."""
    tq, tk = q.size(-2), k.size(-2)
    if _backend == "sdpa":
        grouped = k.size(1) != q.size(1)  # consecutive query heads share a K/V head
        if causal and tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=grouped)
        mask = _causal_mask(tq, tk, q.device) if causal else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=grouped)
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(~_causal_mask(tq, tk, q.device), -math.inf)
    return scores.softmax(dim=-1) @ v


def _causal_mask(tq: int, tk: int, device) -> torch.Tensor:
    """True where query i (at absolute position tk - tq + i) may see key j."""
    rows = torch.arange(tk - tq, tk, device=device)[:, None]
    return torch.arange(tk, device=device)[None, :] <= rows


class LayerCache:
    """One layer's preallocated decode buffers: name -> (B, max_len, *per_token_shape)."""

    def __init__(self, buffers: dict[str, torch.Tensor], owner: "KVCache"):
        self.buffers = buffers
        self._owner = owner

    @property
    def pos(self) -> int:
        """Number of tokens already cached (the absolute position of the next token)."""
        return self._owner.pos

    def update(self, **new: torch.Tensor) -> dict[str, torch.Tensor]:
        """Write the new tokens' entries at [pos, pos + T) and return views of [0, pos + T)."""
        start = self.pos
        end = start + next(iter(new.values())).size(1)
        if end > self._owner.max_len:
            raise ValueError(f"KV cache overflow: {end} tokens exceed max_len = {self._owner.max_len}")
        views = {}
        for name, value in new.items():
            buffer = self.buffers[name]
            buffer[:, start:end] = value
            views[name] = buffer[:, :end]
        return views


class KVCache:
    """The whole model's decode cache. Each layer stores only what its family needs.

    `specs[i]` maps a buffer name to its per-token shape for layer i; buffers are allocated
    once for `max_len` tokens, so memory is known up front and decoding never reallocates.
    """

    def __init__(self, specs: list[dict[str, tuple[int, ...]]], batch_size: int, max_len: int,
                 device=None, dtype=torch.float32):
        self.max_len = max_len
        self.pos = 0
        self.layers = [
            LayerCache(
                {name: torch.zeros(batch_size, max_len, *shape, device=device, dtype=dtype)
                 for name, shape in spec.items()},
                self,
            )
            for spec in specs
        ]

    def advance(self, n_tokens: int) -> None:
        self.pos += n_tokens

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.buffers.values()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
