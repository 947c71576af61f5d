"""`explore()`: ipywidgets controls over the `headlab.plots` figures of an analysis.

    from headlab.widgets import explore
    explore(analysis)                      # an Analysis, or {"similarity": ..., "spectra": ..., "summary": ...}
    explore(analysis, training=training)   # adds a "loss curves" view (model, tokens, val_loss)

The controls choose the methods, the layers (one, or early, middle and late together), centred or
uncentred spectra, the circuit (when the tables hold several) and the view. Every change redraws
the chosen plots into the explorer's Output. The explorer also draws once when it is created, so
a headless run (nbmake, nbconvert) shows a figure. It uses only standard ipywidgets and displays
plain matplotlib figures, so it works in Jupyter, JupyterLab, VS Code and Colab. The figures
last drawn are kept in `explorer.figures` for saving.
"""

from __future__ import annotations

from typing import Mapping

import ipywidgets as widgets
import pandas as pd
from IPython.display import clear_output, display
from matplotlib.figure import Figure

from . import plots

TABLES = ("similarity", "spectra", "summary")
SUMMARY_COLUMNS = ("model", "layer", "circuit")  # what the explorer reads itself to build its controls
VIEWS = ("spectra", "heatmaps", "effective rank", "cumulative variance")
LOSS_VIEW = "loss curves"
KIND_OPTIONS = (("centred (PCA)", "centered"), ("uncentred", "uncentered"))
NO_METHOD = "Select at least one method."


class Explorer(widgets.VBox):
    """The widget `explore` returns: its controls are attributes, so code (and tests) can set them."""

    def __init__(self, tables: Mapping[str, pd.DataFrame], training: pd.DataFrame | None = None):
        super().__init__()
        self.tables = tables
        self.training = training
        labels = list(tables["summary"]["model"]) + ([] if training is None else list(training["model"]))
        self.palette = plots.palette(labels)  # from every method, so a method's colour never moves
        layers = sorted(int(layer) for layer in tables["summary"]["layer"].unique())
        roles = plots.layer_roles(layers)
        three = tuple(dict.fromkeys(roles.values()))
        wide = widgets.Layout(width="auto")
        fit = {"button_width": "auto"}  # ToggleButtons are a fixed width, too narrow for the longer labels

        self.methods = {m: widgets.ToggleButton(value=True, description=m, tooltip=f"show {m}", layout=wide)
                        for m in self.palette}
        self.view = widgets.ToggleButtons(options=VIEWS + ((LOSS_VIEW,) if training is not None else ()),
                                          description="View", style=fit)
        self.kind = widgets.ToggleButtons(options=KIND_OPTIONS, description="Spectrum", style=fit)
        self.circuit = widgets.ToggleButtons(options=list(dict.fromkeys(tables["summary"]["circuit"])),
                                             description="Circuit", style=fit)
        combined = [(f"early, middle, late (L={', '.join(map(str, three))})", three)] if len(three) > 1 else []
        self.layers = widgets.Dropdown(
            options=combined + [(plots.layer_title(layer, layers), (layer,)) for layer in layers], description="Layers")
        self.layer_buttons = {role: widgets.Button(description=f"{role} (L={layer})", layout=wide)
                              for role, layer in roles.items()}
        for button, layer in zip(self.layer_buttons.values(), roles.values()):
            button.on_click(lambda _, layer=layer: setattr(self.layers, "value", (layer,)))
        self.output = widgets.Output()
        self.figures: list[Figure] = []

        for control in (*self.methods.values(), self.view, self.kind, self.circuit, self.layers):
            control.observe(self.render, names="value")
        wrap = widgets.Layout(flex_flow="row wrap")
        self.children = [widgets.HBox([widgets.Label("Methods"), *self.methods.values()], layout=wrap),
                         self.view, self.kind, *([self.circuit] if len(self.circuit.options) > 1 else []),
                         widgets.HBox([self.layers, *self.layer_buttons.values()], layout=wrap),
                         self.output]
        self.render()

    def render(self, change=None) -> None:
        """Redraw the current view into the Output (called by every control)."""
        chosen = [m for m, button in self.methods.items() if button.value]
        with self.output:
            clear_output(wait=True)
            self.figures = self._draw(chosen) if chosen else []
            for fig in self.figures:
                display(fig)
            if not chosen:
                print(NO_METHOD)

    def _draw(self, chosen: list[str]) -> list[Figure]:
        """The figures of the current view for the `chosen` methods."""
        def rows(table: pd.DataFrame) -> pd.DataFrame:
            return table[table["model"].isin(chosen)]

        view, layers = self.view.value, list(self.layers.value)
        spectra, summary, similarity = (rows(self.tables[name]) for name in ("spectra", "summary", "similarity"))
        common = {"circuit": self.circuit.value, "palette": self.palette}
        if view == "spectra":
            return [plots.spectra_figure(spectra, kind=self.kind.value, layers=layers, **common)]
        if view == "cumulative variance":
            return [plots.cumulative_variance_figure(spectra, kind=self.kind.value, layers=layers, **common)]
        if view == "effective rank":
            return [plots.effective_rank_figure(summary, kind=self.kind.value, highlight_layers=layers, **common)]
        if view == "heatmaps":
            return [plots.similarity_heatmaps(similarity, layer, **common) for layer in layers]
        return [plots.loss_curves_figure(rows(self.training), palette=self.palette)]


def explore(analysis, training: pd.DataFrame | None = None) -> Explorer:
    """Interactive view of an analysis: `analysis` is a `headlab.analysis.Analysis` (or anything
    with .similarity, .spectra and .summary DataFrames) or a dict of those three tables;
    `training` (model, tokens, val_loss) adds a validation-loss view. Display the result (the
    last expression of a cell) to use it."""
    if isinstance(analysis, Mapping):
        missing = [name for name in TABLES if name not in analysis]
        tables = analysis
    else:
        missing = [name for name in TABLES if not hasattr(analysis, name)]
        tables = {name: getattr(analysis, name) for name in TABLES if hasattr(analysis, name)}
    if missing:
        raise ValueError(f"explore() needs the tables {', '.join(TABLES)}; missing {', '.join(missing)}")
    for name, table, columns in (("summary", tables["summary"], SUMMARY_COLUMNS), ("training", training, ("model",))):
        absent = [] if table is None else [c for c in columns if c not in table.columns]
        if absent:
            raise ValueError(f"the {name} table is missing column(s) {', '.join(absent)}")
    return Explorer({name: tables[name] for name in TABLES}, training)
