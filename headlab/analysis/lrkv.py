"""LRKV's factors, and the best a rank-r residual could do (the paper's §4 diagnostics, in numbers).

    factor_table(heads)                    # LRKV: ‖U_h B_hᵀ‖/‖W_shared‖ and principal angles, per head
    deviation_table(heads, ranks=(4, 16))  # MHA: how much of W_h − W̄ a rank-r residual can hold

An LRKV layer's key (and value) projection of head h is W_h = W_shared + U_h B_hᵀ (d × e, rank of
the residual ≤ r). Three questions about it, each a pure function below:
  * how large the residual is next to the shared part: ‖U_h B_hᵀ‖_F / ‖W_shared‖_F;
  * whether it reads new directions of the residual stream or the shared ones: the principal
    angles between col(W_shared) (e-dimensional) and col(U_h B_hᵀ) (≤ r-dimensional) in R^d —
    0° means the residual only re-weights what the shared projection already reads, and a random
    subspace of the same shape sits near the `random_angle` reference;
  * what an ideal rank-r residual could do for an MHA model: with W̄ = (1/H) Σ_h W_h and
    D_h = W_h − W̄, the best rank-r approximation [D_h]_r (Eckart–Young: the truncated SVD) keeps
    Σ_{i≤r} σ_i² / Σ_i σ_i² of the deviation's energy, and MHA rebuilt as W̄ + [D_h]_r has the
    head similarity that a perfectly trained LRKV of rank r (with W_shared = W̄) could reach.
All in float64 on the raw weights (no gauge is fixed: W_Q M and W_K M⁻ᵀ score alike, so these are
statements about the parameterisation the optimizer sees, as LRKV's own factors are).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.linalg

from headlab.analysis.heads import load_heads
from headlab.analysis.layer_weights import GroupedWeights, LRKVWeights, ModelHeads

PROJECTIONS = ("key", "value")
RANK_TOLERANCE = 1e-10  # singular values below this fraction of the largest span nothing
RANDOM_DRAWS = 64  # random subspaces behind the `random_angle` reference


def norm_ratio(shared: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """‖R_h‖_F / ‖W_shared‖_F for residuals R_h (H, d, e) and W_shared (d, e)."""
    return np.linalg.norm(residuals, axis=(1, 2)) / np.linalg.norm(shared)


def column_space(matrix: np.ndarray) -> np.ndarray:
    """An orthonormal basis (d, k) of col(matrix), k its numerical rank (singular values above
    `RANK_TOLERANCE` times the largest)."""
    left, singular, _ = np.linalg.svd(matrix, full_matrices=False)
    return left[:, singular > RANK_TOLERANCE * max(singular.max(initial=0.0), np.finfo(float).tiny)]


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The principal angles (degrees, ascending) between col(a) and col(b): arccos of the
    singular values of Q_aᵀ Q_b, min(rank a, rank b) of them (scipy's `subspace_angles`)."""
    qa, qb = column_space(a), column_space(b)
    if qa.shape[1] == 0 or qb.shape[1] == 0:
        return np.zeros(0)
    return np.sort(np.degrees(scipy.linalg.subspace_angles(qa, qb)))


def random_angle(d: int, e: int, r: int, seed: int = 0) -> float:
    """The mean principal angle (degrees) between an e-dimensional and an independent random
    r-dimensional subspace of R^d (Gaussian draws, `RANDOM_DRAWS` of them): what 'unrelated' looks like."""
    rng = np.random.default_rng(seed)
    return float(np.mean([principal_angles(rng.standard_normal((d, e)), rng.standard_normal((d, r))).mean()
                          for _ in range(RANDOM_DRAWS)]))


def deviation_energy_kept(heads: np.ndarray, rank: int) -> np.ndarray:
    """Per head, the fraction Σ_{i≤r} σ_i² / Σ σ_i² of D_h = W_h − W̄ (heads: (H, d, e)) that its
    best rank-r approximation keeps; 1 where D_h is zero."""
    singular = np.linalg.svd(heads - heads.mean(axis=0), compute_uv=False) ** 2  # (H, min(d, e))
    total = singular.sum(axis=1)
    return np.divide(singular[:, :rank].sum(axis=1), total, out=np.ones_like(total), where=total > 0)


def rank_r_heads(heads: np.ndarray, rank: int) -> np.ndarray:
    """W̄ + [W_h − W̄]_r for every head (H, d, e): the heads a rank-r LRKV could at best represent."""
    mean = heads.mean(axis=0)
    left, singular, right = np.linalg.svd(heads - mean, full_matrices=False)
    return mean + np.einsum("hdk,hk,hke->hde", left[..., :rank], singular[:, :rank], right[:, :rank])


def _projection_heads(weights: GroupedWeights, projection: str) -> np.ndarray:
    """An MHA layer's per-head W_h (H, d, e) of the key or value projection."""
    stacked = weights.wk if projection == "key" else weights.wv  # (H·e, d)
    return stacked.reshape(weights.n_heads, -1, stacked.shape[1]).transpose(0, 2, 1)


def factor_table(source, label: str | None = None) -> pd.DataFrame:
    """Per LRKV layer, projection and head: norm_ratio (‖U_h B_hᵀ‖_F / ‖W_shared‖_F), the mean,
    smallest and largest principal angle between the shared and the residual column spaces, and
    the `random_angle` reference for their shapes. Columns: model, layer, projection, head,
    norm_ratio, angle_mean, angle_min, angle_max, angle_random (degrees)."""
    heads = load_heads(source, label)
    rows = []
    for layer in range(heads.n_layers):
        weights = heads.layer(layer)
        if not isinstance(weights, LRKVWeights):
            raise ValueError(f"{heads.label} is not an LRKV model: its factors are LRKV's only")
        for projection in PROJECTIONS:
            shared, residuals = weights.decomposition(projection)
            reference = random_angle(shared.shape[0], shared.shape[1], weights.b_k.shape[2])
            for head, (ratio, residual) in enumerate(zip(norm_ratio(shared, residuals), residuals)):
                angles = principal_angles(shared, residual)
                spread = (angles.mean(), angles.min(), angles.max()) if angles.size else (np.nan,) * 3
                rows.append({"model": heads.label, "layer": layer, "projection": projection, "head": head,
                             "norm_ratio": ratio, **dict(zip(("angle_mean", "angle_min", "angle_max"), spread)),
                             "angle_random": reference})
    return pd.DataFrame(rows)


def rank_r_model(source, rank: int, label: str | None = None) -> ModelHeads:
    """An MHA model's heads with every key and value projection replaced by W̄ + [W_h − W̄]_r
    (`rank_r_heads`), queries and outputs unchanged: analyse it like any model."""
    heads = load_heads(source, label)

    def read_layer(index: int) -> GroupedWeights:
        weights = heads.layer(index)
        if not isinstance(weights, GroupedWeights) or weights.wk.shape != weights.wq.shape:
            raise ValueError(f"{heads.label} is not an MHA model: the rank-r bound needs one key per head")
        rebuilt = {p: rank_r_heads(_projection_heads(weights, p), rank).transpose(0, 2, 1).reshape(weights.wk.shape)
                   for p in PROJECTIONS}
        return GroupedWeights(weights.wq, rebuilt["key"], rebuilt["value"], weights.wo, weights.n_heads,
                              weights.q_gain, weights.k_gain)

    return ModelHeads(f"{heads.label}, rank-{rank} deviations", heads.layout, heads.n_layers, heads.n_heads, read_layer)


def deviation_table(source, ranks: tuple[int, ...], label: str | None = None) -> pd.DataFrame:
    """Per MHA layer, projection, rank r and head: energy_kept, the fraction of W_h − W̄ that a
    rank-r residual can hold (`deviation_energy_kept`). Columns: model, layer, projection, rank,
    head, energy_kept."""
    heads = load_heads(source, label)
    rows = []
    for layer in range(heads.n_layers):
        weights = heads.layer(layer)
        if not isinstance(weights, GroupedWeights) or weights.wk.shape != weights.wq.shape:
            raise ValueError(f"{heads.label} is not an MHA model: the rank-r bound needs one key per head")
        for projection in PROJECTIONS:
            per_head = _projection_heads(weights, projection)
            for rank in ranks:
                rows += [{"model": heads.label, "layer": layer, "projection": projection, "rank": rank, "head": h,
                          "energy_kept": kept} for h, kept in enumerate(deviation_energy_kept(per_head, rank))]
    return pd.DataFrame(rows)
