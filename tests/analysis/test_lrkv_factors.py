"""LRKV's factor diagnostics and the rank-r bound, on constructed cases whose answers are known."""

import numpy as np
import pytest
import torch

from headlab.analysis.heads import load_heads
from headlab.analysis.lrkv import (
    deviation_energy_kept,
    deviation_table,
    factor_table,
    norm_ratio,
    principal_angles,
    random_angle,
    rank_r_heads,
    rank_r_model,
)
from headlab.analysis.similarity import analyze
from headlab.model.config import preset
from headlab.model.gpt import GPT

RNG = np.random.default_rng(0)


def test_norm_ratio_is_the_residuals_frobenius_norm_over_the_shared_one():
    shared = RNG.standard_normal((12, 4))
    residuals = np.stack([0.5 * shared, -2.0 * shared])
    assert norm_ratio(shared, residuals) == pytest.approx([0.5, 2.0])


def test_principal_angles_of_nested_orthogonal_and_rotated_subspaces():
    e1, e2, e3 = np.eye(6)[:, :3].T
    shared = np.stack([e1, e2], axis=1)  # span{e1, e2}
    assert principal_angles(shared, np.outer(e1 + 3 * e2, [1.0, 2.0])) == pytest.approx([0.0], abs=1e-6)
    assert principal_angles(shared, e3[:, None]) == pytest.approx([90.0])
    tilted = (np.cos(np.pi / 6) * e1 + np.sin(np.pi / 6) * e3)[:, None]  # 30° out of the plane
    assert principal_angles(shared, tilted) == pytest.approx([30.0])
    # two directions: one inside, one orthogonal; the angles come sorted
    assert principal_angles(shared, np.stack([e3, e2], axis=1)) == pytest.approx([0.0, 90.0], abs=1e-6)
    assert principal_angles(shared, np.zeros((6, 2))).size == 0  # a zero residual spans nothing
    assert 0 < random_angle(32, 4, 2) < 90
    assert random_angle(8, 7, 1) < random_angle(64, 7, 1)  # a larger room leaves random subspaces further apart


def test_the_rank_r_bound_keeps_exactly_the_top_singular_energy():
    d, e = 10, 4
    left = np.linalg.qr(RNG.standard_normal((d, 2)))[0]
    right = np.linalg.qr(RNG.standard_normal((e, 2)))[0]
    deviation = left @ np.diag([3.0, 1.0]) @ right.T  # singular values 3 and 1
    mean = RNG.standard_normal((d, e))
    heads = np.stack([mean + deviation, mean - deviation])  # their mean is `mean`, each deviates by ±deviation
    assert deviation_energy_kept(heads, 1) == pytest.approx([0.9, 0.9])
    assert deviation_energy_kept(heads, 2) == pytest.approx([1.0, 1.0])
    assert deviation_energy_kept(np.stack([mean, mean]), 1) == pytest.approx([1.0, 1.0])  # nothing to keep
    assert np.allclose(rank_r_heads(heads, 2), heads)
    one = rank_r_heads(heads, 1)
    assert np.allclose(one.mean(axis=0), mean)
    assert [np.linalg.matrix_rank(h - mean, tol=1e-9) for h in one] == [1, 1]
    kept = np.linalg.norm(one - mean, axis=(1, 2)) ** 2 / np.linalg.norm(heads - mean, axis=(1, 2)) ** 2
    assert kept == pytest.approx([0.9, 0.9])


def _lrkv_model_with_residuals_inside_the_shared_space() -> GPT:
    torch.manual_seed(0)
    model = GPT(preset("tiny", "lrkv"))
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            h, r = attn.n_head, attn.rank
            # U_h = W_sharedᵀ M_h: every residual reads only what the shared projection reads
            mixing = torch.randn(h, attn.head_dim, r)
            attn.u_k.weight.copy_(torch.einsum("ed,her->hrd", attn.k_shared.weight, mixing).reshape(h * r, -1))
            attn.b_k.mul_(0.5)
    return model


def test_factor_table_on_an_lrkv_model_with_known_geometry():
    model = _lrkv_model_with_residuals_inside_the_shared_space()
    table = factor_table(model)
    keys = table[table["projection"] == "key"]
    assert len(keys) == model.config.n_layer * model.config.n_head
    assert keys["angle_max"].max() == pytest.approx(0.0, abs=1e-5)  # inside the shared space
    values = table[table["projection"] == "value"]
    assert (values["angle_mean"] > 20).all()  # random init: far from the shared space, like a random subspace
    assert values["angle_mean"].mean() == pytest.approx(values["angle_random"].iloc[0], abs=10)
    heads = load_heads(model)
    shared, residuals = heads.layer(1).decomposition("key")
    expected = np.linalg.norm(residuals, axis=(1, 2)) / np.linalg.norm(shared)
    assert keys[keys["layer"] == 1]["norm_ratio"].to_numpy() == pytest.approx(expected)
    with pytest.raises(ValueError, match="not an LRKV model"):
        factor_table(GPT(preset("tiny", "mha")))


def test_the_rank_r_bound_of_an_mha_model():
    model = GPT(preset("tiny", "mha"))
    e = model.config.head_dim
    table = deviation_table(model, ranks=(1, e))
    assert table[table["rank"] == e]["energy_kept"].to_numpy() == pytest.approx(1.0)
    assert (table[table["rank"] == 1]["energy_kept"] < 1).all()
    full = analyze(rank_r_model(model, e)).summary
    assert full["effective_rank"].to_numpy() == pytest.approx(analyze(model).summary["effective_rank"].to_numpy())
    none = load_heads(rank_r_model(model, 0)).layer(0)
    per_head_keys = none.wk.reshape(model.config.n_head, e, -1)
    assert np.allclose(per_head_keys, per_head_keys[0])  # rank 0: every head's key is the mean key
    with pytest.raises(ValueError, match="not an MHA model"):
        deviation_table(GPT(preset("tiny", "mqa")), ranks=(1,))
