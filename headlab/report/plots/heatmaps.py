"""Head-similarity matrices as heatmaps, one per method."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headlab.report.plots.checks import checked_rows, seed_count
from headlab.report.plots.methods import methods_of
from headlab.report.plots.panels import chosen_layers, figure_title
from headlab.report.plots.style import HEATMAP_CMAP, NotebookFigure, styled

LABELLED_HEADS = 24  # up to this many heads every head is labelled, beyond it every k-th
DARK_CELL = 0.408  # a cell's value is written in white below this relative luminance (as seaborn does)


def heatmap(ax, matrix: pd.DataFrame, annotate: bool) -> None:
    """`matrix` (head i down, head j across) as square cells on the −1…1 diverging scale,
    head 0 at the top left, with each value written in the cell when `annotate` (white on dark
    cells). Drawn with plain matplotlib: seaborn's heatmap draws the figure again to test its
    labels for overlap, which costs more than the rest of the figure."""
    values = matrix.to_numpy(dtype=float)
    n_rows, n_cols = values.shape
    mesh = ax.pcolormesh(values, cmap=HEATMAP_CMAP, vmin=-1, vmax=1, edgecolors="white", linewidth=0.5)
    ax.set(xlim=(0, n_cols), ylim=(n_rows, 0), aspect="equal")
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    for axis, labels in ((ax.xaxis, matrix.columns), (ax.yaxis, matrix.index)):
        every = -(-len(labels) // LABELLED_HEADS)
        axis.set_ticks(np.arange(0, len(labels), every) + 0.5, [str(label) for label in labels[::every]])
    if annotate:
        dark = relative_luminance(mesh.cmap(mesh.norm(values))[..., :3]) <= DARK_CELL
        for (i, j), value in np.ndenumerate(values):
            ax.text(j + 0.5, i + 0.5, f"{round(value, 2) + 0.0:.2f}",  # + 0.0: no "-0.00"
                    ha="center", va="center", fontsize=7, color="white" if dark[i, j] else "0.15", in_layout=False)


def relative_luminance(rgb: np.ndarray) -> np.ndarray:
    """WCAG relative luminance of sRGB colours in 0…1 (last axis: red, green, blue):
    0.2126 R + 0.7152 G + 0.0722 B of the linearised channels, c / 12.92 up to 0.03928,
    ((c + 0.055) / 1.055)^2.4 above."""
    linear = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


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
        heatmap(ax, matrix, len(matrix) <= 8 if annotate is None else annotate)
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
