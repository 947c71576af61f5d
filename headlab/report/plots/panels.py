"""What several figures draw alike: the early, middle and late layers, a line per method, one
legend outside the axes, a title that says what is shown, and a row of layer panels."""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from headlab.report.plots.checks import seed_count
from headlab.report.plots.methods import Methods, methods_of
from headlab.report.plots.style import (
    BAND,
    CIRCUIT_TITLES,
    MLA_ROPE_TITLES,
    PANEL_SIZE,
    RECIPE_TITLES,
    TITLE_LINE,
    NotebookFigure,
)
from headlab.schema import BEHAVIOUR, VIEWS
from headlab.study.paper import layer_roles


def layer_title(layer: int, layers: Iterable[int]) -> str:
    """A panel title: "Early Layer (L=0)", "Middle Layer (L=6)", "Late Layer (L=11)" for the
    `layer_roles` of `layers`, else "Layer (L=4)"."""
    role = next((name for name, value in layer_roles(layers).items() if value == layer), None)
    return f"{role} Layer (L={layer})" if role else f"Layer (L={layer})"


def chosen_layers(data: pd.DataFrame, layers: Sequence[int] | None) -> list[int]:
    """`layers`, checked against the table, or its distinct early, middle and late layers."""
    available = sorted(data["layer"].unique())
    if layers is None:
        return list(dict.fromkeys(layer_roles(available).values()))
    unknown = [layer for layer in layers if layer not in available]
    if unknown or not layers:
        raise ValueError(f"layers = {list(layers)} is invalid: the table has layers {', '.join(map(str, available))}")
    return list(layers)


def method_lines(ax, data: pd.DataFrame, x: str, y: str, methods: Methods, n_seeds: int) -> None:
    """One line with markers per method along increasing `x`, seaborn's look (white marker edges,
    a band of alpha 0.2): the mean over seeds, with a min–max band when there are several. Drawn
    with matplotlib from one groupby: seaborn's lineplot aggregated each method on its own, which
    took longer than drawing the figure."""
    stats = data.dropna(subset=[x, y]).groupby(["model", x], sort=True)[y].agg(["mean", "min", "max"])
    drawn = stats.index.unique("model")
    for method in (m for m in methods.order if m in drawn):
        line, colour = stats.loc[method], methods.colors[method]
        ax.plot(line.index, line["mean"], color=colour, marker=methods.markers[method], markersize=6,
                linewidth=1.8, markeredgewidth=0.75, markeredgecolor="w")
        if n_seeds > 1:
            ax.fill_between(line.index, line["min"], line["max"], color=colour, alpha=0.2)


LEGEND_ROW = 4  # entries per row of a legend below a row of panels: it stays legible at 800 px wide


def figure_legend(fig: Figure, methods: Methods, extra: Sequence = (), n_seeds: int = 1, below: bool = False) -> None:
    """One legend for the whole figure, outside the axes: the methods, then `extra` reference
    lines, then the seed band if any; below a row of panels in rows of at most `LEGEND_ROW`, in
    a larger font (a three-panel figure is shrunk most where it is shown: a README, a notebook
    page), else in one column on the right (centered, so that it keeps clear of the title)."""
    handles = methods.handles() + list(extra)
    if n_seeds > 1:
        handles.append(Patch(color="0.6", alpha=0.4, label=BAND))
    if below:
        rows = math.ceil(len(handles) / LEGEND_ROW)
        fig.legend(handles=handles, loc="outside lower center", ncols=math.ceil(len(handles) / rows), frameon=False,
                   fontsize="large")
    else:
        fig.legend(handles=handles, loc="outside right center", frameon=False)


def figure_title(text: str, n_seeds: int | None, circuit: str = "qk", data: pd.DataFrame | None = None) -> str:
    """`text`, then what is drawn: the recipe the models were trained with (`data`'s one `recipe`,
    `headlab.study.table_files.with_recipe`, named by `RECIPE_TITLES`: whether it is the paper's)
    · the view (`data`'s one `measure`, named by `VIEWS`: weights, data-aware weights, or behaviour,
    as the circuit "pattern" is), the circuit when it is neither QK nor attention maps, which
    definition of MLA's heads `data` holds (its one `mla_rope` setting, when it has an MLA row),
    then how many seeds are shown (unless `n_seeds` is None: a measurement that seeds do not
    enter). On one line after a dash, or on a second line past `TITLE_LINE` characters."""
    recipe = None if data is None else single(data, "recipe")
    view = VIEWS[BEHAVIOUR] if circuit == "pattern" else None if data is None else VIEWS.get(single(data, "measure"))
    drawn = [RECIPE_TITLES.get(recipe, recipe) if recipe else None, view_title(view) if view else None]
    notes = [" · ".join(note for note in drawn if note)]
    if circuit not in ("qk", "pattern"):
        notes.append(CIRCUIT_TITLES.get(circuit, circuit))
    settings = [] if data is None or "mla_rope" not in data.columns else \
        list(dict.fromkeys(data.loc[data["model"].str.startswith("MLA"), "mla_rope"].dropna()))
    if len(settings) == 1 and settings[0] in MLA_ROPE_TITLES:  # "n/a": a measure MLA's RoPE does not enter
        notes.append(MLA_ROPE_TITLES[settings[0]])
    if n_seeds is not None:
        notes.append(f"mean of {n_seeds} seeds" if n_seeds > 1 else "1 seed")
    shown = ", ".join(note for note in notes if note)
    if not shown:
        return text
    return f"{text} — {shown}" if len(text) + len(shown) + 3 <= TITLE_LINE else f"{text}\n{shown}"


def view_title(view: str) -> str:
    """A view's name in a title: "weights view", "behaviour view (attention maps)"."""
    name, _, detail = view.partition(" (")
    return f"{name} view ({detail}" if detail else f"{name} view"


def single(data: pd.DataFrame, column: str) -> str | None:
    """The one value `data` holds in `column`, else None (no such column, or several values)."""
    if column not in data.columns:
        return None
    values = data[column].dropna().unique()
    return str(values[0]) if len(values) == 1 else None


def layer_panel_figure(data: pd.DataFrame, name: str, layers: Sequence[int] | None, x: str, y: str,
                       xlabel: str, ylabel: str, title: str, circuit: str,
                       palette: Mapping[str, str] | None, extra: Sequence = ()) -> Figure:
    """A row of panels, one per layer (early, middle and late by default), each with a line per
    method of `y` against `x`; one legend; `extra` handles are added to it."""
    chosen = chosen_layers(data, layers)
    methods = methods_of(data, palette)
    n_seeds = seed_count(data, name, ["model", "layer", x])
    fig = NotebookFigure(figsize=(PANEL_SIZE[0] * len(chosen), PANEL_SIZE[1] + 0.9), layout="constrained")
    available = data["layer"].unique()
    for ax, layer in zip(fig.subplots(1, len(chosen), squeeze=False)[0], chosen):
        method_lines(ax, data[data["layer"] == layer], x, y, methods, n_seeds)
        ax.set(title=layer_title(layer, available), xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(figure_title(title, n_seeds, circuit, data), fontweight="bold")
    figure_legend(fig, methods, extra, n_seeds, below=True)
    return fig
