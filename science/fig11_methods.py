"""Method by method, against the paper: each method's λ₁ at the three panels beside the seed figure's, the
ordering of the six (Spearman), the drop after index 1, and each method's effective-rank gap to Standard
MHA beside Table 3's, from the rows `science/fig11_measures.py measure` wrote for a study
(science/tables/fig11_<study>_{layers,spectra}.csv.gz). Shared by science/fig11_measures.md and the
cpu-deep section of science/real_checkpoints.md. `studies` maps a title to (layer rows, panel spectra)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from real_figures import PANELS, ROLE_LABELS

from headlab.analysis.measures import spearman
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA
from headlab.study.seed_distance import resampled
from headlab.study.stats import paired_difference, spread

TABLES = Path(__file__).resolve().parent / "tables"
SPECTRUM = [f"l{i}" for i in range(1, 7)]


def study_tables(name: str, measure: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(layer rows, panel spectra) of a measured study, of one measure if given; None if not measured."""
    layers, spectra = (TABLES / f"fig11_{name}_{table}.csv.gz" for table in ("layers", "spectra"))
    if not layers.exists():
        return None
    tables = pd.read_csv(layers), pd.read_csv(spectra)
    return tuple(t[t["measure"] == measure] for t in tables) if measure else tables


def cell(values) -> str:
    return f"{spread(list(values)).format(2)} ({len(values)})" if len(values) else "–"


def first_eigenvalue_table(studies: dict) -> pd.DataFrame:
    rows = []
    for role, label in ROLE_LABELS.items():
        for panel in PANELS:
            seed = SEED_SPECTRA[role][panel]
            row = {"method (paper's)": label, "panel": f"{panel} (L={PAPER_PANELS[panel]})",
                   "seed figure λ₁: read (sum 6)": f"{seed.first:.1f} ({resampled(seed.eigenvalues())[0]:.2f})"}
            for title, (_, spectra) in studies.items():
                here = spectra[(spectra["role"] == role) & (spectra["panel"] == panel)]
                row[f"{title}: λ₁ (seeds)"] = cell(here[here["state"] == "trained"]["l1"])
                init = list(here[here["state"] == "init"]["l1"])
                row[f"{title}: at init"] = spread(init).format(2) if init else "–"
                curve = here[here["state"] == "trained"][SPECTRUM].mean()
                row[f"{title}: sharp drop"] = "–" if curve.isna().all() else (
                    "yes" if curve["l1"] - curve["l2"] > curve["l2"] - curve["l6"] else "no")
            rows.append(row)
    return pd.DataFrame(rows)


def orderings(studies: dict) -> list[str]:
    """Per recipe: Spearman of our six λ₁ (mean over seeds) with the seed's six as read, per panel; and how
    many of the 18 mean curves drop sharply after index 1 (λ₁ − λ₂ > λ₂ − λ₆)."""
    lines = []
    for title, (_, spectra) in studies.items():
        trained = spectra[spectra["state"] == "trained"]
        means = trained.groupby(["role", "panel"])[[f"l{i}" for i in range(1, 7)]].mean()
        rhos = []
        for panel in PANELS:
            at = means.xs(panel, level="panel")
            rhos.append(spearman(at["l1"], pd.Series({r: SEED_SPECTRA[r][panel].first for r in at.index})))
        drops = sum(row["l1"] - row["l2"] > row["l2"] - row["l6"] for _, row in means.iterrows())
        lines.append(f"{title}: Spearman of our six λ₁ with the seed's, L = 0 / 6 / 11: "
                     f"{' / '.join(f'{r:+.2f}' for r in rhos)}; a sharp drop after index 1 (λ₁ − λ₂ > λ₂ − λ₆) in "
                     f"{drops} of {len(means)} mean curves (the seed figure: 18 of 18).")
    return lines


def rank_table(studies: dict) -> pd.DataFrame:
    """Per method: layer-mean effective rank (% of H), both kinds, and the gap to MHA paired by seed (95%
    interval), beside Table 3's values and gaps."""
    rows = []
    for role, label in ROLE_LABELS.items():
        row = {"method (paper's)": label, "Table 3 u / c": f"{PAPER[role].uncentered} / {PAPER[role].centered}"}
        if role != "mha":
            row["Table 3 gap to MHA u / c"] = (f"{PAPER[role].uncentered - PAPER['mha'].uncentered:+.1f} / "
                                               f"{PAPER[role].centered - PAPER['mha'].centered:+.1f}")
        for title, (layers, _) in studies.items():
            trained = layers[layers["state"] == "trained"]
            per_seed = trained.groupby(["role", "kind", "seed"])["er_pct"].mean()
            for kind, short in (("uncentered", "u"), ("centered", "c")):
                ours = per_seed.xs((role, kind), level=("role", "kind")) if (role, kind) in per_seed else pd.Series()
                row[f"{title}: ER {short}"] = spread(list(ours)).format(1) if len(ours) else "–"
                if role != "mha" and len(ours):
                    mha = per_seed.xs(("mha", kind), level=("role", "kind"))
                    both = pd.concat([ours, mha], axis=1, keys=["v", "m"]).dropna()
                    gap = paired_difference(both["v"], both["m"]) if len(both) > 1 else None
                    row[f"{title}: gap {short}"] = gap.format(1) if gap else "–"
        rows.append(row)
    return pd.DataFrame(rows).fillna("–")


def loss_line(studies: dict) -> str:
    parts = []
    for title, (layers, _) in studies.items():
        loss = layers.drop_duplicates(["role", "seed"]).groupby("role")["val_loss"]
        values = dict(list(loss))
        parts.append(f"{title}: " + ", ".join(
            f"{label} {spread(list(values[role])).format(3)}" for role, label in ROLE_LABELS.items() if role in values))
    return "Validation loss (nats/byte, mean ± sd over seeds): " + "; ".join(parts) + "."


