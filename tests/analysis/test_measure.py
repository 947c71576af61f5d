"""The data-aware inner product ⟨A_i, A_j⟩_Σ = tr(A_iᵀ Σ_q A_j Σ_k) (spectrum.data_gram), the input
moments it reads (headlab.analysis.inputs) and the `measure` option of analyze() / `headlab analyze`.

Brute force here forms every A_h = L_h R_hᵀ as an explicit d × d matrix (tiny models only)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from headlab import preset, train, train_preset
from headlab.analysis.gram import Factors, data_gram, frobenius_gram
from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import InputMoments, encode_text, input_moments, second_moment_root
from headlab.analysis.measures import measure_agreement
from headlab.analysis.similarity import Analysis, analyze, concat
from headlab.cli.main import main as cli_main
from headlab.data.sources import synthetic_texts
from headlab.schema import FAMILIES
from shared_fixtures import tiny_model

FAMILY_CASES = [*((family, {}) for family in FAMILIES), ("mla", {"q_latent_dim": 6})]  # and MLA's query latent
FAMILY_IDS = [*FAMILIES, "mla-qlatent"]


def _moment(rng, d: int, rank: int | None = None) -> np.ndarray:
    """A random second-moment matrix E[x xᵀ] of rank `rank` (default full)."""
    m = rng.standard_normal((d, rank or d)) / np.sqrt(d)
    return m @ m.T


def _explicit_data_gram(left: np.ndarray, right: np.ndarray, sigma_l: np.ndarray, sigma_r: np.ndarray) -> np.ndarray:
    """tr(A_iᵀ Σ_L A_j Σ_R) with every A_h = L_h R_hᵀ formed as a d × d matrix."""
    forms = np.einsum("hde,hfe->hdf", left, right)
    return np.einsum("idf,de,jeg,gf->ij", forms, sigma_l, forms, sigma_r, optimize=True)


def _per_head(blocks: np.ndarray) -> Factors:
    h, d, e = blocks.shape
    return Factors.per_head(blocks.transpose(1, 0, 2).reshape(d, h * e), e)


# ---- the inner product -------------------------------------------------------------------------

def test_data_gram_is_the_expected_product_of_scores_on_independent_inputs():
    """Exact: tr(A_iᵀ Σ_q A_j Σ_k) with explicit A_h. Statistical: the sample mean of
    (x_qᵀA_i x_k)(x_qᵀA_j x_k) over independent draws, within 5 standard errors, with key
    inputs off-centre (a second moment, not a covariance) and Σ_q ≠ Σ_k."""
    rng = np.random.default_rng(0)
    h, d, e, n = 4, 5, 2, 200_000
    left, right = rng.standard_normal((h, d, e)), rng.standard_normal((h, d, e))
    chol_q, chol_k = (np.linalg.cholesky(_moment(rng, d)) for _ in range(2))
    mean_k = rng.standard_normal(d)
    sigma_q = chol_q @ chol_q.T
    sigma_k = chol_k @ chol_k.T + np.outer(mean_k, mean_k)

    ours = data_gram(_per_head(left), _per_head(right), second_moment_root(sigma_q), second_moment_root(sigma_k))
    exact = _explicit_data_gram(left, right, sigma_q, sigma_k)
    np.testing.assert_allclose(ours, exact, rtol=1e-10, atol=1e-12)

    x_q = rng.standard_normal((n, d)) @ chol_q.T
    x_k = rng.standard_normal((n, d)) @ chol_k.T + mean_k
    forms = np.einsum("hde,hfe->hdf", left, right)
    scores = np.einsum("nd,hdf,nf->nh", x_q, forms, x_k)  # x_qᵀ A_h x_k per draw
    products = scores[:, :, None] * scores[:, None, :]
    standard_error = products.std(axis=0) / np.sqrt(n)
    assert (np.abs(products.mean(axis=0) - ours) < 5 * standard_error).all()
    # the check has power: the plain Frobenius Gram is far outside the same band
    assert (np.abs(products.mean(axis=0) - frobenius_gram(_per_head(left), _per_head(right)))
            > 5 * standard_error).any()


@pytest.mark.parametrize("attention,overrides", FAMILY_CASES, ids=FAMILY_IDS)
def test_every_family_against_explicit_forms(attention, overrides):
    """Each family's factor layout (shared KV blocks, LRKV's basis, MLA's latents), both circuits,
    every Gram route, against explicit d × d forms; one Σ is singular (inputs in a subspace)."""
    rng = np.random.default_rng(1)
    weights = load_heads(tiny_model(attention, **overrides)).layer(1)
    for circuit in ("qk", "ov"):
        left, right = weights.factors(circuit)
        d = left.dim
        sigma_l, sigma_r = _moment(rng, d), _moment(rng, d, rank=d // 2)
        exact = _explicit_data_gram(left.heads(), right.heads(), sigma_l, sigma_r)
        roots = second_moment_root(sigma_l), second_moment_root(sigma_r)
        reducible = left.rank_bound < left.dim or right.rank_bound < right.dim
        for method in ("auto", "products") + (("reduced",) if reducible else ()):
            np.testing.assert_allclose(data_gram(left, right, *roots, method), exact, rtol=1e-10,
                                       atol=1e-10 * np.abs(exact).max())


@pytest.mark.parametrize("attention,overrides", FAMILY_CASES, ids=FAMILY_IDS)
def test_identity_moments_give_exactly_the_frobenius_gram(attention, overrides):
    weights = load_heads(tiny_model(attention, **overrides)).layer(0)
    for circuit in ("qk", "ov"):
        left, right = weights.factors(circuit)
        identity = second_moment_root(np.eye(left.dim))
        np.testing.assert_allclose(data_gram(left, right, identity, identity), frobenius_gram(left, right),
                                   rtol=0, atol=1e-12)


def test_second_moment_root_refuses_what_is_not_a_second_moment():
    rng = np.random.default_rng(2)
    sigma = _moment(rng, 6, rank=3)
    root = second_moment_root(sigma)
    np.testing.assert_allclose(root.T @ root, sigma, atol=1e-12)
    with pytest.raises(ValueError, match="positive semi-definite"):
        second_moment_root(sigma - 0.1 * np.eye(6))
    with pytest.raises(ValueError, match="symmetric"):
        second_moment_root(sigma + np.triu(np.ones((6, 6)), 1))
    with pytest.raises(ValueError, match="square"):
        second_moment_root(np.ones((6, 5)))
    f = Factors.per_head(np.ones((6, 4)), 2)
    with pytest.raises(ValueError, match=r"left_root must be \(6, 6\)"):
        data_gram(f, f, np.eye(5), None)


# ---- input moments -----------------------------------------------------------------------------

@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_input_moments_are_those_of_the_attention_input(attention, tokens):
    """Σ of layer l = mean of x xᵀ over every position, x = the block's pre-norm output, computed
    here by running the blocks by hand."""
    model = tiny_model(attention)
    moments = input_moments(model, tokens)
    with torch.no_grad():
        x = model.wte(tokens)
        for layer, block in enumerate(model.blocks):
            a = block.norm_attn(x).reshape(-1, x.size(-1)).double()
            expected = (a.T @ a / a.size(0)).numpy()
            np.testing.assert_allclose(moments.query[layer], expected, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(moments.key[layer], expected, rtol=1e-6, atol=1e-9)
            x = block(x, model.rope_cos, model.rope_sin)
    assert moments.n_tokens == tokens.numel() and moments.n_layers == model.config.n_layer


def test_analyze_with_the_data_measure(tokens):
    model = tiny_model("gqa")
    moments = input_moments(model, tokens)
    data = analyze(model, label="G", circuit="both", measure="data", inputs=moments)
    plain = analyze(model, label="G", circuit="both")
    for name in ("similarity", "spectra", "summary"):
        assert set(getattr(data, name)["measure"]) == {"data"}
        assert set(getattr(plain, name)["measure"]) == {"frobenius"}
    # the measure moves the numbers, and both land side by side in one set of tables
    assert not np.allclose(data.similarity["value"], plain.similarity["value"])
    both = concat([plain, data])
    assert len(both.summary) == 2 * len(plain.summary)
    # Σ = I reproduces the Frobenius tables exactly
    d, n_layers = model.config.d_model, model.config.n_layer
    identity = np.broadcast_to(np.eye(d), (n_layers, d, d))
    flat = analyze(model, label="G", circuit="both", measure="data", inputs=InputMoments(identity, identity, 1))
    np.testing.assert_allclose(flat.summary["effective_rank"], plain.summary["effective_rank"], rtol=0, atol=1e-12)


def test_measure_option_mistakes_are_refused(tokens):
    model = tiny_model("mha")
    moments = input_moments(model, tokens)
    with pytest.raises(ValueError, match="measure = 'cosine' is invalid: allowed values are frobenius, data"):
        analyze(model, measure="cosine")
    with pytest.raises(ValueError, match="measure 'data' needs inputs"):
        analyze(model, measure="data")
    with pytest.raises(ValueError, match="only it uses them"):
        analyze(model, inputs=moments)
    short = InputMoments(moments.query[:1], moments.key[:1], moments.n_tokens)
    with pytest.raises(ValueError, match="moments of 1 layers but .* has 2"):
        analyze(model, measure="data", inputs=short)
    with pytest.raises(ValueError, match="tokenizer = 'byte' or 'gpt2'"):
        encode_text(model, "some text")


def test_cli_data_measure_on_a_trained_run_folder(tmp_path, capsys):
    """The run folder names its tokenizer; Σ comes from the run's own forward pass on --text."""
    run = train(preset("tiny", "lrkv"), train_preset("tiny", steps=2, eval_every=2, checkpoint_every=2), "synthetic",
                out=tmp_path / "run", progress=False)
    text = tmp_path / "text.txt"
    text.write_text("".join(synthetic_texts(2000, seed=1)))
    out = tmp_path / "out"
    assert cli_main(["analyze", str(run.path), "--measure", "data", "--text", str(text), "--out", str(out)]) == 0
    assert f"{run.model_config.label} · qk · data · 4 heads" in capsys.readouterr().out
    moments = input_moments(run.model, encode_text(run.model, text.read_text(), tokenizer="byte"))
    expected = analyze(run.model, measure="data", inputs=moments)
    np.testing.assert_allclose(Analysis.load(out).summary["effective_rank"], expected.summary["effective_rank"],
                               rtol=1e-9)
    assert cli_main(["analyze", str(run.path), "--measure", "data", "--text", str(tmp_path / "none.txt"),
                     "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_measure_agreement_ranks_layers_and_seeds():
    layers = np.arange(4)
    rows = []
    for seed in (0, 1):
        for layer in layers:
            for measure, rank in (("frobenius", layer + seed), ("data", 10 - layer - seed), ("other", layer % 2)):
                rows.append({"model": "M", "circuit": "qk", "kind": "centered", "measure": measure, "layer": layer,
                             "seed": seed, "effective_rank": float(rank)})
    agreement = measure_agreement(pd.DataFrame(rows)).set_index(["measure_a", "measure_b"])
    assert agreement.loc[("frobenius", "data"), "spearman"] == pytest.approx(-1.0)  # exactly reversed order
    assert agreement.loc[("frobenius", "data"), "n_points"] == 8  # 4 layers × 2 seeds
    expected = spearmanr([layer + seed for seed in (0, 1) for layer in layers],
                         [layer % 2 for _ in (0, 1) for layer in layers])
    assert agreement.loc[("frobenius", "other"), "spearman"] == pytest.approx(expected.statistic)
    with pytest.raises(ValueError, match="several rows for model 'M', circuit qk, measure frobenius, layer 0"):
        measure_agreement(pd.DataFrame(rows).drop(columns="seed"))
