"""Head-similarity matrices as heatmaps, one per method."""

from __future__ import annotations

import functools
import math
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Patch, Rectangle
from matplotlib.path import Path
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D

from headlab.report.plots.checks import checked_rows, seed_count
from headlab.report.plots.methods import methods_of
from headlab.report.plots.panels import chosen_layers, figure_title
from headlab.report.plots.style import HEATMAP_CMAP, NotebookFigure, styled

LABELLED_HEADS = 24  # up to this many heads every head is labelled, beyond it every k-th
DARK_CELL = 0.408  # a cell's value is written in white below this relative luminance (as seaborn does)
VALUE_SIZE, VALUE_COLOUR = 7, "0.15"  # points, and the colour of a value on a light cell
CELL_VALUES = "cell values"  # the label of a heatmap's collection of values
PANEL = 2.7  # inches: the side of one heatmap
# Inches around the heatmaps, room for what the fonts of `styled` draw there: head numbers and the
# axis labels (left, bottom), the figure's title (top), the colour bar and its label (right).
MARGINS = {"left": 0.75, "right": 1.2, "top": 0.75, "bottom": 0.65}
GAPS = (0.45, 0.8)  # inches between heatmaps: across (the next one's head numbers), down (head numbers, label, title)
BAR = (0.35, 0.18, 0.8)  # the colour bar: its gap from the heatmaps and width (inches), its share of their height
# A cell of a dead head (its form is zero: similarity undefined, NaN), drawn unlike any value: on the
# diverging scale white is 0, which a dead head is not
UNDEFINED_CELL = {"facecolor": "0.62", "hatch": "////", "edgecolor": "white", "linewidth": 0.5}
UNDEFINED_LABEL = "dead head:\nform zero,\nundefined"


def heatmap(ax, matrix: pd.DataFrame, annotate: bool, numbered: tuple[bool, bool] = (True, True)) -> None:
    """`matrix` (head i down, head j across) as square cells on the −1…1 diverging scale (an
    undefined cell, a dead head's, grey and hatched: `UNDEFINED_CELL`), head 0 at the top left,
    with each value written in the cell when `annotate` (white on dark cells, none on undefined
    ones); its heads numbered below and on the left as `numbered` says. Drawn with plain
    matplotlib: seaborn's heatmap draws the figure again to test its labels for overlap, which
    costs more than the rest of the figure."""
    values = matrix.to_numpy(dtype=float)
    n_rows, n_cols = values.shape
    mesh = ax.pcolormesh(values, cmap=HEATMAP_CMAP, vmin=-1, vmax=1, edgecolors="white", linewidth=0.5)
    for i, j in zip(*np.nonzero(np.isnan(values))):  # a dead head's row and column: undefined, not 0 (white)
        ax.add_patch(Rectangle((j, i), 1, 1, **UNDEFINED_CELL))
    ax.set(xlim=(0, n_cols), ylim=(n_rows, 0), aspect="equal")
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    for axis, labels, shown in ((ax.xaxis, matrix.columns, numbered[0]), (ax.yaxis, matrix.index, numbered[1])):
        every = -(-len(labels) // LABELLED_HEADS)
        axis.set_ticks(np.arange(0, len(labels), every) + 0.5 if shown else [],
                       [str(label) for label in labels[::every]] if shown else [])
    if annotate:
        ax.add_collection(cell_values(ax, values, mesh.cmap(mesh.norm(values))[..., :3]), autolim=False)


def undefined_legend(fig) -> None:
    """The legend of the undefined cells (`UNDEFINED_CELL`), under the colour bar."""
    fig.legend(handles=[Patch(**UNDEFINED_CELL, label=UNDEFINED_LABEL)], loc="lower right", fontsize=7,
               frameon=False, handlelength=1.4, handleheight=1.4, bbox_to_anchor=(1.0, 0.0))


def cell_values(ax, values: np.ndarray, colours: np.ndarray) -> PathCollection:
    """Each value of `values`, to two decimals, centred in its cell of `ax` (cell (i, j) spans
    j…j + 1 across, i…i + 1 down), white on cells whose colour (`colours`, RGB) is dark: one
    collection of the texts' outlines, each distinct text laid out once (`value_outline`). As
    Text artists they took half of a heatmaps figure's drawing time, each laid out and rasterised
    on its own; outlines look the same at this size (in an SVG they are paths, not text)."""
    defined = ~np.isnan(values.ravel())  # an undefined cell is hatched (`UNDEFINED_CELL`), not written
    dark = (relative_luminance(colours) <= DARK_CELL).ravel()[defined]
    rows, columns = (axis.ravel()[defined] for axis in np.indices(values.shape))
    outlines = [value_outline(f"{round(value, 2) + 0.0:.2f}") for value in values.ravel()[defined]]  # no "-0.00"
    return PathCollection(outlines, offsets=np.column_stack([columns + 0.5, rows + 0.5]),
                          offset_transform=ax.transData,
                          transform=Affine2D().scale(1 / 72) + ax.figure.dpi_scale_trans,  # points to pixels
                          facecolors=np.where(dark[:, None], to_rgba("white"), to_rgba(VALUE_COLOUR)),
                          linewidths=0, label=CELL_VALUES)


@functools.lru_cache(maxsize=512)
def value_outline(text: str) -> Path:
    """The outline of `text` in the cells' font (`VALUE_SIZE` points, in points), centred on the origin."""
    outline = TextPath((0, 0), text, size=VALUE_SIZE, prop=FontProperties(size=VALUE_SIZE))
    box = outline.get_extents()
    return outline.transformed(Affine2D().translate(-(box.x0 + box.x1) / 2, -(box.y0 + box.y1) / 2))


def relative_luminance(rgb: np.ndarray) -> np.ndarray:
    """WCAG relative luminance of sRGB colours in 0…1 (last axis: red, green, blue):
    0.2126 R + 0.7152 G + 0.0722 B of the linearised channels, c / 12.92 up to 0.03928,
    ((c + 0.055) / 1.055)^2.4 above."""
    linear = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def heatmap_grid(n_rows: int, n_cols: int, count: int) -> tuple[Figure, list, object]:
    """A figure with `count` square axes, `n_cols` to a row, and a colour bar's axes on the right,
    all placed at fixed inches: a layout engine would measure every label of every heatmap again
    for each figure, which costs more than drawing them. Returns (figure, heatmap axes, bar axes)."""
    across, down = GAPS
    width = MARGINS["left"] + n_cols * PANEL + (n_cols - 1) * across + BAR[0] + BAR[1] + MARGINS["right"]
    height = MARGINS["top"] + n_rows * PANEL + (n_rows - 1) * down + MARGINS["bottom"]
    fig = NotebookFigure(figsize=(width, height))

    def rect(left: float, bottom: float, w: float, h: float) -> list[float]:
        return [left / width, bottom / height, w / width, h / height]

    axes = [fig.add_axes(rect(MARGINS["left"] + column * (PANEL + across),
                              height - MARGINS["top"] - PANEL - row * (PANEL + down), PANEL, PANEL))
            for row, column in (divmod(n, n_cols) for n in range(count))]
    grid = n_rows * PANEL + (n_rows - 1) * down
    bar = fig.add_axes(rect(width - MARGINS["right"] - BAR[1], MARGINS["bottom"] + grid * (1 - BAR[2]) / 2,
                            BAR[1], grid * BAR[2]))
    return fig, axes, bar


@styled
def similarity_heatmaps(similarity: pd.DataFrame, layer: int, circuit: str = "qk",
                        palette: Mapping[str, str] | None = None, annotate: bool | None = None) -> Figure:
    """One H × H head-similarity heatmap per method at `layer` (the paper's Figs. 6 and 18), on a
    diverging colour scale fixed to −1…1 with one shared colour bar; titles name the method (in
    its colour); dead heads' cells grey and hatched, named in a legend under the colour bar.
    annotate: write each cell's value (default: when H ≤ 8). Heads of different
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
    fig, axes, bar_axes = heatmap_grid(n_rows, n_cols, len(methods.order))
    matrices = [data[data["model"] == method].pivot(index="head_i", columns="head_j", values="value")
                for method in methods.order]
    # the same heads everywhere: numbered along the figure's bottom and left edges only, as shared axes are
    alike = all(m.index.equals(matrices[0].index) and m.columns.equals(matrices[0].columns) for m in matrices)
    for n, (ax, method, matrix) in enumerate(zip(axes, methods.order, matrices)):
        bottom_row, left_column = n + n_cols >= len(methods.order), n % n_cols == 0
        heatmap(ax, matrix, len(matrix) <= 8 if annotate is None else annotate,
                numbered=(bottom_row or not alike, left_column or not alike))
        ax.set_title(method, color=methods.colors[method], fontweight="bold")
        ax.set(xlabel="head j" if bottom_row else "", ylabel="head i" if left_column else "")
    if data["value"].isna().any():
        undefined_legend(fig)
    bar = fig.colorbar(axes[0].collections[0], cax=bar_axes, ticks=[-1, -0.5, 0, 0.5, 1])
    bar.set_label("1 − Jensen–Shannon distance" if circuit == "pattern" else "cosine similarity")
    fig.suptitle(figure_title(f"Head similarity matrices, layer L={layer}", 1, circuit, data), fontweight="bold")
    return fig
