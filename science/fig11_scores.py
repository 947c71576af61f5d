"""How close a (measure, training) comes to the paper's Fig. 11 and to its Table 3 (`science/fig11_measures.py`).

Against Fig. 11 (the seed figure, `headlab.study.paper.SEED_SPECTRA`: 6 methods x 3 panels = 18 curves):
    Δλ₁     mean over the 18 curves of |λ₁ − s₁|, ours the mean over seeds, s the seed's curve put on the
            scale of six heads (`resampled`: divided by its sum, times 6; read off a figure, the seed's
            curves sum to 4.9–7.5, not to H = 6 as a cosine matrix's eigenvalues do)
    d₁      mean over runs and curves of Σᵢ |λᵢ/Σλ − sᵢ/Σs| (`normalised_l1`: the shape, 0 to 2)
    ρ       Spearman correlation of our six λ₁ with the seed's six as read, mean over the three panels
    drops   the share of the 18 curves that drop sharply after index 1: λ₁ − λ₂ > λ₂ − λ_H (the seed: 18 of 18)
Against Table 3 (the paper's 128M effective ranks, % of H, `headlab.study.paper.PAPER`):
    ΔER_u, ΔER_c   mean over the six methods of |ours − the paper's|, ours the layer mean (mean over seeds),
                   uncentred and centred
    MQA − MHA      our uncentred gap beside the paper's −22.8 points
Real checkpoints are set beside the seed curve of their attention family (MHA, GQA, MQA): λ₁ at six
heads (`at_seed_heads`) for Δλ₁, their resampled spectrum for d₁, their family's Table 3 row for ΔER.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headlab.analysis.measures import spearman
from headlab.study.paper import PAPER, SEED_SPECTRA
from headlab.study.seed_distance import at_seed_heads, normalised_l1, resampled

# Practical margins: what "reproduces" means here (the seed is read off by eye to about ±0.1 per value)
FIG11_MARGINS = {"Δλ₁": 0.5, "d₁": 0.2, "ρ": 0.5}
TABLE3_MARGIN = 3.0  # points of % of H, the report's δ for effective ranks


def seed_six(role: str, panel: str) -> np.ndarray:
    """The seed's curve of `role` at `panel`, on the scale of six heads (sum 6)."""
    return resampled(SEED_SPECTRA[role][panel].eigenvalues())


def sharp_drop(values: np.ndarray) -> bool:
    values = np.asarray(values, dtype=float)
    return bool(values[0] - values[1] > values[1] - values[-1])


def fig11_scores(spectra: pd.DataFrame) -> dict[str, float]:
    """Δλ₁, d₁, ρ and drops of one (measure, training, state): `spectra` rows role, panel, seed, l1 … l6."""
    columns = [c for c in spectra.columns if c.startswith("l") and c[1:].isdigit()]
    means = spectra.groupby(["role", "panel"])[columns].mean()
    deltas, distances, drops, rhos = [], [], [], []
    for (role, panel), row in means.iterrows():
        deltas.append(abs(row.iloc[0] - seed_six(role, panel)[0]))
        drops.append(sharp_drop(row.to_numpy()))
    for _, run in spectra.iterrows():
        distances.append(normalised_l1(run[columns].to_numpy(dtype=float), SEED_SPECTRA[run["role"]][run["panel"]]
                                       .eigenvalues()))
    for panel, at in means.reset_index().groupby("panel"):
        seed = pd.Series([SEED_SPECTRA[role][panel].first for role in at["role"]], index=at.index)
        if len(at) >= 3:
            rhos.append(spearman(at[columns[0]], seed))
    return {"Δλ₁": float(np.mean(deltas)), "d₁": float(np.mean(distances)),
            "ρ": float(np.mean(rhos)) if rhos else float("nan"), "drops": f"{sum(drops)} of {len(drops)}"}


def table3_scores(layers: pd.DataFrame) -> dict[str, float]:
    """ΔER_u, ΔER_c and the MQA − MHA gap of one (measure, training, state): `layers` rows role, seed, layer,
    kind, er_pct."""
    ranks = layers.groupby(["role", "kind"])["er_pct"].mean()  # over seeds and layers
    out = {}
    for kind, column, name in (("uncentered", "uncentered", "ΔER_u"), ("centered", "centered", "ΔER_c")):
        out[name] = float(np.mean([abs(ranks[role, kind] - getattr(PAPER[role], column))
                                   for role in PAPER if (role, kind) in ranks]))
    gap = ranks.get(("mqa", "uncentered"), np.nan) - ranks.get(("mha", "uncentered"), np.nan)
    return {**out, "MQA − MHA": float(gap)}


def real_scores(summary: pd.DataFrame, spectra: pd.DataFrame, models: pd.DataFrame) -> dict[str, float]:
    """The same scores of one (measure, state) on the real checkpoints, each beside its family's seed curve
    (and Table 3 row): `summary` and `spectra` rows of the real tables for one measure and state."""
    role = dict(zip(models["model"], models["role"]))
    deltas, distances, drops, uncentred, centred = [], [], [], [], []
    panels = spectra[spectra["kind"] == "uncentered"]
    for (model, panel, draw), curve in panels.groupby(["model", "panel", "draw"]):
        values = curve.sort_values("index")["eigenvalue"].to_numpy()
        reference = SEED_SPECTRA[role[model]][panel].eigenvalues()
        deltas.append(abs(at_seed_heads(values[0], values.size) - seed_six(role[model], panel)[0]))
        distances.append(normalised_l1(resampled(values), reference))
        drops.append(sharp_drop(values))
    for (model, kind), rows in summary.groupby(["model", "kind"]):
        paper = getattr(PAPER[role[model]], kind)
        (uncentred if kind == "uncentered" else centred).append(abs(rows["er_pct"].mean() - paper))
    return {"Δλ₁": float(np.mean(deltas)), "d₁": float(np.mean(distances)), "drops": f"{sum(drops)} of {len(drops)}",
            "ΔER_u": float(np.mean(uncentred)), "ΔER_c": float(np.mean(centred))}


def reproduces(scores: dict) -> tuple[bool, bool]:
    """(Fig. 11 within its margins, Table 3 within its margin) for one row of scores."""
    figure = (scores["Δλ₁"] <= FIG11_MARGINS["Δλ₁"] and scores["d₁"] <= FIG11_MARGINS["d₁"]
              and not scores.get("ρ", 1.0) < FIG11_MARGINS["ρ"])
    table = scores["ΔER_u"] <= TABLE3_MARGIN and scores["ΔER_c"] <= TABLE3_MARGIN
    return figure, table
