"""The tensors a cache actually holds after decoding have exactly the formula's size."""

import pytest
import torch

from headlab import preset
from shared_fixtures import DECODE_CASES, tiny_model


def _formula(config, mla_absorb):
    """Values per token per layer, written out from the paper (Eq. 8) and DeepSeek-V2."""
    h, dh = config.n_head, config.head_dim
    return {
        "mha": 2 * h * dh,
        "mqa": 2 * dh,
        "gqa": 2 * config.n_kv_head * dh,
        "lrkv": 2 * (dh + h * config.kv_rank),
        "mla": config.kv_latent_dim + config.rope_head_dim if mla_absorb else h * (2 * dh + config.rope_head_dim),
    }[config.attention]


@pytest.mark.parametrize("attention,mla_absorb", DECODE_CASES)
def test_cache_held_after_decoding_t_tokens_has_the_formula_size(attention, mla_absorb, tokens):
    """Decode T tokens (a 4-token prefill, then one at a time) into a cache with room for 8 more:
    it then holds T tokens, each written in every buffer, and exactly the formula's values per
    token per layer; the 8 spare slots are untouched."""
    model = tiny_model(attention)
    batch, steps, spare = tokens.size(0), tokens.size(1), 8
    cache = model.new_cache(batch, steps + spare, mla_absorb=mla_absorb)
    model(tokens[:, :4], cache=cache)
    for t in range(4, steps):
        model(tokens[:, t:t + 1], cache=cache)
    per_token = _formula(model.config, mla_absorb)
    assert cache.pos == steps
    held = [t[:, :cache.pos] for t in cache.tensors()]
    assert sum(t.numel() for t in held) == per_token * model.config.n_layer * batch * steps
    assert sum(t.numel() * t.element_size() for t in held) == 4 * per_token * model.config.n_layer * batch * steps
    assert model.config.kv_cache_values_per_token(mla_absorb) == per_token
    written = [t.abs().sum(dim=tuple(range(2, t.dim()))).gt(0) for t in cache.tensors()]  # (batch, slot)
    assert all(w[:, :steps].all() and not w[:, steps:].any() for w in written)


def test_lrkv_caches_only_the_shared_projections_and_the_latents():
    model = tiny_model("lrkv")
    cache = model.new_cache(1, 8)
    h, dh, r = model.config.n_head, model.config.head_dim, model.config.kv_rank
    assert {name: tuple(t.shape) for name, t in cache.layers[0].buffers.items()} == {
        "k_shared": (1, 8, dh), "v_shared": (1, 8, dh), "k_latent": (1, 8, h, r), "v_latent": (1, 8, h, r)}


def test_bf16_cache_halves_the_bytes():
    model = tiny_model("lrkv")
    assert model.new_cache(2, 16, dtype=torch.bfloat16).nbytes() * 2 == model.new_cache(2, 16).nbytes()


def test_cache_overflow_is_refused(tokens):
    model = tiny_model("gqa")
    cache = model.new_cache(2, 8)
    with pytest.raises(ValueError, match="KV cache overflow: 10 tokens exceed max_len = 8"):
        model(tokens[:, :10], cache=cache)


@pytest.mark.parametrize("name,fraction", [
    ("paper-128m", 52.6), ("paper-1.2b", 48.2), ("paper-2.5b", 48.5), ("paper-6.3b", 45.3)])
def test_paper_lrkv_cache_fractions(name, fraction):
    assert round(100 * preset(name, "lrkv").kv_cache_fraction_of_mha(), 1) == fraction
