"""headlab.analysis.heads: the per-head factors reproduce each model's own computation.

Faithfulness (headlab families): xᵀ A_h y must equal the pre-softmax score q_h(x)·k_h(y) that the
attention module itself hands to its softmax kernel, for every head and every pair of positions.
RoPE cannot be switched off in headlab's modules, but the modules take their RoPE tables as
arguments: cos = 1, sin = 0 makes every rotation exactly the identity (x₁·1 − x₂·0 = x₁), so
the comparison is exact, not approximate. QK-norm is off (qk_norm=False); MLA's latent RMSNorms
become their gain alone (the 1/rms factor is the per-token scalar heads.py documents as left
out). Models run in float64, so the tolerance is 1e-10.

The OV form is checked the same way: one token attends only to itself, so with every other
head's output columns zeroed, the module's output is yᵀ A_h^OV.

Hugging Face layouts: tiny random checkpoints are written with transformers (nothing is
downloaded) and read back from disk; the factors must reproduce the scores and head outputs
computed by the live HF module's own projections (biases removed, norms as gains).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from headlab.analysis.attention_maps import recorded_attention
from headlab.analysis.gram import frobenius_gram
from headlab.analysis.heads import load_heads
from headlab.analysis.layer_weights import LRKVWeights, MLAWeights
from headlab.schema import FAMILIES
from shared_fixtures import tiny_model

T = 6
# and MLA's query latent; and MLA with nanochat's parameter-free latent norms (ModelConfig.arch)
FAMILY_CASES = [*((family, {}) for family in FAMILIES), ("mla", {"q_latent_dim": 6}),
                ("mla", {"q_latent_dim": 6, "arch": "nanochat"})]
FAMILY_IDS = [*FAMILIES, "mla-qlatent", "mla-qlatent-nanochat"]


class GainOnly(torch.nn.Module):
    """An RMSNorm without its 1/rms factor: x ↦ γ ⊙ x (what the bilinear form keeps; x for a norm
    without a gain)."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.weight = norm.weight

    def forward(self, x):
        return x if self.weight is None else x * self.weight


def _bilinear(x: torch.Tensor, left, right) -> torch.Tensor:
    """(H, T, T) values x_t ᵀ A_h x_s with A_h = L_h R_hᵀ, from the factors' materialised heads."""
    lh, rh = torch.from_numpy(left.heads()), torch.from_numpy(right.heads())
    return torch.einsum("td,hde,hfe,sf->hts", x, lh, rh, x)


def _headlab_attention(attention: str, **overrides):
    model = tiny_model(attention, qk_norm=False, **overrides).double()
    attn = model.blocks[0].attn
    for name in ("kv_norm", "q_norm"):
        if hasattr(attn, name):
            setattr(attn, name, GainOnly(getattr(attn, name)))
    return model, attn


def _identity_rope(attn, t: int):
    half = attn.rope_dim() // 2
    return torch.ones(t, half, dtype=torch.float64), torch.zeros(t, half, dtype=torch.float64)


# ---- headlab families --------------------------------------------------------------------------

@pytest.mark.parametrize("attention,overrides", FAMILY_CASES, ids=FAMILY_IDS)
def test_qk_form_equals_the_models_own_scores(attention, overrides):
    model, attn = _headlab_attention(attention, **overrides)
    x = torch.randn(1, T, model.config.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), recorded_attention(model) as calls:
        attn(x, *_identity_rope(attn, T))
    (q, k, _), = calls
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # KV group g serves heads g·H/G …
    model_scores = q[0] @ k[0].transpose(-1, -2)  # (H, T, T) before the 1/√e scale

    left, right = load_heads(model).layer(0).factors("qk")
    ours = _bilinear(x[0], left, right)
    torch.testing.assert_close(ours, model_scores, rtol=1e-10, atol=1e-10)
    # The check sees the direction of the form: Aᵀ (query and key swapped) would not pass.
    assert not torch.allclose(ours.transpose(-1, -2), model_scores, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("attention,overrides", FAMILY_CASES, ids=FAMILY_IDS)
def test_ov_form_equals_each_heads_output(attention, overrides):
    model, attn = _headlab_attention(attention, **overrides)
    h, e = model.config.n_head, model.config.head_dim
    y = torch.randn(1, 1, model.config.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    left, right = load_heads(model).layer(0).factors("ov")
    expected = torch.einsum("d,hde,hfe->hf", y[0, 0], torch.from_numpy(left.heads()), torch.from_numpy(right.heads()))
    for head in range(h):
        isolated = copy.deepcopy(attn)
        out_proj = isolated.c_proj if hasattr(isolated, "c_proj") else isolated.wo
        with torch.no_grad():
            keep = out_proj.weight[:, head * e:(head + 1) * e].clone()
            out_proj.weight.zero_()
            out_proj.weight[:, head * e:(head + 1) * e] = keep
            out = isolated(y, *_identity_rope(attn, 1))[0, 0]  # one token: attention weight 1 on itself
        torch.testing.assert_close(out, expected[head], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attention,overrides", FAMILY_CASES, ids=FAMILY_IDS)
def test_gram_of_each_family_equals_explicit_d_by_d(attention, overrides):
    """Both Gram routes on the family's own factor layout (shared blocks, latent bases) against
    ⟨A_i, A_j⟩_F with every A_h formed as a d × d matrix."""
    weights = load_heads(tiny_model(attention, **overrides)).layer(1)
    for circuit in ("qk", "ov"):
        left, right = weights.factors(circuit)
        forms = np.einsum("hde,hfe->hdf", left.heads(), right.heads())
        brute = np.einsum("idf,jdf->ij", forms, forms)
        reducible = left.rank_bound < left.dim or right.rank_bound < right.dim
        for method in ("auto", "products") + (("reduced",) if reducible else ()):
            np.testing.assert_allclose(frobenius_gram(left, right, method), brute, rtol=1e-10,
                                       atol=1e-10 * np.abs(brute).max())


def test_shared_keys_are_stored_once_per_kv_group():
    for attention, blocks in (("mqa", 1), ("gqa", 2), ("mha", 4)):
        left, right = load_heads(tiny_model(attention)).layer(0).factors("qk")
        assert right.n_blocks == blocks and right.n_heads == left.n_heads == 4
        assert list(right.index) == [h * blocks // 4 for h in range(4)]
        values, _ = load_heads(tiny_model(attention)).layer(0).factors("ov")
        assert values.n_blocks == blocks


def test_lrkv_decomposition_matches_the_module():
    model = tiny_model("lrkv")
    weights = load_heads(model).layer(1)
    assert isinstance(weights, LRKVWeights)
    attn = model.blocks[1].attn
    for projection, which, shared_module in (("key", "k", attn.k_shared), ("value", "v", attn.v_shared)):
        shared, residual = weights.decomposition(projection)
        torch.testing.assert_close(torch.from_numpy(residual), attn.residual_weights(which).double())
        torch.testing.assert_close(torch.from_numpy(shared), shared_module.weight.T.double())


def test_mla_query_latent_is_read():
    weights = load_heads(tiny_model("mla", q_latent_dim=6)).layer(0)
    assert isinstance(weights, MLAWeights) and weights.wq is None and weights.wq_a.shape == (6, 32)


def test_layer_out_of_range():
    with pytest.raises(ValueError, match="layers 0..1"):
        load_heads(tiny_model("mha")).layer(2)


# ---- paths: errors that name what is supported -------------------------------------------------

def test_unsupported_layout_lists_the_supported_ones(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "num_layers": 2}))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="t5") as error:
        load_heads(tmp_path)
    for name in ("bert", "gpt2", "llama", "qwen2", "deepseek_v2", "deepseek_v3", "headlab run folder"):
        assert name in str(error.value)


def test_missing_files_are_reported(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_heads(tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json"):
        load_heads(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="model.safetensors"):
        load_heads(tmp_path)
    with pytest.raises(TypeError, match="headlab GPT"):
        load_heads(42)


# ---- Hugging Face layouts ----------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24, vocab_size=40)
MLA_DIMS = dict(num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                first_k_dense_replace=2, n_routed_experts=2, moe_intermediate_size=8)
HF_CONFIGS = {
    "bert": dict(COMMON, max_position_embeddings=16),
    "roberta": dict(COMMON, max_position_embeddings=20),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=40, n_positions=16),
    "llama": dict(COMMON, num_key_value_heads=2),  # GQA
    "mistral": dict(COMMON, num_key_value_heads=2),
    "qwen2": dict(COMMON, num_key_value_heads=2),  # GQA with q/k/v biases
    "qwen3": dict(COMMON, num_key_value_heads=1, head_dim=8),  # MQA with per-head QK-norm gains
    "deepseek_v2": dict(COMMON, q_lora_rank=None, **MLA_DIMS),  # MLA, uncompressed queries
    "deepseek_v3": dict(COMMON, q_lora_rank=10, **MLA_DIMS),  # MLA with the query latent
}


def _affine_free(module):
    """The linear part of an affine layer (Linear or GPT-2 Conv1D): f(x) − f(0) drops the bias."""
    return lambda x: module(x) - module(torch.zeros_like(x))


def _hf_projections(model_type: str, model, layer: int, h: int):
    """The live HF module's per-head queries, keys, values (T, H, ·) as functions of x, and its
    output projection as a function of concatenated head outputs (T, H·e_v)."""
    if model_type in ("bert", "roberta"):
        a = model.encoder.layer[layer].attention
        q, k, v = (_affine_free(m) for m in (a.self.query, a.self.key, a.self.value))
        return (lambda x: q(x).view(len(x), h, -1), lambda x: k(x).view(len(x), h, -1),
                lambda x: v(x).view(len(x), h, -1), _affine_free(a.output.dense))
    if model_type == "gpt2":
        a = model.h[layer].attn
        qkv = _affine_free(a.c_attn)
        part = lambda x, i: qkv(x).split(x.size(-1), dim=-1)[i].view(len(x), h, -1)
        return lambda x: part(x, 0), lambda x: part(x, 1), lambda x: part(x, 2), _affine_free(a.c_proj)
    a = model.layers[layer].self_attn
    if model_type.startswith("deepseek"):
        cfg = model.config
        nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        if a.q_proj is not None:
            q = a.q_proj
        else:
            q = lambda x: a.q_b_proj(GainOnly(a.q_a_layernorm)(_affine_free(a.q_a_proj)(x)))

        def kv(x):
            latent, k_rope = _affine_free(a.kv_a_proj_with_mqa)(x).split([cfg.kv_lora_rank, rope], dim=-1)
            up = a.kv_b_proj(GainOnly(a.kv_a_layernorm)(latent)).view(len(x), h, -1)
            return torch.cat([up[..., :nope], k_rope[:, None].expand(len(x), h, rope)], -1), up[..., nope:]

        return (lambda x: q(x).view(len(x), h, -1), lambda x: kv(x)[0], lambda x: kv(x)[1],
                _affine_free(a.o_proj))

    def heads(proj, norm=None):  # Llama / Qwen: G KV heads, each serving H/G query heads
        def f(x):
            y = _affine_free(proj)(x).view(len(x), -1, a.head_dim)
            y = y * norm.weight if norm is not None else y
            return y.repeat_interleave(h // y.size(1), dim=1)
        return f

    return (heads(a.q_proj, getattr(a, "q_norm", None)), heads(a.k_proj, getattr(a, "k_norm", None)),
            heads(a.v_proj), _affine_free(a.o_proj))


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """model_type -> (folder with config.json + safetensors, the live float64 HF model)."""
    made = {}
    for model_type, kwargs in HF_CONFIGS.items():
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(model_type, **kwargs))
        with torch.no_grad():  # every weight, bias and norm gain random, so none hides behind init
            for name, p in model.named_parameters():
                p.normal_(mean=1.0 if "norm" in name.lower() else 0.0, std=0.3)
        folder = tmp_path_factory.mktemp(model_type)
        # llama is written in several shards to exercise model.safetensors.index.json
        model.save_pretrained(folder, **({"max_shard_size": "20KB"} if model_type == "llama" else {}))
        made[model_type] = (folder, model.double().eval())
    return made


@pytest.mark.parametrize("model_type", list(HF_CONFIGS))
def test_hf_layout_factors_reproduce_the_module(model_type, hf_checkpoints):
    folder, model = hf_checkpoints[model_type]
    heads = load_heads(folder)
    assert (heads.layout, heads.n_layers, heads.n_heads) == (model_type, 2, 4)
    x = torch.randn(T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for layer in range(2):
        q, k, v, o = _hf_projections(model_type, model, layer, 4)
        with torch.no_grad():
            scores = torch.einsum("the,she->hts", q(x), k(x))
            values = v(x)  # (T, H, e_v)
            e_v = values.size(-1)
            # head h's output alone: its values in its slot of the concatenation, zeros elsewhere
            outputs = torch.stack([o(torch.nn.functional.pad(values[:, h],
                                                             (h * e_v, (3 - h) * e_v))) for h in range(4)])
        weights = heads.layer(layer)
        torch.testing.assert_close(_bilinear(x, *weights.factors("qk")), scores, rtol=1e-10, atol=1e-10)
        left, right = weights.factors("ov")
        ours = torch.einsum("td,hde,hfe->htf", x, torch.from_numpy(left.heads()), torch.from_numpy(right.heads()))
        torch.testing.assert_close(ours, outputs, rtol=1e-10, atol=1e-10)


def test_hf_sharded_and_single_file_sources(hf_checkpoints):
    folder, _ = hf_checkpoints["llama"]
    assert (folder / "model.safetensors.index.json").exists()
    gpt2_folder, _ = hf_checkpoints["gpt2"]
    from_file = load_heads(gpt2_folder / "model.safetensors").layer(1).factors("qk")[0]
    from_folder = load_heads(gpt2_folder).layer(1).factors("qk")[0]
    assert (from_file.matrix == from_folder.matrix).all()


# ---- MLA: the decoupled RoPE parts in or out of A_h --------------------------------------------

def _mla_forms(weights: MLAWeights, mla_rope: str) -> np.ndarray:
    left, right = weights.factors("qk", mla_rope=mla_rope)
    return np.einsum("hde,hfe->hdf", left.heads(), right.heads())


@pytest.mark.parametrize("overrides", [{}, {"q_latent_dim": 6}], ids=["mla", "mla-qlatent"])
def test_mla_latent_only_form_is_the_papers_w_down_w_up_product(overrides):
    """mla_rope="excluded": A_h = W_Q,h^nope (W_dkv diag(γ) W^UKᵀ_h)ᵀ, built here by hand from the
    module's weights; "included" adds the RoPE part, so the two differ on a random model."""
    model = tiny_model("mla", **overrides).double()
    attn, config = model.blocks[0].attn, model.config
    e, d_n, d_c = config.head_dim + config.rope_head_dim, config.head_dim, config.kv_latent_dim
    with torch.no_grad():
        if config.q_latent_dim:
            w_q = attn.wq_b.weight @ (attn.q_norm.weight[:, None] * attn.wq_a.weight)
        else:
            w_q = attn.wq.weight
        latent = attn.kv_norm.weight[:, None] * attn.wkv_a.weight[:d_c]  # diag(γ) W_dkv, (d_c, d)
        up = attn.wkv_b.weight.view(config.n_head, -1, d_c)  # per head: W^UK_h rows, then W^UV_h rows
        by_hand = np.stack([(w_q[h * e:h * e + d_n].T @ (up[h, :d_n] @ latent)).numpy()
                            for h in range(config.n_head)])
    weights = load_heads(model).layer(0)
    np.testing.assert_allclose(_mla_forms(weights, "excluded"), by_hand, rtol=1e-10, atol=1e-12)
    assert not np.allclose(_mla_forms(weights, "included"), by_hand, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"q_latent_dim": 6}], ids=["mla", "mla-qlatent"])
def test_mla_rope_factors_give_the_included_form_minus_the_latent_only_one(overrides):
    """A_h^RoPE, from its own factors (each head's RoPE query, the shared RoPE key), is exactly
    what the RoPE parts add to A_h: the rope-to-latent ratio of the report is its norm over the
    latent-only form's."""
    weights = load_heads(tiny_model("mla", **overrides).double()).layer(0)
    left, right = weights.rope_factors()
    rope = np.einsum("hde,hfe->hdf", left.heads(), right.heads())
    np.testing.assert_allclose(rope, _mla_forms(weights, "included") - _mla_forms(weights, "excluded"),
                               rtol=1e-10, atol=1e-12)
    assert np.abs(rope).max() > 1e-3


def test_mla_rope_settings_agree_when_the_rope_parts_are_zero():
    model = tiny_model("mla").double()
    attn, config = model.blocks[0].attn, model.config
    e, d_n, d_c = config.head_dim + config.rope_head_dim, config.head_dim, config.kv_latent_dim
    with torch.no_grad():
        attn.wkv_a.weight[d_c:] = 0  # the shared RoPE key W_kr
        attn.wq.weight.view(config.n_head, e, -1)[:, d_n:] = 0  # every head's RoPE query
    weights = load_heads(model).layer(0)
    np.testing.assert_allclose(_mla_forms(weights, "included"), _mla_forms(weights, "excluded"), atol=1e-12)


def test_mla_rope_setting_is_checked():
    with pytest.raises(ValueError, match="mla_rope = 'partly' is invalid: allowed values are included, excluded"):
        load_heads(tiny_model("mla")).layer(0).factors("qk", mla_rope="partly")
