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

from headlab.study.paper import PAPER_PANELS, SEED_SPECTRA

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
