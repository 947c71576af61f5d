"""headlab's attention modules against independent Hugging Face implementations.

Weights are ported from a randomly initialised headlab module into the HF module built from a
tiny random config (nothing is downloaded), and the two outputs must agree to 1e-5 (fp32, CPU):

  * GroupedQueryAttention (MHA / GQA / MQA)  vs  transformers' LlamaAttention
  * MultiHeadLatentAttention (MLA)           vs  transformers' DeepseekV3Attention

Both a full forward (no cache) and headlab's decode caches (one prefill, then chunked and
single-token decoding) are checked against HF's full causal forward. Each family also has a
"mis-port" test showing that the comparison would catch a wrong port, so the checks are not
vacuous. Written against transformers 5.24 (`rope_parameters`; modules called with keyword
`position_embeddings=` / `attention_mask=`); `_rope_kwargs` falls back to 4.x's `rope_theta`, but
only 5.24 has been run.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

import headlab
from headlab.model.attention import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadLatentAttention,
    attention_backend,
    rope_tables,
)
from headlab.model.attention.mla import NORM_EPS

TOL = 1e-5
BATCH, SEQ = 2, 12
# How headlab consumes the SEQ tokens through its cache: one prefill, or a prefill followed by a
# multi-token chunk (end-aligned causal mask) and single-token steps (the unmasked tq == 1 path).
CHUNKINGS = {"prefill": [SEQ], "decode": [5, 3, 1, 1, 1, 1]}
# (HF attn_implementation, headlab kernel backend): HF eager with an explicit mask against
# headlab's explicit softmax, and SDPA (is_causal) on both sides.
IMPL_BACKENDS = [("eager", "manual"), ("sdpa", "sdpa")]


# ---- shared helpers ----------------------------------------------------------------------------

def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _inputs(cfg, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (BATCH, SEQ, d_model) and headlab's cos/sin tables for every position."""
    torch.manual_seed(seed)
    x = torch.randn(BATCH, SEQ, cfg.d_model)
    rope_dim = cfg.head_dim if cfg.attention != "mla" else cfg.rope_head_dim
    cos, sin = rope_tables(cfg.seq_len, rope_dim, cfg.rope_base)
    return x, cos, sin


def _rope_kwargs(config_cls, base: float) -> dict:
    """RoPE base as this transformers version spells it (v5: rope_parameters, v4: rope_theta)."""
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    if "rope_parameters" in names or "rope_parameters" in getattr(config_cls, "__annotations__", {}):
        return {"rope_parameters": {"rope_type": "default", "rope_theta": float(base)}}
    return {"rope_theta": float(base)}


def _hf_causal_mask(t: int) -> torch.Tensor:
    """Additive (1, 1, T, T) causal mask, as HF's eager path expects it (it builds none itself)."""
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.zeros(1, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)


def _hf_forward(hf_attn, rotary, x: torch.Tensor, impl: str) -> torch.Tensor:
    """HF attention over all of x, causal: an explicit 4D mask for eager, SDPA's is_causal otherwise."""
    positions = torch.arange(x.size(1))[None].expand(x.size(0), -1)
    position_embeddings = rotary(x, positions)
    mask = _hf_causal_mask(x.size(1)) if impl == "eager" else None
    with torch.no_grad():
        out, _ = hf_attn(x, position_embeddings=position_embeddings, attention_mask=mask)
    return out


def _check_hf_rope_matches(rotary, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """HF's cos/sin are cat(freqs, freqs) of headlab's (T, D/2) angles (fp32 vs fp64 angles)."""
    x = torch.zeros(1, SEQ, 1)
    hf_cos, hf_sin = rotary(x, torch.arange(SEQ)[None])
    assert _max_diff(hf_cos[0], torch.cat((cos[:SEQ], cos[:SEQ]), -1)) < 1e-6
    assert _max_diff(hf_sin[0], torch.cat((sin[:SEQ], sin[:SEQ]), -1)) < 1e-6


def _headlab_forward(module, x, cos, sin, chunks=None, mla_absorb: bool = True) -> torch.Tensor:
    """headlab module over all of x: no cache if chunks is None, else through a KVCache in chunks."""
    with torch.no_grad():
        if chunks is None:
            return module(x, cos, sin)
        assert sum(chunks) == x.size(1)
        cache = KVCache([module.cache_spec(mla_absorb)], x.size(0), x.size(1))
        outs, start = [], 0
        for n in chunks:
            outs.append(module(x[:, start:start + n], cos, sin, cache.layers[0]))
            cache.advance(n)
            start += n
        return torch.cat(outs, dim=1)


def _assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    # Non-trivial outputs: a port that zeroes everything cannot pass.
    assert ref.abs().mean().item() > 1e-2, "reference output is suspiciously small"
    diff = _max_diff(ours, ref)
    assert diff <= TOL, f"headlab vs HF: max |diff| = {diff:.3e} > {TOL:.0e}"


# ---- GQA / MQA / MHA vs LlamaAttention ---------------------------------------------------------

GQA_CASES = {
    "gqa-hd8": dict(attention="gqa", n_head=4, n_kv_head=2, head_dim=8, d_model=32),
    "gqa-hd16": dict(attention="gqa", n_head=4, n_kv_head=2, head_dim=16, d_model=48, rope_base=500.0),
    "mqa": dict(attention="mqa", n_head=4, head_dim=8, d_model=32),
    "mha": dict(attention="mha", n_head=4, head_dim=16, d_model=64),
}


def _gqa_pair(case: str, impl: str, port=True):
    """A random headlab GroupedQueryAttention and a LlamaAttention holding the same weights."""
    cfg = headlab.preset("tiny", qk_norm=False, **GQA_CASES[case])
    torch.manual_seed(0)
    ours = GroupedQueryAttention(cfg).eval()
    hf_cfg = LlamaConfig(
        hidden_size=cfg.d_model, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, attention_bias=False, attention_dropout=0.0,
        max_position_embeddings=cfg.seq_len, attn_implementation=impl,
        **_rope_kwargs(LlamaConfig, cfg.rope_base),
    )
    hf = LlamaAttention(hf_cfg, layer_idx=0).eval()
    if port:
        _port_gqa(ours, hf)
    return cfg, ours, hf, LlamaRotaryEmbedding(hf_cfg)


def _port_gqa(ours: GroupedQueryAttention, hf: LlamaAttention) -> None:
    # Same layouts: heads contiguous in the output rows, both RoPEs half-split (rotate_half), and
    # query head i reads K/V head i // (n_head / kv_heads) in both (repeat_interleave / repeat_kv).
    with torch.no_grad():
        for src, dst in [("c_q", "q_proj"), ("c_k", "k_proj"), ("c_v", "v_proj"), ("c_proj", "o_proj")]:
            getattr(hf, dst).weight.copy_(getattr(ours, src).weight)


def test_gqa_comparison_catches_misports():
    """The check is sharp: an unported HF module, a non-causal HF run, or an interleaved-RoPE
    port of q/k all land far outside the tolerance."""
    cfg, ours, hf, rotary = _gqa_pair("gqa-hd8", "eager", port=False)
    x, cos, sin = _inputs(cfg)
    out = _headlab_forward(ours, x, cos, sin)
    assert _max_diff(out, _hf_forward(hf, rotary, x, "eager")) > 1e-2  # random HF weights

    _port_gqa(ours, hf)
    with torch.no_grad():
        positions = torch.arange(SEQ)[None].expand(BATCH, -1)
        non_causal, _ = hf(x, position_embeddings=rotary(x, positions), attention_mask=None)
    assert _max_diff(out, non_causal) > 1e-2  # eager without a mask is bidirectional

    d = cfg.head_dim
    perm = torch.arange(d).view(2, d // 2).t().reshape(-1)  # half-split -> interleaved rows
    with torch.no_grad():
        for proj, heads in [(hf.q_proj, cfg.n_head), (hf.k_proj, cfg.kv_heads)]:
            proj.weight.copy_(proj.weight.view(heads, d, -1)[:, perm].reshape(heads * d, -1))
    assert _max_diff(out, _hf_forward(hf, rotary, x, "eager")) > 1e-2


# ---- MLA vs DeepseekV3Attention ----------------------------------------------------------------

MLA_CASES = {
    "mla": dict(n_head=4, d_model=32, head_dim=8, kv_latent_dim=12, rope_head_dim=4, q_latent_dim=0),
    "mla-qlora": dict(n_head=4, d_model=32, head_dim=8, kv_latent_dim=12, rope_head_dim=4, q_latent_dim=10),
    "mla-wide": dict(n_head=2, d_model=48, head_dim=16, kv_latent_dim=20, rope_head_dim=8, q_latent_dim=24,
                     rope_base=1000.0),
}


def _rope_interleave_perm(d_rope: int) -> torch.Tensor:
    """Row order turning a half-split RoPE projection into DeepSeek's interleaved one.

    headlab rotates pairs (i, i + d_R/2) of its projection's rows. With rope_interleave=True, HF
    rotates pairs (2i, 2i + 1) and emits the result half-split: out[i] = x[2i]·cos - x[2i+1]·sin,
    out[i + d_R/2] = x[2i+1]·cos + x[2i]·sin. So HF row 2i must be headlab row i and HF row 2i+1
    headlab row i + d_R/2: perm = [0, d_R/2, 1, d_R/2 + 1, ...]. The rotated q/k then come out
    in headlab's layout exactly, so the nope part, k_pe sharing and the value path need nothing.
    """
    return torch.arange(d_rope).view(2, d_rope // 2).t().reshape(-1)


def _mla_pair(case: str, impl: str, port=True, permute=True):
    """A random headlab MLA (random RMSNorm gains too) and a DeepseekV3Attention with its weights."""
    cfg = headlab.preset("tiny", "mla", qk_norm=False, **MLA_CASES[case])  # DeepSeek's layout has no QK-norm
    torch.manual_seed(0)
    ours = MultiHeadLatentAttention(cfg).eval()
    with torch.no_grad():  # non-unit RMSNorm gains, so porting them is actually tested
        for norm in [ours.kv_norm] + ([ours.q_norm] if cfg.q_latent_dim else []):
            norm.weight.copy_(1 + 0.5 * torch.randn_like(norm.weight))
    hf_cfg = DeepseekV3Config(
        hidden_size=cfg.d_model, num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,  # MLA expands K/V to every head; default (128) would break repeat_kv
        q_lora_rank=cfg.q_latent_dim or None, kv_lora_rank=cfg.kv_latent_dim,
        qk_nope_head_dim=cfg.head_dim, qk_rope_head_dim=cfg.rope_head_dim, v_head_dim=cfg.head_dim,
        rms_norm_eps=NORM_EPS, rope_interleave=True, attention_bias=False, attention_dropout=0.0,
        max_position_embeddings=cfg.seq_len, attn_implementation=impl,
        **_rope_kwargs(DeepseekV3Config, cfg.rope_base),
    )
    hf = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
    # The attention's latent norms take DeepseekV3RMSNorm's default eps, not config.rms_norm_eps.
    for norm in [hf.kv_a_layernorm] + ([hf.q_a_layernorm] if cfg.q_latent_dim else []):
        assert norm.variance_epsilon == NORM_EPS
    assert hf.scaling == pytest.approx((cfg.head_dim + cfg.rope_head_dim) ** -0.5)
    if port:
        _port_mla(ours, hf, permute)
    return cfg, ours, hf, DeepseekV3RotaryEmbedding(hf_cfg)


def _port_mla(ours: MultiHeadLatentAttention, hf: DeepseekV3Attention, permute: bool = True) -> None:
    h, dh, dc, dr = ours.n_head, ours.head_dim, ours.latent_dim, ours.rope_head_dim
    perm = _rope_interleave_perm(dr) if permute else torch.arange(dr)

    def query_rows(w: torch.Tensor) -> torch.Tensor:  # per head [nope | rope], permute the rope rows
        w = w.view(h, dh + dr, -1)
        return torch.cat((w[:, :dh], w[:, dh:][:, perm]), dim=1).reshape(h * (dh + dr), -1)

    with torch.no_grad():
        if hasattr(ours, "wq_a"):
            hf.q_a_proj.weight.copy_(ours.wq_a.weight)
            hf.q_a_layernorm.weight.copy_(ours.q_norm.weight)
            hf.q_b_proj.weight.copy_(query_rows(ours.wq_b.weight))
        else:
            hf.q_proj.weight.copy_(query_rows(ours.wq.weight))
        wkv_a = ours.wkv_a.weight  # rows [latent (d_c) | shared RoPE key (d_R)]
        hf.kv_a_proj_with_mqa.weight.copy_(torch.cat((wkv_a[:dc], wkv_a[dc:][perm]), dim=0))
        hf.kv_a_layernorm.weight.copy_(ours.kv_norm.weight)
        hf.kv_b_proj.weight.copy_(ours.wkv_b.weight)  # per head [k_nope (d_h) | v (d_h)] in both
        hf.o_proj.weight.copy_(ours.wo.weight)


# Every family against its Hugging Face reference: (pair builder, case) for the forward pass, and
# the same with the decode cache (for MLA both caches), each case by its own id.
def _pair(family: str, case: str, impl: str):
    return {"gqa": _gqa_pair, "mla": _mla_pair}[family](case, impl)


CASES = [("gqa", case) for case in GQA_CASES] + [("mla", case) for case in MLA_CASES]
CACHES = [(family, case, absorb) for family, case in CASES
          for absorb in ((None,) if family == "gqa" else (True, False))]


@pytest.mark.parametrize("impl, backend", IMPL_BACKENDS)
@pytest.mark.parametrize("family, case", CASES, ids=[case for _, case in CASES])
def test_attention_matches_its_hugging_face_reference(family, case, impl, backend):
    cfg, ours, hf, rotary = _pair(family, case, impl)
    x, cos, sin = _inputs(cfg)
    _check_hf_rope_matches(rotary, cos, sin)
    ref = _hf_forward(hf, rotary, x, impl)
    with attention_backend(backend):
        _assert_close(_headlab_forward(ours, x, cos, sin), ref)


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("family, case, mla_absorb", CACHES,
                         ids=[case + {None: "", True: "-absorbed", False: "-naive"}[a] for _, case, a in CACHES])
def test_cached_attention_matches_its_hugging_face_reference(family, case, mla_absorb, chunking):
    cfg, ours, hf, rotary = _pair(family, case, "eager")
    x, cos, sin = _inputs(cfg)
    ref = _hf_forward(hf, rotary, x, "eager")
    extra = () if mla_absorb is None else (mla_absorb,)
    _assert_close(_headlab_forward(ours, x, cos, sin, CHUNKINGS[chunking], *extra), ref)


def test_mla_comparison_catches_misports():
    """Unported weights, a port that skips the RoPE row permutation, or unported RMSNorm gains all
    land far outside the tolerance."""
    cfg, ours, hf, rotary = _mla_pair("mla-qlora", "eager", port=False)
    x, cos, sin = _inputs(cfg)
    out = _headlab_forward(ours, x, cos, sin)
    assert _max_diff(out, _hf_forward(hf, rotary, x, "eager")) > 1e-2

    _port_mla(ours, hf, permute=False)
    assert _max_diff(out, _hf_forward(hf, rotary, x, "eager")) > 1e-2

    _port_mla(ours, hf)
    assert _max_diff(out, _hf_forward(hf, rotary, x, "eager")) <= TOL
    with torch.no_grad():
        hf.kv_a_layernorm.weight.fill_(1.0)
    assert _max_diff(out, _hf_forward(hf, rotary, x, "eager")) > 1e-2
