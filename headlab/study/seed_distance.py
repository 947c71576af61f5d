"""How far a study's flagship spectra lie from the seed figure's (the paper's Fig. 11 at 128M,
`headlab.study.paper.SEED_SPECTRA`), per method and panel, trained and at random initialisation.

    λ₁                          the first (largest) uncentered eigenvalue, of H = 6 in the seed figure
    d₁(λ, s) = Σᵢ |λᵢ / Σⱼ λⱼ − sᵢ / Σⱼ sⱼ|     the L1 distance of the normalised spectra: each divided
                                by its sum (H for an uncentered spectrum), so it compares shapes, 0 for
                                the same shape, at most 2; defined for spectra of the same length only

    distances = seed_distance(spectra, init_spectra, {"Early": 0, "Middle": 2, "Late": 3})
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from headlab.study.paper import PAPER_PANELS, SEED_HEADS, SEED_SPECTRA

STATES = ("trained", "init")  # a run's final weights, and its step-0 weights (the random-init baseline)
COLUMNS = ["role", "model", "panel", "layer", "paper_layer", "state", "seed", "first_eigenvalue",
           "seed_first_eigenvalue", "l1_to_seed"]


def normalised_l1(eigenvalues, reference) -> float:
    """d₁ = Σᵢ |λᵢ / Σλ − sᵢ / Σs| of two spectra in index order (float64); NaN when their lengths differ."""
    ours, theirs = np.asarray(eigenvalues, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if ours.shape != theirs.shape:
        return float("nan")
    return float(np.abs(ours / ours.sum() - theirs / theirs.sum()).sum())


def seed_distance(spectra: pd.DataFrame, init_spectra: pd.DataFrame, panels: Mapping[str, int],
                  mla_rope: str) -> pd.DataFrame:
    """One row per role with a seed curve, panel (`panels`: our panel name -> our layer, named as
    `PAPER_PANELS`), state (`STATES`: `spectra` trained, `init_spectra` at step 0) and seed: λ₁,
    the seed's λ₁ and d₁ to the seed's curve, from the uncentered QK spectra at `mla_rope`."""
    rows = []
    for state, table in zip(STATES, (spectra, init_spectra)):
        chosen = table[(table["circuit"] == "qk") & (table["kind"] == "uncentered") & (table["mla_rope"] == mla_rope)
                       & table["role"].isin(list(SEED_SPECTRA))]
        if "measure" in chosen:
            chosen = chosen[chosen["measure"] == "frobenius"]
        for panel, layer in panels.items():
            at_layer = chosen[chosen["layer"] == layer]
            for (role, model, seed), curve in at_layer.groupby(["role", "model", "seed"], sort=False):
                eigenvalues = curve.sort_values("index")["eigenvalue"].to_numpy()
                reference = SEED_SPECTRA[role][panel]
                rows.append({"role": role, "model": model, "panel": panel, "layer": layer,
                             "paper_layer": PAPER_PANELS[panel], "state": state, "seed": seed,
                             "first_eigenvalue": float(eigenvalues[0]), "seed_first_eigenvalue": reference.first,
                             "l1_to_seed": normalised_l1(eigenvalues, reference.eigenvalues())})
    return pd.DataFrame(rows, columns=COLUMNS)


# ---- models with another head count than the seed's six ---------------------------------------

def implied_cosine(first_eigenvalue: float, n_heads: int) -> float:
    """ρ̂ = (λ₁ − 1) / (H − 1): the pairwise cosine of H heads that all share one direction equally
    (every off-diagonal cosine ρ gives λ₁ = 1 + (H − 1)ρ exactly), 0 for orthogonal heads (λ₁ = 1),
    1 for one form (λ₁ = H). λ₁ of a cosine matrix of H heads, so free of H under that model."""
    return (first_eigenvalue - 1.0) / (n_heads - 1)


def at_seed_heads(first_eigenvalue: float, n_heads: int, seed_heads: int = SEED_HEADS) -> float:
    """λ₁ that `seed_heads` heads sharing the same direction would give: 1 + (H_seed − 1)·ρ̂."""
    return 1.0 + (seed_heads - 1) * implied_cosine(first_eigenvalue, n_heads)


def resampled(eigenvalues, n: int = SEED_HEADS) -> np.ndarray:
    """A spectrum of H values as the spectrum of n heads: n values summing to n, as a cosine matrix's
    do. Eigenvalue i fills the slot [(i − 1)/H, i/H) of the unit interval; the cumulative share
    c(x), piecewise linear through c(i/H) = Σ_{j≤i} λ_j / Σλ, is read at k/n, and value k is
    n·(c(k/n) − c((k − 1)/n)). It keeps the share that any top fraction of the heads holds; for
    H = n it is the spectrum scaled to sum n (the identity for a cosine matrix's), which is how the
    seed's values, read off a figure and summing to 4.9–7.5, are put on the scale of six heads."""
    values = np.asarray(eigenvalues, dtype=np.float64)
    knots = np.concatenate([[0.0], np.cumsum(values)]) / values.sum()
    shares = np.interp(np.arange(n + 1) / n, np.arange(values.size + 1) / values.size, knots)
    return np.diff(shares) * n
