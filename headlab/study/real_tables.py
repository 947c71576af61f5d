"""The real checkpoints' tables (`science/real_checkpoints.py measure`), shipped in the package so
notebook 05 shows them offline: SmolLM2-135M-Instruct, Gemma 3 270M and all-MiniLM-L6-v2, every layer
in every candidate view of Fig. 11 (`headlab.analysis.candidates`), trained and as random Gaussian
weights of the same shapes.

    models        model, role (the paper's method it is set beside), family, weights, training, command
    summary       model, layer, panel, n_heads, state (trained | gaussian), draw, measure, kind, lambda1,
                  lambda2, er_pct (entropy effective rank, % of H), negative_mass
    spectra       the same keys at the panel layers (layer_roles), index, eigenvalue
    quantisation  model, layer, panel, format (as stored | Q8_0 | Q4_0 requantised W_Q, W_K), measure,
                  lambda1, er_pct
    check         model, layer, measure, quantity, headlab, independent, difference: the panel layers
                  against a float64 recomputation from the same files that shares no code with headlab

    tables = read_real_tables()            # name -> DataFrame, each checked against its SHA-256
    panel_first_eigenvalues(tables)        # λ₁ at the three panels, both views, beside the seed's
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headlab.analysis.tables import load_tables
from headlab.study.paper import SEED_SPECTRA
from headlab.study.seed_distance import at_seed_heads, implied_cosine, resampled
from headlab.study.stats import spread

REAL_TABLES = Path(__file__).resolve().parent / "real_tables"
MANIFEST = "real_checkpoints.json"


def read_real_tables(folder: str | Path = REAL_TABLES) -> dict[str, pd.DataFrame]:
    """The tables `science/real_checkpoints.py measure` wrote, verified against their manifest (a panel
    is "" in the summary where the layer is none of the three)."""
    tables = load_tables(folder, MANIFEST, "a real-checkpoint tables folder")[0]
    tables["summary"]["panel"] = tables["summary"]["panel"].fillna("")
    return tables


PANELS = ("Early", "Middle", "Late")  # `headlab.report.plots.layer_roles`, the paper's L = 0, 6, 11 of 12
VIEWS = ("weights", "data-aware")


def panel_first_eigenvalues(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per view, model and panel: λ₁ of the uncentred spectrum (of H), λ₁/H, the implied cosine and λ₁ at
    six heads (`headlab.study.seed_distance`), the random Gaussian twin's λ₁ (mean ± sd of its draws, and at
    six heads), and the seed figure's λ₁ of the model's attention family, scaled to sum 6 (read in brackets)."""
    role = dict(zip(tables["models"]["model"], tables["models"]["role"]))
    summary = tables["summary"]
    at = summary[summary["panel"].isin(PANELS) & (summary["kind"] == "uncentered") & summary["measure"].isin(VIEWS)]
    rows = []
    for (view, model, panel), here in at.groupby(["measure", "model", "panel"]):
        trained = here[here["state"] == "trained"].iloc[0]
        n = int(trained["n_heads"])
        random = here[here["state"] == "gaussian"]["lambda1"].to_numpy()
        seed = SEED_SPECTRA[role[model]][panel]
        rows.append({"view": view, "model": model, "panel": panel, "layer": int(trained["layer"]), "H": n,
                     "λ₁": trained["lambda1"], "λ₁ / H": trained["lambda1"] / n,
                     "implied cosine": implied_cosine(trained["lambda1"], n),
                     "λ₁ at six heads": at_seed_heads(trained["lambda1"], n),
                     "random weights λ₁": spread(list(random)).format(2),
                     "random, at six heads": at_seed_heads(float(random.mean()), n),
                     "seed figure λ₁, sum 6 (read)": f"{resampled(seed.eigenvalues())[0]:.2f} ({seed.first:.1f})"})
    table = pd.DataFrame(rows)
    order = {"view": {v: i for i, v in enumerate(VIEWS)}, "panel": {p: i for i, p in enumerate(PANELS)},
             "model": {m: i for i, m in enumerate(tables["models"]["model"])}}
    return table.sort_values(["view", "model", "panel"], key=lambda c: c.map(order[c.name])).reset_index(drop=True)
