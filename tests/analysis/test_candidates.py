"""The candidate measures of Fig. 11 (`headlab.analysis.candidates`) against their formulas computed
the long way (d × d forms and raw vectors, float64, at tiny d), and the properties that tell them
apart: which see the per-head gauge, which sum to H, what MQA's shared key gives."""

from __future__ import annotations

import numpy as np
import pytest

from headlab.analysis.candidates import (
    WEIGHT_CANDIDATES,
    data_aware_similarity,
    gaussian_like,
    trace_normalised,
    weight_candidates,
)
from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import input_moments
from headlab.analysis.layer_weights import GroupedWeights
from headlab.analysis.similarity import analyze
from shared_fixtures import tiny_model


def cosine(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1)
    return vectors @ vectors.T / np.outer(norms, norms)


def explicit(weights: GroupedWeights) -> dict[str, np.ndarray]:
    """The candidates from their definitions: every per-head d × d form and raw weight vector built."""
    h = weights.n_heads
    e = weights.wq.shape[0] // h
    group = h // (weights.wk.shape[0] // e)
    q = [weights.wq[i * e:(i + 1) * e].T for i in range(h)]  # W_Q,h: d × e
    k = [weights.wk[(i // group) * e:(i // group + 1) * e].T for i in range(h)]
    v = [weights.wv[(i // group) * e:(i // group + 1) * e].T for i in range(h)]
    o = [weights.wo[:, i * e:(i + 1) * e] for i in range(h)]  # W_O,hᵀ: d × e
    forms = np.stack([(a @ b.T).ravel() for a, b in zip(q, k)])
    raw = forms @ forms.T
    return {"weights": cosine(forms), "OV circuit": cosine(np.stack([(a @ b.T).ravel() for a, b in zip(v, o)])),
            "W_Q only": cosine(np.stack([(a @ a.T).ravel() for a in q])),
            "W_K only": cosine(np.stack([(b @ b.T).ravel() for b in k])),
            "raw weights": cosine(np.stack([np.concatenate([a.ravel(), b.ravel()]) for a, b in zip(q, k)])),
            "unnormalised": raw * h / np.trace(raw)}


@pytest.mark.parametrize("attention", ["mha", "gqa", "mqa"])
def test_every_candidate_is_its_formula(attention):
    weights = load_heads(tiny_model(attention)).layer(1)
    ours, theirs = weight_candidates(weights), explicit(weights)
    assert set(ours) == set(WEIGHT_CANDIDATES)
    for name in WEIGHT_CANDIDATES:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-10, atol=1e-12, err_msg=name)
        assert np.trace(ours[name]) == pytest.approx(weights.n_heads), name  # eigenvalues sum to H


def test_gauge_moves_only_the_raw_weights():
    """W_Q,h ↦ W_Q,h R_h, W_K,h ↦ W_K,h R_h (R_h orthogonal per head) leaves every form, so every
    gauge-invariant candidate, unchanged; the raw weights' cosines move."""
    weights = load_heads(tiny_model("mha")).layer(0)
    h, e = weights.n_heads, weights.wq.shape[0] // weights.n_heads
    rotations = [np.linalg.qr(np.random.default_rng(i).standard_normal((e, e)))[0] for i in range(h)]
    rotate = lambda w: np.concatenate([r.T @ w[i * e:(i + 1) * e] for i, r in enumerate(rotations)])  # noqa: E731
    turned = GroupedWeights(rotate(weights.wq), rotate(weights.wk), weights.wv, weights.wo, h)
    before, after = weight_candidates(weights), weight_candidates(turned)
    for name in ("weights", "W_Q only", "W_K only", "unnormalised"):
        np.testing.assert_allclose(after[name], before[name], atol=1e-12, err_msg=name)
    assert np.abs(after["raw weights"] - before["raw weights"]).max() > 1e-3


def test_mqa_key_sides_are_one_form_and_loud_heads_lead_the_unnormalised_spectrum():
    weights = load_heads(tiny_model("mqa")).layer(0)
    h, e = weights.n_heads, weights.wq.shape[0] // weights.n_heads
    np.testing.assert_allclose(weight_candidates(weights)["W_K only"], np.ones((h, h)), atol=1e-12)
    loud = weights.wq.copy()
    loud[:e] *= 100.0  # head 0's form 100x louder: its cosines are unchanged, its weight in G_raw is not
    louder = weight_candidates(GroupedWeights(loud, weights.wk, weights.wv, weights.wo, h))
    np.testing.assert_allclose(louder["weights"], weight_candidates(weights)["weights"], atol=1e-12)
    assert np.linalg.eigvalsh(louder["unnormalised"])[-1] > 0.99 * h


def test_trace_normalised_sums_to_h_and_refuses_an_empty_layer():
    raw = np.diag([4.0, 1.0, 1.0])
    np.testing.assert_allclose(np.linalg.eigvalsh(trace_normalised(raw)).sum(), 3.0)
    assert np.isnan(trace_normalised(np.zeros((3, 3)))).all()


@pytest.mark.parametrize("attention", ["gqa", "lrkv", "mla"])
def test_gaussian_like_keeps_shapes_and_sharing_and_draws_anew(attention):
    weights = load_heads(tiny_model(attention)).layer(0)
    drawn = gaussian_like(weights, np.random.default_rng(0))
    assert type(drawn) is type(weights)
    for name, value in vars(weights).items():
        if isinstance(value, np.ndarray) and not name.endswith("gain"):
            assert getattr(drawn, name).shape == value.shape and not np.allclose(getattr(drawn, name), value)
    assert all(np.all(v == 1) for n, v in vars(drawn).items() if n.endswith("gain") and v is not None)
    matrices = weight_candidates(drawn)
    assert all(np.isfinite(m).all() for m in matrices.values())


def test_data_aware_similarity_is_the_analysis_data_view(tokens):
    model = tiny_model("gqa")
    moments = input_moments(model, tokens)
    table = analyze(model, measure="data", inputs=moments).similarity
    heads = load_heads(model)
    for layer in range(heads.n_layers):
        expected = table[table["layer"] == layer].pivot(index="head_i", columns="head_j", values="value").to_numpy()
        np.testing.assert_allclose(data_aware_similarity(heads.layer(layer), moments.roots(layer)), expected,
                                   atol=1e-12)
    weights_view = weight_candidates(heads.layer(0))["weights"]
    assert np.abs(data_aware_similarity(heads.layer(0), moments.roots(0)) - weights_view).max() > 1e-3
