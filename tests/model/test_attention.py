"""Causality, cached decoding against the full forward pass, and the kernel fallback."""

import pytest
import torch

from headlab import GPT, preset
from headlab.model.attention import attention_backend
from headlab.model.config import ARCHS
from headlab.schema import FAMILIES
from shared_fixtures import DECODE_CASES, tiny_model


@pytest.mark.parametrize("attention", FAMILIES)
def test_logits_up_to_t_ignore_tokens_after_t(attention, tokens):
    model = tiny_model(attention)
    t = 11
    perturbed = tokens.clone()
    perturbed[:, t + 1:] = (perturbed[:, t + 1:] + 1 + torch.arange(perturbed.size(1) - t - 1)) % 97
    before, after = model(tokens)[0], model(perturbed)[0]
    torch.testing.assert_close(before[:, :t + 1], after[:, :t + 1], rtol=0, atol=1e-6)
    assert (before[:, t + 1:] - after[:, t + 1:]).abs().max() > 1e-3  # the perturbation is seen later


# LRKV's decode step scores without forming keys, QK-norm included or not: both are held here; and
# every decode path again with nanochat's norms (ModelConfig.arch), the embedding's among them
@pytest.mark.parametrize("attention,mla_absorb,qk_norm,arch",
                         [(*case, True, arch) for arch in ARCHS for case in DECODE_CASES]
                         + [("lrkv", True, False, "headlab")])
def test_prefill_then_cached_steps_equal_the_full_forward(attention, mla_absorb, qk_norm, arch, tokens):
    model = tiny_model(attention, qk_norm=qk_norm, arch=arch)
    full = model(tokens)[0]
    cache = model.new_cache(tokens.size(0), tokens.size(1), mla_absorb=mla_absorb)
    prefill = 10
    pieces = [model(tokens[:, :prefill], cache=cache)[0]]
    pieces += [model(tokens[:, t:t + 1], cache=cache)[0] for t in range(prefill, tokens.size(1) - 3)]
    pieces.append(model(tokens[:, -3:], cache=cache)[0])  # a multi-token chunk against the cache
    incremental = torch.cat(pieces, dim=1)
    assert cache.pos == tokens.size(1)
    assert (incremental - full).abs().max().item() <= 1e-4
    assert full.abs().max() > 1.0  # logits are not trivially small


@pytest.mark.parametrize("qk_norm", [False, True], ids=["deepseek-layout", "qk-norm"])
def test_mla_absorbed_decode_equals_naive_decode(qk_norm, tokens):
    model = tiny_model("mla", q_latent_dim=10, qk_norm=qk_norm)
    outputs = []
    for absorb in (True, False):
        cache = model.new_cache(tokens.size(0), tokens.size(1), mla_absorb=absorb)
        steps = ([model(tokens[:, :8], cache=cache)[0]]
                 + [model(tokens[:, t:t + 1], cache=cache)[0] for t in range(8, 24)])
        outputs.append(torch.cat(steps, dim=1))
    assert (outputs[0] - outputs[1]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("qk_norm", [False, True], ids=["deepseek-layout", "qk-norm"])
def test_mla_qk_norm_makes_logits_blind_to_query_and_rope_key_scale(qk_norm, tokens):
    """With qk_norm the queries and the shared RoPE key are RMS-normalised, so scaling their
    projections changes nothing; in DeepSeek's layout (no QK-norm) it changes the logits."""
    model = tiny_model("mla", qk_norm=qk_norm)
    before = model(tokens)[0]
    rope_key_rows = slice(model.config.kv_latent_dim, None)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.wq.weight.mul_(3.0)
            block.attn.wkv_a.weight[rope_key_rows].mul_(0.25)
    change = (model(tokens)[0] - before).abs().max().item()
    assert change <= 1e-4 if qk_norm else change > 1e-2


@pytest.mark.parametrize("attention,mla_absorb", DECODE_CASES)
def test_manual_softmax_fallback_equals_sdpa(attention, mla_absorb, tokens):
    model = tiny_model(attention)
    results = []
    for backend in ("sdpa", "manual"):
        with attention_backend(backend):
            cache = model.new_cache(tokens.size(0), tokens.size(1), mla_absorb=mla_absorb)
            results.append((model(tokens)[0], model(tokens[:, :20], cache=cache)[0],
                            model(tokens[:, 20:21], cache=cache)[0]))
    for sdpa, manual in zip(*results):
        assert (sdpa - manual).abs().max().item() <= 1e-5


@pytest.mark.parametrize("attention", ["gqa", "mqa"])
def test_sdpa_grouped_heads_equal_repeated_key_value_heads_in_values_and_gradients(attention, tokens):
    """SDPA's enable_gqa path (no K/V copies) against the explicit formula on K/V heads repeated per query head."""
    model = tiny_model(attention)
    results = []
    for backend in ("sdpa", "manual"):
        model.zero_grad()
        with attention_backend(backend):
            logits = model(tokens)[0]
        logits.square().mean().backward()
        results.append([logits.detach()] + [p.grad.clone() for p in model.parameters()])
    for sdpa, manual in zip(*results):
        torch.testing.assert_close(sdpa, manual, rtol=0, atol=1e-5)


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'flash'.*sdpa, manual"):
        with attention_backend("flash"):
            pass


@pytest.mark.parametrize("attention,mla_absorb", DECODE_CASES)
def test_greedy_generation_is_identical_with_and_without_the_cache(attention, mla_absorb, tokens, threads):
    model = tiny_model(attention)
    prompt = tokens[:, :6]
    cached = model.generate(prompt, 20, temperature=0, use_cache=True, mla_absorb=mla_absorb)
    recomputed = model.generate(prompt, 20, temperature=0, use_cache=False)
    assert cached.shape == (2, 26)
    assert torch.equal(cached, recomputed)


def test_generation_past_seq_len_slides_its_window_and_samples_from_the_top_k(tokens):
    """44 tokens from a model with seq_len 32: each new token comes from the logits of at most the
    last 32 tokens before it (greedy: their argmax; top_k = 5: one of their 5 largest), and the
    sampler follows its generator (same seed, same text; another seed, another text)."""
    model = tiny_model("lrkv")
    seq_len = model.config.seq_len

    def last_logits(out, t):
        return model(out[:, max(0, t - seq_len):t])[0][:, -1]

    with torch.no_grad():
        greedy = model.generate(tokens[:, :4], 40, temperature=0, use_cache=False)
        assert torch.equal(greedy[:, :4], tokens[:, :4])
        for t in range(4, 44):
            assert torch.equal(greedy[:, t], last_logits(greedy, t).argmax(-1)), t
        sampled = model.generate(tokens[:, :4], 40, top_k=5, use_cache=False,
                                 generator=torch.Generator().manual_seed(3))
        for t in range(4, 44):
            top5 = last_logits(sampled, t).topk(5).indices
            assert (top5 == sampled[:, t:t + 1]).any(-1).all(), t
    again = model.generate(tokens[:, :4], 40, top_k=5, use_cache=False, generator=torch.Generator().manual_seed(3))
    other = model.generate(tokens[:, :4], 40, top_k=5, use_cache=False, generator=torch.Generator().manual_seed(4))
    assert torch.equal(sampled, again) and not torch.equal(sampled, other)


def test_forward_past_seq_len_is_refused():
    model = tiny_model("mha")
    with pytest.raises(ValueError, match="exceeds ModelConfig.seq_len = 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("ratio", [0.0, 0.1, 1.0])
def test_lrkv_residuals_start_at_the_configured_fraction_of_the_shared_projection(ratio):
    """‖U_h B_hᵀ‖_F = kv_residual_init · ‖W_shared‖_F for every head, keys and values; at 0 the
    heads start equal to W_shared, yet both factors get gradients (B_h = 0, U_h random)."""
    model = GPT(preset("tiny", "lrkv", kv_residual_init=ratio))
    for block in model.blocks:
        attn = block.attn
        for which, shared in (("k", attn.k_shared), ("v", attn.v_shared)):
            norms = torch.linalg.matrix_norm(attn.residual_weights(which).detach())
            torch.testing.assert_close(norms,
                                       torch.full_like(norms, ratio) * torch.linalg.matrix_norm(shared.weight.detach()))
    model(torch.randint(0, 256, (2, 8)), targets=torch.randint(0, 256, (2, 8)))[1].backward()
    attn = model.blocks[0].attn
    assert attn.b_k.grad.abs().sum() > 0 and attn.u_k.weight.grad is not None
    assert model.config.label == ("LRKV (r=3)" if ratio == 0.1 else f"LRKV (r=3, init {ratio:g})")
