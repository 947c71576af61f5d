"""Causality, cached decoding against the full forward pass, and the kernel fallback."""

import pytest
import torch

from headlab import ATTENTION_FAMILIES
from headlab.attention import attention_backend
from conftest import DECODE_CASES, tiny_model


@pytest.mark.parametrize("attention", ATTENTION_FAMILIES)
def test_logits_up_to_t_ignore_tokens_after_t(attention, tokens):
    model = tiny_model(attention)
    t = 11
    perturbed = tokens.clone()
    perturbed[:, t + 1:] = (perturbed[:, t + 1:] + 1 + torch.arange(perturbed.size(1) - t - 1)) % 97
    before, after = model(tokens)[0], model(perturbed)[0]
    torch.testing.assert_close(before[:, :t + 1], after[:, :t + 1], rtol=0, atol=1e-6)
    assert (before[:, t + 1:] - after[:, t + 1:]).abs().max() > 1e-3  # the perturbation is seen later


@pytest.mark.parametrize("attention,mla_absorb", DECODE_CASES)
def test_prefill_then_cached_steps_equal_the_full_forward(attention, mla_absorb, tokens):
    model = tiny_model(attention)
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


def test_mla_absorbed_decode_equals_naive_decode(tokens):
    model = tiny_model("mla", q_latent_dim=10)
    outputs = []
    for absorb in (True, False):
        cache = model.new_cache(tokens.size(0), tokens.size(1), mla_absorb=absorb)
        steps = [model(tokens[:, :8], cache=cache)[0]] + [model(tokens[:, t:t + 1], cache=cache)[0] for t in range(8, 24)]
        outputs.append(torch.cat(steps, dim=1))
    assert (outputs[0] - outputs[1]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("attention,mla_absorb", DECODE_CASES)
def test_manual_softmax_fallback_equals_sdpa(attention, mla_absorb, tokens):
    model = tiny_model(attention)
    results = []
    for backend in ("sdpa", "manual"):
        with attention_backend(backend):
            cache = model.new_cache(tokens.size(0), tokens.size(1), mla_absorb=mla_absorb)
            results.append((model(tokens)[0], model(tokens[:, :20], cache=cache)[0], model(tokens[:, 20:21], cache=cache)[0]))
    for sdpa, manual in zip(*results):
        assert (sdpa - manual).abs().max().item() <= 1e-5


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'flash'.*sdpa, manual"):
        with attention_backend("flash"):
            pass


@pytest.mark.parametrize("attention,mla_absorb", DECODE_CASES)
def test_greedy_generation_is_identical_with_and_without_the_cache(attention, mla_absorb, tokens):
    model = tiny_model(attention)
    prompt = tokens[:, :6]
    cached = model.generate(prompt, 20, temperature=0, use_cache=True, mla_absorb=mla_absorb)
    recomputed = model.generate(prompt, 20, temperature=0, use_cache=False)
    assert cached.shape == (2, 26)
    assert torch.equal(cached, recomputed)


def test_generation_past_seq_len_keeps_going_and_sampling_is_seeded(tokens):
    model = tiny_model("lrkv")
    first = model.generate(tokens[:, :4], 40, top_k=5, generator=torch.Generator().manual_seed(3))
    second = model.generate(tokens[:, :4], 40, top_k=5, generator=torch.Generator().manual_seed(3))
    assert first.shape == (2, 44) and torch.equal(first, second)


def test_forward_past_seq_len_is_refused():
    model = tiny_model("mha")
    with pytest.raises(ValueError, match="exceeds ModelConfig.seq_len = 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
