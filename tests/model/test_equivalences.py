"""Families that must coincide when their weights are tied the right way."""

import torch

from headlab import GPT
from shared_fixtures import tiny_model


def _copy_shared_weights(source: GPT, target: GPT) -> None:
    """Copy every parameter whose name and shape agree (embeddings, norms, MLPs, queries, outputs)."""
    target_params = dict(target.named_parameters())
    with torch.no_grad():
        for name, p in source.named_parameters():
            if name in target_params and target_params[name].shape == p.shape:
                target_params[name].copy_(p)


def _assert_same_logits(a: GPT, b: GPT, tokens, atol=1e-5):
    logits_a, logits_b = a(tokens)[0], b(tokens)[0]
    assert logits_a.abs().max() > 1.0
    assert (logits_a - logits_b).abs().max().item() <= atol


def test_gqa_equals_mha_whose_heads_share_k_and_v_within_each_group(tokens):
    gqa = tiny_model("gqa")
    mha = tiny_model("mha", seed=1)
    _copy_shared_weights(gqa, mha)
    group_size = gqa.config.n_head // gqa.config.n_kv_head
    dh = gqa.config.head_dim
    with torch.no_grad():
        for g_block, m_block in zip(gqa.blocks, mha.blocks):
            for proj in ("c_k", "c_v"):
                grouped = getattr(g_block.attn, proj).weight.view(gqa.config.n_kv_head, dh, -1)
                repeated = grouped.repeat_interleave(group_size, dim=0).reshape(-1, grouped.size(-1))
                getattr(m_block.attn, proj).weight.copy_(repeated)
    _assert_same_logits(gqa, mha, tokens)


def test_lrkv_with_zero_residual_equals_mqa(tokens):
    mqa = tiny_model("mqa")
    lrkv = tiny_model("lrkv", seed=1)
    _copy_shared_weights(mqa, lrkv)
    with torch.no_grad():
        for m_block, l_block in zip(mqa.blocks, lrkv.blocks):
            l_block.attn.k_shared.weight.copy_(m_block.attn.c_k.weight)
            l_block.attn.v_shared.weight.copy_(m_block.attn.c_v.weight)
            l_block.attn.b_k.zero_()
            l_block.attn.b_v.zero_()
    _assert_same_logits(mqa, lrkv, tokens)
    cache = lrkv.new_cache(2, tokens.size(1))
    steps = [lrkv(tokens[:, :12], cache=cache)[0]] + [lrkv(tokens[:, t:t + 1], cache=cache)[0] for t in range(12, 24)]
    assert (torch.cat(steps, 1) - mqa(tokens)[0]).abs().max().item() <= 1e-4


def _lrkv_factors_from_svd(per_head_weight: torch.Tensor, rank: int):
    """W_h (d x d_h) = P S Qᵀ  ->  U_h = P √S (d x r), B_h = Q √S (d_h x r)."""
    p, s, qt = torch.linalg.svd(per_head_weight.double(), full_matrices=False)
    root = s.sqrt()
    return (p * root)[:, :rank], (qt.mT * root)[:, :rank]


def test_lrkv_at_full_rank_with_zero_shared_projection_reproduces_any_mha(tokens):
    mha = tiny_model("mha")
    dh = mha.config.head_dim
    lrkv = tiny_model("lrkv", seed=1, kv_rank=dh)
    _copy_shared_weights(mha, lrkv)
    n_head = mha.config.n_head
    with torch.no_grad():
        for m_block, l_block in zip(mha.blocks, lrkv.blocks):
            for proj, shared, u, b in (("c_k", "k_shared", "u_k", "b_k"), ("c_v", "v_shared", "u_v", "b_v")):
                getattr(l_block.attn, shared).weight.zero_()
                per_head = getattr(m_block.attn, proj).weight.view(n_head, dh, -1).mT  # W_h: (d, d_h)
                u_rows = getattr(l_block.attn, u).weight.view(n_head, dh, -1)  # U_hᵀ
                for h in range(n_head):
                    u_h, b_h = _lrkv_factors_from_svd(per_head[h], dh)
                    u_rows[h].copy_(u_h.mT)
                    getattr(l_block.attn, b)[h].copy_(b_h)
    _assert_same_logits(mha, lrkv, tokens)


def test_lrkv_initial_residuals_are_a_tenth_of_the_shared_projection():
    model = GPT(tiny_model("lrkv").config)
    for block in model.blocks:
        for which, shared in (("k", block.attn.k_shared), ("v", block.attn.v_shared)):
            residual_norms = torch.linalg.matrix_norm(block.attn.residual_weights(which))
            expected = 0.1 * torch.linalg.matrix_norm(shared.weight)
            torch.testing.assert_close(residual_norms, expected.expand_as(residual_norms), rtol=1e-4, atol=0)
