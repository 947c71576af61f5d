"""The method order against the paper's, in every study we trained: Spearman's ρ between our six methods'
λ₁ and the seed figure's, per panel, of the means over seeds and seed by seed (its spread: how much of an
order is seed noise), trained and at random initialisation (`headlab.study.seed_distance.method_order`).

Sources: make demo's tables shipped in the package (cpu-small, Muon); docs/regime/headline.md, the
headline `headlab docs` wrote from the 3-seed cpu-small-adamw-qk study (its tables are not shipped
here, so only the means' order, no seed-by-seed spread); science/tables/fig11_cpu-deep*.csv.gz
(`science/fig11_measures.py measure`) for cpu-deep under both recipes."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pandas as pd
from fig11_methods import study_tables

from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA
from headlab.study.seed_distance import method_order
from headlab.study.table_files import SHIPPED, read_study_tables

ROOT = Path(__file__).resolve().parents[1]
REGIME_HEADLINE = ROOT / "docs" / "regime" / "headline.md"
PANEL_ORDER = {panel: i for i, panel in enumerate(PAPER_PANELS)}


def from_spectra(spectra: pd.DataFrame) -> pd.DataFrame:
    """A `seed_distance` frame (role, panel, state, seed, λ₁ and the seed's) from measured panel spectra."""
    return spectra.assign(first_eigenvalue=spectra["l1"], seed_first_eigenvalue=[
        SEED_SPECTRA[role][panel].first for role, panel in zip(spectra["role"], spectra["panel"])])


def from_headline(path: Path) -> pd.DataFrame:
    """The means of the distance table of a headline page (`headlab docs`): λ₁ ours and at random init,
    mean over seeds, as one pseudo-seed (no seed-by-seed spread)."""
    role = {paper.label: name for name, paper in PAPER.items()}
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or cells[1] not in role or "↔" not in cells[2]:
            continue
        panel = cells[2].split()[0]
        for state, cell in (("trained", cells[4]), ("init", cells[5])):
            rows.append({"role": role[cells[1]], "panel": panel, "state": state, "seed": 0,
                         "first_eigenvalue": float(cell.split(" ± ")[0]),
                         "seed_first_eigenvalue": SEED_SPECTRA[role[cells[1]]][panel].first})
    seeds = re.search(r"(\d+) seeds", path.read_text(encoding="utf-8").splitlines()[0])
    return pd.DataFrame(rows).assign(shown_seeds=int(seeds.group(1)) if seeds else 0)


def studies() -> dict[str, pd.DataFrame]:
    """Title -> `seed_distance` frame of every study at hand."""
    found = {"cpu-small, Muon (the paper's recipe; make demo)": read_study_tables(SHIPPED)["seed_distance"]}
    if REGIME_HEADLINE.exists():
        found["cpu-small, AdamW on W_Q, W_K (docs/regime)"] = from_headline(REGIME_HEADLINE)
    for name, title in (("cpu-deep", "cpu-deep, Muon (the paper's recipe)"),
                        ("cpu-deep-adamw-qk", "cpu-deep, AdamW on W_Q, W_K")):
        if (tables := study_tables(name, "weights")) is not None:
            found[title] = from_spectra(tables[1])
    return found


def order_table() -> pd.DataFrame:
    rows = []
    for title, distances in studies().items():
        order = method_order(distances).set_index(["state", "panel"])
        seeds = distances["shown_seeds"].iloc[0] if "shown_seeds" in distances else distances["seed"].nunique()
        for panel in PAPER_PANELS:
            trained, init = order.loc[("trained", panel)], order.loc[("init", panel)]
            by_seed = "–" if trained["n_seeds"] < 2 else (
                f"{trained['seed_mean']:+.2f} ± {trained['seed_sd']:.2f} ({trained['seed_min']:+.2f} to "
                f"{trained['seed_max']:+.2f})")
            rows.append({"training": title, "seeds": seeds, "panel": f"{panel} (L={PAPER_PANELS[panel]})",
                         "methods": int(trained["n_methods"]), "ρ of the means": f"{trained['spearman']:+.2f}",
                         "ρ seed by seed: mean ± sd (range)": by_seed,
                         "ρ at random init (means)": f"{init['spearman']:+.2f}"})
    return pd.DataFrame(rows)


def critical_rho(n: int = 6, level: float = 0.05) -> float:
    """The smallest |ρ| that n methods without ties reach by chance with probability ≤ `level` (two-sided),
    counted over all n! orders."""
    rhos = sorted(abs(1 - 6 * sum((i - p) ** 2 for i, p in enumerate(order)) / (n * (n * n - 1)))
                  for order in itertools.permutations(range(n)))
    return next(r for r in sorted(set(rhos)) if sum(x >= r for x in rhos) / len(rhos) <= level)


def order_note() -> str:
    return ("ρ = Spearman's rank correlation between our six methods' λ₁ (weights view, uncentred) and the seed "
            "figure's at the same panel: +1 the paper's order, −1 reversed, about 0 unrelated; six methods in no "
            f"particular order reach |ρ| ≥ {critical_rho():.2f} with probability 5 % at most (two-sided, all 720 "
            "orders counted). 'ρ of the means' ranks the means over seeds; 'seed by seed' ranks each seed's six "
            "alone; 'at random init' ranks the same runs' step-0 weights: the order before training.")
