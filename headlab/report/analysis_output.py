"""What `headlab analyze` shows of an analysis, from its tables alone: per model and view, each
layer's first eigenvalue λ₁ and effective ranks beside the random-initialisation baseline where
the source has one (`layer_table`), and the flagship's three-panel figure of the uncentered spectra
(`write_spectra_figures`): early, middle and late layer, the baseline dashed, and the seed figure's
λ₁ (the paper's Fig. 11) marked for each model that is one of the paper's comparison variants (a
`role` column)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from headlab.analysis.tables import ANALYSIS, ANALYSIS_MANIFEST
from headlab.io import writing
from headlab.report.plots.spectra import spectra_figure
from headlab.report.plots.style import save_figure
from headlab.schema import BEHAVIOUR, PATTERN

VIEW_KEYS = ["model", "circuit", "measure"]  # one block of the printed table, one line of a figure


def first_eigenvalues(spectra: pd.DataFrame) -> pd.DataFrame:
    """λ₁ of every model, view and layer: the first uncentered eigenvalue (model, circuit, measure,
    layer, first)."""
    rows = spectra[(spectra["kind"] == "uncentered") & (spectra["index"] == 1)]
    return rows[[*VIEW_KEYS, "layer", "eigenvalue"]].rename(columns={"eigenvalue": "first"})


def layer_table(summary: pd.DataFrame, spectra: pd.DataFrame | None = None,
                init_spectra: pd.DataFrame | None = None) -> str:
    """Per model, circuit and measure, one line per layer: the effective rank uncentered (% of H)
    and centered (% of H, % of the H − 1 ceiling), then, given the spectra, λ₁ of the uncentered
    spectrum (of H: 1 when the heads share no direction, H when they are one form), and λ₁ at
    random initialisation where `init_spectra` has the model; then the means over the layers
    where each is defined (a layer without a circuit is named undefined and left out, counted)."""
    firsts = first_eigenvalues(spectra) if spectra is not None else None
    init_firsts = first_eigenvalues(init_spectra) if init_spectra is not None else None
    blocks = []
    for (model, circuit, measure), rows in summary.groupby(VIEW_KEYS, sort=False):
        n = int(rows["n_heads"].iloc[0])
        wide = rows.pivot(index="layer", columns="kind",
                          values=["effective_rank", "effective_rank_pct_of_heads", "effective_rank_pct_of_ceiling"])
        columns = {}
        for name, table in (("λ₁", firsts), ("λ₁ at init", init_firsts)):
            if table is not None:
                chosen = table[(table["model"] == model) & (table["circuit"] == circuit)
                               & (table["measure"] == measure)].set_index("layer")["first"]
                if len(chosen):
                    columns[name] = chosen
        n_layers, undefined = len(wide), int(wide["effective_rank", "uncentered"].isna().sum())
        wide.loc["mean"] = wide.mean()
        for values in columns.values():
            values.loc["mean"] = values.mean()
        view = f"{circuit} · {measure}" + (" (attention maps)" if circuit == PATTERN and measure == BEHAVIOUR else "")
        lines = [f"{model} · {view} · {n} heads — effective rank (% of H; centered also % of ceiling {n - 1})"
                 + (f"; λ₁ of the uncentered spectrum (1: no shared direction, {n}: one form)" if columns else ""),
                 f"{'layer':>5}  {'uncentered':<16}{'centered':<22}" + "".join(f"{name:>12}" for name in columns)]
        for layer, row in wide.iterrows():
            if math.isnan(row["effective_rank", "uncentered"]):
                lines.append(f"{layer:>5}  undefined: no {circuit} circuit (every head's form is zero)")
                continue
            unc = f"{row['effective_rank', 'uncentered']:.2f} ({row['effective_rank_pct_of_heads', 'uncentered']:.1f}%)"
            cen = (f"{row['effective_rank', 'centered']:.2f} ({row['effective_rank_pct_of_heads', 'centered']:.1f}%, "
                   f"{row['effective_rank_pct_of_ceiling', 'centered']:.1f}%)")
            lines.append(f"{layer:>5}  {unc:<16}{cen:<22}" + "".join(f"{values.get(layer, math.nan):>12.2f}"
                                                                     for values in columns.values()))
        if undefined:
            lines[-1] += f"  over {n_layers - undefined} of {n_layers} layers ({undefined} undefined left out)"
        if circuit == PATTERN:
            lines.append("(S = 1 − Jensen–Shannon distance is not a Gram matrix: its negative eigenvalues are "
                         "clipped to 0)")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def figure_name(circuit: str, measure: str, depth: int | None) -> str:
    """spectra_uncentered[_<circuit>][_data][_<L>-layers]: the weights view of the QK circuit (the
    paper's measure) has the flagship's name; the data-aware view adds `_data` (each other circuit
    has one measure)."""
    return ("spectra_uncentered" + ("" if circuit == "qk" else f"_{circuit}")
            + ("_data" if measure == "data" else "") + (f"_{depth}-layers" if depth else ""))


def write_spectra_figures(spectra: pd.DataFrame, folder: str | Path, init_spectra: pd.DataFrame | None = None,
                          svg: bool = False) -> list[Path]:
    """The three-panel figure of the uncentered spectra (PNG, and with `svg` SVG) of every circuit
    and measure in `spectra`, into the analysis folder `folder` (listed in its manifest), one figure
    per depth when the models' depths differ; returns the PNG paths. `init_spectra` (the step-0
    weights' spectra of the models that have them) is drawn dashed; the seed figure's λ₁ is marked
    for the models with a role, on the weights view of the QK circuit only (what Fig. 11 shows)."""
    paths = []
    depths = spectra.groupby("model")["layer"].max() + 1
    views = spectra[["circuit", "measure"]].drop_duplicates().itertuples(index=False)
    with writing(Path(folder), ANALYSIS_MANIFEST, ANALYSIS, "analysis figures") as manifest:
        for circuit, measure in views:
            for depth in sorted(depths.unique()):
                models = depths.index[depths == depth]
                data = spectra[(spectra["circuit"] == circuit) & (spectra["measure"] == measure)
                               & spectra["model"].isin(models)]
                if data.empty:
                    continue
                init = None if init_spectra is None else init_spectra[
                    (init_spectra["circuit"] == circuit) & init_spectra["model"].isin(models)
                    & (init_spectra["measure"] == measure)]
                marked = circuit == "qk" and measure == "frobenius" and "role" in data and data["role"].notna().any()
                figure = spectra_figure(data, circuit=circuit, init=init if init is not None and len(init) else None,
                                        seed_figure=bool(marked))
                paths.append(save_figure(figure, manifest, figure_name(
                    circuit, measure, depth if len(depths.unique()) > 1 else None), svg=svg))
    return paths
