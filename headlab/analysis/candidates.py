"""What can the paper's Fig. 11 be? Candidate head similarities of one layer, each an H × H
symmetric matrix whose eigenvalues the figure could plot (issue 43; the paper, §4.3, defines the
first, and its text leaves room for the others):

    weights        G[i,j] = cos⟨A_i, A_j⟩_F,  A_h = W_Q,h W_K,hᵀ                      (Eq. 11)
    OV circuit     the same of A_h = W_V,h W_O,h (what head h writes for a token it reads)
    W_Q only       cos⟨W_Q,i W_Q,iᵀ, W_Q,j W_Q,jᵀ⟩_F = ‖W_Q,iᵀ W_Q,j‖²_F / (‖W_Q,iᵀ W_Q,i‖_F ‖W_Q,jᵀ W_Q,j‖_F):
                   the query sides alone, gauge-invariant (W_Q,h R drops out for orthogonal R)
    W_K only       the same of the key sides (1 for two heads of one KV group: MQA's are all 1)
    raw weights    cos⟨w_i, w_j⟩ of the stacked raw weights w_h = vec[W_Q,h; W_K,h]:
                   (tr(W_Q,iᵀ W_Q,j) + tr(W_K,iᵀ W_K,j)) / (‖w_i‖ ‖w_j‖), NOT gauge-invariant (the
                   comparison the paper rules out, kept as what an implementation might compute)
    unnormalised   G_raw · H / tr(G_raw), G_raw[i,j] = ⟨A_i, A_j⟩_F without the cosine: heads weigh
                   by ‖A_h‖², so a loud head can make λ₁ large; scaled to trace H like a cosine

and, needing the model's inputs, the data-aware view (`analyze(measure="data")`, ⟨A_i, A_j⟩_Σ) and
attention maps (`attention_similarity`, 1 − Jensen–Shannon distance). Every matrix here has trace
H, so its eigenvalues sum to H (a cosine's diagonal is 1): λ₁ / H is the share of the first.

Everything is float64 and built from e × e products of the heads' factors (`spectrum.Factors`),
never a d × d matrix.

    matrices = weight_candidates(model_heads.layer(0))        # name -> H × H matrix
    spectrum = similarity_spectrum(matrices["W_Q only"], "uncentered")
    baseline = gaussian_like(model_heads.layer(0), rng)        # the same shapes, N(0, 1) entries
"""

from __future__ import annotations

import dataclasses

import numpy as np

from headlab.analysis.gram import Factors, frobenius_gram, normalised_gram, power_of_two_scaled
from headlab.analysis.layer_weights import GroupedWeights, LayerWeights, LRKVWeights, MLAWeights
from headlab.analysis.spectrum import cosine_similarity

WEIGHT_CANDIDATES = ("weights", "OV circuit", "W_Q only", "W_K only", "raw weights", "unnormalised")
INPUT_CANDIDATES = ("data-aware", "attention maps")


def side_similarity(side: Factors) -> np.ndarray:
    """cos⟨F_i F_iᵀ, F_j F_jᵀ⟩_F of one side's factors: ⟨F_i F_iᵀ, F_j F_jᵀ⟩_F = ‖F_iᵀ F_j‖²_F, the
    Frobenius Gram of the forms with L_h = R_h = F_h (`frobenius_gram`), so invariant under F_h ↦ F_h R_h."""
    gram, live = normalised_gram(side, side)
    return cosine_similarity(gram, live)


def trace_gram(*sides: Factors) -> np.ndarray:
    """G[i,j] = Σ_sides tr(F_iᵀ F_j) = ⟨w_i, w_j⟩ for the stacked raw weights w_h = vec[F_h of every side]:
    the trace of each e × e product F_iᵀ F_j (shared blocks multiplied once, `Factors.products`)."""
    return sum(np.einsum("iaja->ij", side.products()) for side in sides)


def raw_weight_similarity(left: Factors, right: Factors) -> np.ndarray:
    """cos⟨vec[L_i; R_i], vec[L_j; R_j]⟩ = (tr(L_iᵀL_j) + tr(R_iᵀR_j)) / (‖w_i‖ ‖w_j‖), as stored (no
    per-side scaling: a side stored larger weighs more, as it would in a comparison of raw weights)."""
    return cosine_similarity(trace_gram(left, right))


def trace_normalised(raw: np.ndarray) -> np.ndarray:
    """G_raw · H / tr(G_raw): a Gram scaled so its eigenvalues sum to H, as a cosine matrix's do;
    NaN everywhere when the trace is 0 (no head has a form)."""
    raw = np.asarray(raw, dtype=np.float64)
    trace = np.trace(raw)
    return raw * (raw.shape[0] / trace) if trace > 0 else np.full_like(raw, np.nan)


def unnormalised_similarity(left: Factors, right: Factors) -> np.ndarray:
    """`trace_normalised` of G_raw[i,j] = ⟨A_i, A_j⟩_F (Eq. 11 before dividing by the norms), of each
    side scaled by one power of two for all its heads (`common_scale`: exact, and a common factor of
    G_raw, which the trace removes), so no product over- or underflows."""
    return trace_normalised(frobenius_gram(common_scale(left), common_scale(right)))


def common_scale(side: Factors) -> Factors:
    """The same factors with `matrix` and `base` each multiplied by the power of two that brings its
    largest entry into [½, 1): every head scaled alike, unlike `Factors.normalised` (one scale per head)."""
    base = None if side.base is None else power_of_two_scaled(side.base)
    return dataclasses.replace(side, matrix=power_of_two_scaled(side.matrix), base=base)


def data_aware_similarity(weights: LayerWeights, roots: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """cos⟨A_i, A_j⟩_Σ = tr(A_iᵀ Σ_q A_j Σ_k) / norms (`spectrum.data_gram`), the data-aware view of the QK
    forms, with `roots` = (R_q, R_k), RᵀR = Σ (`InputMoments.roots`)."""
    return cosine_similarity(*normalised_gram(*qk_factors(weights), *roots))


def qk_factors(weights: LayerWeights) -> tuple[Factors, Factors]:
    """(W_Q,h, W_K,h) factors of every family: MLA's whole score form (decoupled RoPE part included)."""
    return weights.factors("qk", "included") if isinstance(weights, MLAWeights) else weights.factors("qk")


def weight_candidates(weights: LayerWeights) -> dict[str, np.ndarray]:
    """Every candidate of WEIGHT_CANDIDATES for one layer, name -> H × H matrix of trace H."""
    query, key = qk_factors(weights)
    gram, live = normalised_gram(query, key)
    return {"weights": cosine_similarity(gram, live),
            "OV circuit": cosine_similarity(*normalised_gram(*weights.factors("ov"))),
            "W_Q only": side_similarity(query), "W_K only": side_similarity(key),
            "raw weights": raw_weight_similarity(query, key), "unnormalised": unnormalised_similarity(query, key)}


def gaussian_like(weights: LayerWeights, rng: np.random.Generator) -> LayerWeights:
    """The random-weights baseline: the same layer with every projection matrix (and LRKV's B_h)
    drawn i.i.d. N(0, 1) at its own shape (shared KV blocks stay shared, so MQA's heads still read
    one key), and norm gains dropped (γ = 1). Cosines do not see a common scale, so N(0, 1) stands
    for any N(0, σ²)."""
    if not isinstance(weights, (GroupedWeights, LRKVWeights, MLAWeights)):
        raise TypeError(f"no random baseline for {type(weights).__name__}")
    fields = {name: value for name, value in vars(weights).items() if isinstance(value, np.ndarray)}
    draw = {name: rng.standard_normal(value.shape) for name, value in fields.items() if not name.endswith("gain")}
    gains = {name: None if isinstance(weights, GroupedWeights) else np.ones_like(value)
             for name, value in fields.items() if name.endswith("gain")}
    return dataclasses.replace(weights, **draw, **gains)
