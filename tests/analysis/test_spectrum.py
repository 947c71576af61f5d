"""headlab.analysis.spectrum: closed forms, gauge invariance, brute force against explicit d × d forms,
and the documented answers for degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest

from headlab.analysis.gram import Factors, frobenius_gram
from headlab.analysis.spectrum import (
    cosine_similarity,
    double_center,
    eigenspectrum,
    entropy_effective_rank,
    n_components,
    participation_ratio,
    similarity_spectrum,
)

H, D, E = 6, 40, 5


def _per_head(blocks: np.ndarray) -> Factors:
    """Factors from an (H, d, e) stack of per-head matrices."""
    h, d, e = blocks.shape
    return Factors.per_head(blocks.transpose(1, 0, 2).reshape(d, h * e), e)


def _random_factors(rng, h=H, d=D, e=E) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((h, d, e)), rng.standard_normal((h, d, e))


def _layer_similarity(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return cosine_similarity(frobenius_gram(_per_head(q), _per_head(k)))


def _explicit_gram(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """⟨A_i, A_j⟩_F with every A_h = L_h R_hᵀ formed as a d × d matrix."""
    forms = np.einsum("hde,hfe->hdf", left, right)
    return np.einsum("idf,jdf->ij", forms, forms)


# ---- closed forms ------------------------------------------------------------------------------

def test_identical_heads_closed_form():
    rng = np.random.default_rng(0)
    q, k = _random_factors(rng, h=1)
    g = _layer_similarity(np.repeat(q, H, 0), np.repeat(k, H, 0))
    np.testing.assert_allclose(g, np.ones((H, H)), atol=1e-12)

    unc = similarity_spectrum(g, "uncentered")
    np.testing.assert_allclose(unc.eigenvalues, [H] + [0] * (H - 1), atol=1e-12)
    assert unc.effective_rank == pytest.approx(1.0)
    assert unc.participation_ratio == pytest.approx(1.0)
    assert unc.n_components_90 == 1
    assert unc.effective_rank_pct_of_heads == pytest.approx(100 / H)

    # Centering removes the only direction: the documented answer is an all-zero spectrum.
    cen = similarity_spectrum(g, "centered")
    assert not cen.eigenvalues.any()
    assert not cen.variance_ratio.any() and not cen.cumulative.any()
    assert (cen.effective_rank, cen.participation_ratio, cen.n_components_90) == (0.0, 0.0, 0)
    assert cen.effective_rank_pct_of_heads == 0.0 and cen.effective_rank_pct_of_ceiling == 0.0


def test_orthogonal_heads_closed_form():
    """Queries on disjoint coordinates make every pair of forms orthogonal: G = I."""
    rng = np.random.default_rng(1)
    h, e = 10, 3
    d = h * e
    q = np.eye(d).reshape(d, h, e).transpose(1, 0, 2)  # head h reads coordinates h·e … h·e+e−1
    k = rng.standard_normal((h, d, e))
    g = _layer_similarity(q, k)
    np.testing.assert_allclose(g, np.eye(h), atol=1e-12)

    unc = similarity_spectrum(g, "uncentered")
    np.testing.assert_allclose(unc.eigenvalues, np.ones(h), atol=1e-12)
    assert unc.effective_rank == pytest.approx(h)
    assert unc.participation_ratio == pytest.approx(h)
    assert unc.n_components_90 == 9  # cumulative 0.9 is reached exactly at 9 of 10 equal values
    assert unc.effective_rank_pct_of_ceiling == pytest.approx(100.0)

    cen = similarity_spectrum(g, "centered")
    np.testing.assert_allclose(cen.eigenvalues, [1.0] * (h - 1) + [0.0], atol=1e-12)
    assert cen.effective_rank == pytest.approx(h - 1)
    assert cen.ceiling == h - 1
    assert cen.effective_rank_pct_of_heads == pytest.approx(100 * (h - 1) / h)  # the paper's % of H
    assert cen.effective_rank_pct_of_ceiling == pytest.approx(100.0)


def test_metric_formulas_on_a_known_spectrum():
    lam = np.array([2.0, 1.0, 1.0, 0.0])  # v = (1/2, 1/4, 1/4, 0)
    assert entropy_effective_rank(lam) == pytest.approx(2 ** 1.5)  # exp(1.5 ln 2)
    assert participation_ratio(lam) == pytest.approx(16 / 6)
    assert n_components(lam, 0.5) == 1 and n_components(lam, 0.74) == 2 and n_components(lam, 0.9) == 3


def test_double_centering_is_J_G_J():
    rng = np.random.default_rng(2)
    g = _layer_similarity(*_random_factors(rng))
    j = np.eye(H) - np.ones((H, H)) / H
    np.testing.assert_allclose(double_center(g), j @ g @ j, atol=1e-14)


# ---- gauge invariance --------------------------------------------------------------------------

def test_gauge_invariance_while_raw_weights_change():
    """W_Q,h → W_Q,h M_h and W_K,h → W_K,h M_h⁻ᵀ leaves every A_h, hence G, unchanged; a naive
    cosine between heads' raw W_Q (or W_K) weights does change."""
    rng = np.random.default_rng(3)
    q, k = _random_factors(rng)
    m = rng.standard_normal((H, E, E)) + 2 * np.eye(E)  # random, well-conditioned, invertible
    q2 = q @ m
    k2 = k @ np.linalg.inv(m).transpose(0, 2, 1)

    np.testing.assert_allclose(_layer_similarity(q2, k2), _layer_similarity(q, k), atol=1e-8)

    def naive(w):  # cosine of flattened raw weights: what the paper says is not gauge-invariant
        flat = w.reshape(H, -1)
        unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
        return unit @ unit.T

    assert np.abs(naive(q2) - naive(q)).max() > 0.05
    assert np.abs(naive(k2) - naive(k)).max() > 0.05


# ---- brute force -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["products", "reduced"])
@pytest.mark.parametrize("layout", ["per_head", "grouped", "latent_metric", "latent_materialised"])
def test_gram_equals_explicit_d_by_d(layout, method):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((D, H * E))
    left = Factors.per_head(q, E)
    if layout == "per_head":
        right = Factors.per_head(rng.standard_normal((D, H * E)), E)
    elif layout == "grouped":  # 3 KV heads shared by pairs of query heads
        right = Factors.grouped(rng.standard_normal((D, 3 * E)), E, H)
        assert right.n_blocks == 3 and list(right.index) == [0, 0, 1, 1, 2, 2]
    elif layout == "latent_metric":  # small latent: products are taken through baseᵀ base
        right = Factors.per_head(rng.standard_normal((4, H * E)), E, base=rng.standard_normal((D, 4)))
    else:  # a base wider than d: the factors are materialised first
        right = Factors.per_head(rng.standard_normal((50, H * E)), E, base=rng.standard_normal((D, 50)))
    raw = frobenius_gram(left, right, method)
    brute = _explicit_gram(left.heads(), right.heads())
    np.testing.assert_allclose(raw, brute, rtol=1e-10, atol=1e-10 * np.abs(brute).max())


def test_reduced_route_with_a_singular_shared_block():
    """A zero KV group makes the key Gram singular: its square root falls back from Cholesky to
    an eigendecomposition, and the Gram still matches brute force."""
    rng = np.random.default_rng(9)
    keys = rng.standard_normal((D, 3 * E))
    keys[:, E:2 * E] = 0.0
    left, right = Factors.per_head(rng.standard_normal((D, H * E)), E), Factors.grouped(keys, E, H)
    brute = _explicit_gram(left.heads(), right.heads())
    np.testing.assert_allclose(frobenius_gram(left, right, "reduced"), brute, atol=1e-10 * np.abs(brute).max())


def test_reduced_route_is_refused_when_it_would_form_d_by_d():
    rng = np.random.default_rng(8)
    full = Factors.per_head(rng.standard_normal((H * E, H * E)), E)  # d = H·e: no narrow side
    with pytest.raises(ValueError, match="d × d"):
        frobenius_gram(full, full, "reduced")
    with pytest.raises(ValueError, match="method"):
        frobenius_gram(full, full, "svd")


def test_head_norms_match_materialised_heads():
    rng = np.random.default_rng(5)
    f = Factors.per_head(rng.standard_normal((4, H * E)), E, base=rng.standard_normal((D, 4)))
    expected = np.linalg.norm(f.heads(), axis=(1, 2))
    np.testing.assert_allclose(f.head_norms(), expected, rtol=1e-12)
    assert f.normalised().block_gram.shape == (H * E, H * E)  # once computed, the norms come off its diagonal
    np.testing.assert_allclose(f.head_norms(), expected, rtol=1e-12)


# ---- degenerate and invalid input --------------------------------------------------------------

def test_zero_weight_head_has_nan_similarity_and_is_left_out_of_the_spectrum():
    rng = np.random.default_rng(6)
    q, k = _random_factors(rng)
    q[2] = 0.0
    g = _layer_similarity(q, k)
    assert np.isnan(g[2]).all() and np.isnan(g[:, 2]).all()  # diagonal included: a dead head has no direction
    live = np.delete(np.delete(g, 2, 0), 2, 1)
    assert np.isfinite(live).all()
    np.testing.assert_allclose(np.diag(live), 1.0)
    for kind in ("uncentered", "centered"):
        s, alone = similarity_spectrum(g, kind), similarity_spectrum(live, kind)
        # The spectrum is the 5 live heads' own, then NaN for the eigenvalue that does not exist;
        # the rank is theirs, its percentage of all 6 heads.
        np.testing.assert_array_equal(s.eigenvalues, [*alone.eigenvalues, np.nan])
        assert s.effective_rank == alone.effective_rank
        assert s.effective_rank_pct_of_heads == pytest.approx(100 * alone.effective_rank / H)


def test_all_heads_dead_gives_nan_metrics():
    g = cosine_similarity(np.zeros((H, H)))
    assert np.isnan(g).all()
    for kind in ("uncentered", "centered"):
        s = similarity_spectrum(g, kind)
        assert np.isnan(s.eigenvalues).all() and np.isnan(s.cumulative).all()
        assert np.isnan([s.effective_rank, s.participation_ratio, s.n_components_90,
                         s.effective_rank_pct_of_heads, s.effective_rank_pct_of_ceiling]).all()


def test_round_off_is_clipped_but_non_psd_is_rejected():
    rng = np.random.default_rng(7)
    g = _layer_similarity(*_random_factors(rng, h=3))
    v = np.linalg.eigh(g)[1]
    tiny_negative = g - (np.linalg.eigvalsh(g)[0] + 1e-13) * np.outer(v[:, 0], v[:, 0])
    assert np.linalg.eigvalsh(tiny_negative)[0] < 0
    assert eigenspectrum(tiny_negative)[-1] == 0.0

    with pytest.raises(ValueError, match="positive semi-definite"):
        eigenspectrum(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="not symmetric"):
        eigenspectrum(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="kind"):
        similarity_spectrum(np.eye(2), "raw")


def test_invalid_factors_are_rejected():
    with pytest.raises(ValueError, match="head_dim"):
        Factors.per_head(np.zeros((4, 7)), 2)
    with pytest.raises(ValueError, match="index"):
        Factors(np.zeros((4, 6)), 2, np.array([0, 3]))
    with pytest.raises(ValueError, match="base"):
        Factors.per_head(np.zeros((4, 6)), 2, base=np.zeros((5, 3)))
    with pytest.raises(ValueError, match="disagree"):
        frobenius_gram(Factors.per_head(np.ones((4, 6)), 2), Factors.per_head(np.ones((4, 8)), 2))
