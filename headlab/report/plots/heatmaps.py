"""Head-similarity matrices as heatmaps, one per method."""

from __future__ import annotations

import math
from typing import Mapping

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from headlab.report.plots.checks import checked_rows, seed_count
from headlab.report.plots.methods import methods_of
from headlab.report.plots.panels import chosen_layers, figure_title
from headlab.report.plots.style import HEATMAP_CMAP, NotebookFigure, styled


@styled
def similarity_heatmaps(similarity: pd.DataFrame, layer: int, circuit: str = "qk",
                        palette: Mapping[str, str] | None = None, annotate: bool | None = None) -> Figure:
    """One H × H head-similarity heatmap per method at `layer` (the paper's Figs. 6 and 18), on a
    diverging colour scale fixed to −1…1 with one shared colour bar; titles name the method (in
    its colour). annotate: write each cell's value (default: when H ≤ 8). Heads of different
    seeds do not correspond, so the table must hold one seed.

    similarity: model, layer, circuit, head_i, head_j, value.
    """
    data = checked_rows(similarity, "similarity", ["model", "layer", "circuit", "head_i", "head_j", "value"], circuit)
    data = data[data["layer"] == chosen_layers(data, [layer])[0]]
    methods = methods_of(data, palette)
    n_seeds = seed_count(data, "similarity", ["model", "head_i", "head_j"])
    if n_seeds > 1:
        raise ValueError(f"the similarity table holds {n_seeds} seeds: pass one seed's rows "
                         "(head i of one seed has nothing to do with head i of another)")
    n_cols = len(methods.order) if len(methods.order) <= 4 else math.ceil(len(methods.order) / 2)
    n_rows = math.ceil(len(methods.order) / n_cols)
    fig = NotebookFigure(figsize=(3.3 * n_cols + 1.2, 3.3 * n_rows + 0.6), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    for n, (ax, method) in enumerate(zip(axes, methods.order)):
        matrix = data[data["model"] == method].pivot(index="head_i", columns="head_j", values="value")
        show_values = len(matrix) <= 8 if annotate is None else annotate
        # Every head is labelled up to 24 heads (which also spares seaborn a draw to test for overlap).
        labels = True if len(matrix) <= 24 else "auto"
        sns.heatmap(matrix, vmin=-1, vmax=1, cmap=HEATMAP_CMAP, square=True, cbar=False,
                    annot=matrix.round(2) + 0.0 if show_values else False,  # + 0.0: no "-0.00"
                    fmt=".2f", annot_kws={"fontsize": 7}, linewidths=0.5, linecolor="white",
                    xticklabels=labels, yticklabels=labels, ax=ax)
        ax.set_title(method, color=methods.colors[method], fontweight="bold")
        bottom_row = n + n_cols >= len(methods.order)
        ax.set(xlabel="head j" if bottom_row else "", ylabel="head i" if n % n_cols == 0 else "")
        ax.tick_params(rotation=0)
    for ax in axes[len(methods.order):]:
        ax.remove()
    bar = fig.colorbar(axes[0].collections[0], ax=axes[:len(methods.order)].tolist(), shrink=0.8,
                       ticks=[-1, -0.5, 0, 0.5, 1])
    bar.set_label("1 − Jensen–Shannon distance" if circuit == "pattern" else "cosine similarity")
    fig.suptitle(figure_title(f"Head similarity matrices, layer L={layer}", 1, circuit, data), fontweight="bold")
    return fig
