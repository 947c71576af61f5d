"""`explore()`: ipywidgets controls over the `headlab.report.plots` figures of an analysis.

    from headlab.report.widgets import explore
    explore(analysis)                      # an Analysis, or {"similarity": ..., "spectra": ..., "summary": ...}
    explore(analysis, training=training)   # adds a "loss curves" view (model, tokens, val_loss)
    explore(stack_recipes([tables, *recipes_beside(tables)]), training=...)  # a study and the shipped
                                           # tables of its other recipes: a Recipe control switches them

The controls choose the methods (a checkbox each, beside the method's colour), the view, uncentered
or centered spectra, the layers (any one, or its early, middle and late layers together) and one value of every
analysis choice the tables vary over: every text column of the summary table besides `model` and
`kind` (`circuit`, and e.g. `measure` or `mla_rope` when an analysis option added them) with more
than one value, and the training `step` of per-step tables
(`headlab.analysis.snapshots.analyze_snapshots`). Controls that do nothing in the current view are
disabled. With a study's random-initialisation tables (`init_spectra`, `init_summary`) the
spectra and effective-rank views draw that baseline dashed, and, on the QK weights, the paper's
values (the seed figure's λ₁, Table 3), as the report's figures do. Every change redraws
the chosen plots; the explorer draws once when it is created (on the uncentered spectra, the
flagship figure), so a headless run (nbmake, nbconvert) shows a figure.

A redraw of a large study takes seconds, and clicks arrive faster. In a kernel, a change only
marks the figure pending (the line below the controls says so) and the redraw waits until no
change has come for `SETTLE_SECONDS`: changes that queued up while a figure was drawing are
coalesced, and only the latest state is drawn, so the figure always ends on the controls' state.
The pending line goes only once the new figure has been sent to the page, has had
`DRAWN_SECONDS` to show there, and no change waits behind it: whenever the figure shown is not the
controls' state, the line says so (a figure's clearing is dropped when a later figure comes). JupyterLab
may hand widget messages to kernel subshells, threads with event loops of their own: every change is
taken up on the first change's loop, so redraws never run at once. The figures
of the last `KEPT_VIEWS` states are kept, so going back to one (the default view) is instant.
Outside an event loop (scripts, tests) every change redraws at once.

Displayed, the explorer is two outputs: the controls (a widget view) and its current figures as a
plain PNG output with a display id, which every redraw updates in place. Where widgets render
(Jupyter, JupyterLab, VS Code, Colab) both are live; where they cannot (nbconvert's HTML, GitHub,
nbviewer: the widget view needs a kernel or a CDN) the PNG of the last view is still there. It
uses only standard ipywidgets and plain matplotlib figures. The figures last drawn are kept in
`explorer.figures` for saving.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import html
import io
from collections import OrderedDict
from typing import Mapping

import ipywidgets as widgets
import numpy as np
import pandas as pd
import PIL.Image
from IPython.display import DisplayHandle, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headlab.report import plots

TABLES = ("similarity", "spectra", "summary")
INIT_TABLES = ("init_spectra", "init_summary")  # a study's random-initialisation baseline, if given
TITLED = ("mla_rope", "measure", "recipe")  # choices every figure's title names itself (`plots.panels.figure_title`)
SUMMARY_COLUMNS = ("model", "layer", "circuit")  # what the explorer reads itself to build its controls
NOT_CHOICES = ("model", "role", "kind")  # text columns of the summary with controls of their own (a role names a model)
VIEWS = ("spectra", "heatmaps", "effective rank", "cumulative variance")
LOSS_VIEW = "loss curves"
KIND_OPTIONS = (("uncentered", "uncentered"), ("centered (PCA)", "centered"))
USES_KIND = ("spectra", "effective rank", "cumulative variance")  # views the Spectrum control changes
NO_METHOD = "Select at least one method."
SETTLE_SECONDS = 0.15  # a redraw waits this long after the last change (clicks queued behind a draw come at once)
# The pending line stays this long after a figure is sent: a busy page can apply the line's change
# before it shows the figure's PNG (seen in Chromium under load, once in nine runs, at 0.15 s).
DRAWN_SECONDS = 0.5
KEPT_VIEWS = 12  # states whose figures are kept for going back to them
CROP_MARGIN = 10  # pixels of white kept around each figure (savefig's pad_inches=0.1 at 100 dpi)
PENDING = "<i>redrawing for the controls' new state…</i>"


def choice_columns(summary: pd.DataFrame) -> dict[str, list[str]]:
    """The analysis choices a summary table varies over: each text column besides `model` and
    `kind` with more than one value, and its values in order of appearance. Rows without a value
    (a choice that applies to some models only) are drawn whatever the choice. The training
    `step` of per-step tables (`headlab.runs.snapshots`) is a choice too, though it is a number."""
    text = [c for c in summary.columns
            if c == "step" or c not in NOT_CHOICES and not pd.api.types.is_numeric_dtype(summary[c])]
    values = {c: list(dict.fromkeys(summary[c].dropna())) for c in text}
    return {c: v for c, v in values.items() if len(v) > 1}


def choice_name(column: str) -> str:
    """How controls and figure titles name an analysis-choice column."""
    return CHOICE_NAMES.get(column, column.replace("_", " "))


CHOICE_NAMES = {"mla_rope": "MLA RoPE"}


def _capitalized(name: str) -> str:
    return name[:1].upper() + name[1:]


def stacked_png(figures: list[Figure]) -> bytes:
    """One PNG of `figures` one below the other (white where they are narrower), each cropped to
    what it draws plus a margin, as savefig's bbox_inches="tight" would, but rendered once; lightly
    compressed, as the PNG only travels to the page: what the reader waits for is this function."""
    images = [_cropped(_rendered(fig)) for fig in figures]
    width = max(image.shape[1] for image in images)
    padded = [np.pad(image, ((0, 0), (0, width - image.shape[1]), (0, 0)), constant_values=255) for image in images]
    buffer = io.BytesIO()
    PIL.Image.fromarray(np.concatenate(padded)).save(buffer, format="png", compress_level=1)
    return buffer.getvalue()


def _rendered(fig: Figure) -> np.ndarray:
    """`fig` drawn at its own dpi, as RGB pixels (rows, columns, 3): rendered once, unless what
    it draws reaches its edges (a title wider than two panels: layouts keep a margin otherwise),
    which savefig's bbox_inches="tight" then takes in."""
    shown = fig.canvas
    canvas = FigureCanvasAgg(fig)
    try:
        canvas.draw()
        image = np.array(canvas.buffer_rgba())[..., :3]
    finally:
        fig.set_canvas(shown)  # as savefig leaves it
    edges = (image[0], image[-1], image[:, 0], image[:, -1])
    if all((edge == 255).all() for edge in edges):
        return image
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", facecolor="white")
    return np.array(PIL.Image.open(buffer).convert("RGB"))


def _cropped(image: np.ndarray, margin: int = CROP_MARGIN) -> np.ndarray:
    """`image` without its white border, `margin` pixels of it kept."""
    ink = (image < 255).any(axis=2)
    rows, columns = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if rows.size == 0:
        return image
    return image[max(rows[0] - margin, 0):rows[-1] + margin + 1, max(columns[0] - margin, 0):columns[-1] + margin + 1]


@contextlib.contextmanager
def collection_paused():
    """Python's garbage collection paused inside (if it was on): a redraw makes tens of thousands of
    objects that live as long as its figures, and every collection during it would scan them and
    the kernel's tables again (a fifth of a heatmaps redraw); they are collected later, at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Explorer(widgets.VBox):
    """The widget `explore` returns: its controls are attributes, so code (and tests) can set them."""

    def __init__(self, tables: Mapping[str, pd.DataFrame], training: pd.DataFrame | None = None):
        super().__init__()
        self.tables = tables
        self.training = training
        models = [table[[c for c in ("model", "role") if c in table]] for table in (tables["summary"], training)
                  if table is not None]
        self.palette = plots.table_palette(pd.concat(models))  # every method's, so a method's colour never moves
        layers = sorted(int(layer) for layer in tables["summary"]["layer"].unique())
        roles = plots.layer_roles(layers)
        wide = widgets.Layout(width="auto")
        fit = {"button_width": "auto"}  # ToggleButtons are a fixed width, too narrow for the longer labels

        self.methods = {m: widgets.Checkbox(value=True, description=m, indent=False, layout=wide)
                        for m in self.palette}
        swatches = {m: widgets.HTML(f'<span style="color:{colour};font-size:1.4em">&#9632;</span>')
                    for m, colour in self.palette.items()}
        self.view = widgets.ToggleButtons(options=VIEWS + ((LOSS_VIEW,) if training is not None else ()),
                                          description="View", style=fit)
        self.kind = widgets.ToggleButtons(options=KIND_OPTIONS, description="Spectrum", style=fit)
        circuits = list(dict.fromkeys(tables["summary"]["circuit"]))
        self.choices = {column: widgets.ToggleButtons(options=values, description=_capitalized(choice_name(column)),
                                                      style=fit)
                        for column, values in {"circuit": circuits, **choice_columns(tables["summary"])}.items()}
        self.circuit = self.choices["circuit"]
        combined = [(combined_layers_label(roles), tuple(roles.values()))] if len(roles) > 1 else []
        self.layers = widgets.Dropdown(
            options=combined + [(plots.layer_title(layer, layers), (layer,)) for layer in layers], description="Layers")
        self.figures: list[Figure] = []
        self.figure_display = DisplayHandle()  # the PNG output beside the controls, once displayed
        self.displayed = False
        self.status = widgets.HTML("")  # says when the figure below is about to be redrawn
        self.drawn: OrderedDict[tuple, dict] = OrderedDict()  # state -> its figures and (once made) PNG bundle
        self.shown: tuple | None = None  # the state whose figures are shown
        self.pending: asyncio.TimerHandle | None = None  # the redraw waiting for changes to settle
        self.clearing: asyncio.TimerHandle | None = None  # the pending line's clearing, DRAWN_SECONDS after a figure
        self.loop: asyncio.AbstractEventLoop | None = None  # where changes are taken up (`changed`)

        for control in (*self.methods.values(), self.view, self.kind, *self.choices.values(), self.layers):
            control.observe(self.changed, names="value")
        wrap = widgets.Layout(flex_flow="row wrap")
        method_boxes = [widgets.HBox([swatches[m], box]) for m, box in self.methods.items()]
        shown_choices = [control for control in self.choices.values() if len(control.options) > 1]
        self.children = [widgets.HBox([widgets.Label("Methods"), *method_boxes], layout=wrap),
                         self.view, self.kind, *shown_choices,
                         self.layers, self.status]
        self.render()

    def state(self) -> tuple:
        """Everything the figures depend on: view, spectrum, layers, analysis choices, methods."""
        return (self.view.value, self.kind.value, self.layers.value, tuple(c.value for c in self.choices.values()),
                tuple(m for m, box in self.methods.items() if box.value))

    def changed(self, change=None) -> None:
        """A control changed (called by every control, in whichever thread took the change in:
        JupyterLab hands widget messages to kernel subshells, each a thread with an event loop of
        its own). In a kernel, the change is taken up on one event loop, the first change's, so
        that one redraw runs at a time; there it marks the figure pending and (re)starts the wait
        for the changes behind it. Outside any event loop (scripts, tests), redraw now."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if self.loop is None or self.loop.is_closed():
            self.loop = here
        if self.loop is None:
            self._enable_controls()
            self.render()
        elif here is self.loop:
            self._mark_pending()
        else:
            self.loop.call_soon_threadsafe(self._mark_pending)

    def _mark_pending(self) -> None:
        """On the explorer's event loop: say the figure is pending and redraw once no change has
        come for `SETTLE_SECONDS`."""
        self._enable_controls()
        if self.pending is not None:
            self.pending.cancel()
        self.status.value = PENDING
        self.pending = self.loop.call_later(SETTLE_SECONDS, self._render_pending)

    def _render_pending(self) -> None:
        """`render`, run by the event loop: a failure is said below the controls, not only in the kernel's log."""
        try:
            self.render()
        except Exception as error:
            self.status.value = f"<b>redraw failed</b>: {html.escape(f'{type(error).__name__}: {error}')}"
            raise

    def _enable_controls(self) -> None:
        """Enable the controls the current view uses, disable the others."""
        view = self.view.value
        self.kind.disabled = view not in USES_KIND
        for column, control in self.choices.items():  # the loss curves are of one study: its recipe applies
            control.disabled = view == LOSS_VIEW and (self.training is None or column not in self.training.columns)
        self.layers.disabled = view == LOSS_VIEW

    def render(self) -> None:
        """Show the figures of the controls' current state (drawn now, or kept from before) in the
        PNG output, then clear the pending line: it stays on screen until the new figure is."""
        self.pending = None
        self._enable_controls()
        state = self.state()
        if state not in self.drawn:
            chosen = list(state[-1])
            with collection_paused():
                self.drawn[state] = {"figures": self._draw(chosen) if chosen else [], "bundle": None}
            while len(self.drawn) > KEPT_VIEWS:
                self.drawn.popitem(last=False)
        self.drawn.move_to_end(state)
        self.shown, self.figures = state, self.drawn[state]["figures"]
        if self.displayed:
            self.figure_display.update(self.figure_bundle(), raw=True)
        if self.clearing is not None:  # an earlier figure's: it would clear the line before this one shows
            self.clearing.cancel()
        try:
            # Clicks that came while this state drew wait in the kernel's queue: they are handled
            # before this callback, and keep the pending line (see `_clear_status`).
            self.clearing = asyncio.get_running_loop().call_later(DRAWN_SECONDS, self._clear_status)
        except RuntimeError:
            self.clearing = None
            self._clear_status()

    def _clear_status(self) -> None:
        """Clear the pending line, once the figure of the controls' state is on screen: not while
        another redraw waits."""
        if self.pending is None:
            self.status.value = ""

    def _draw(self, chosen: list[str]) -> list[Figure]:
        """The figures of the current view for the `chosen` methods."""
        fixed = {column: control.value for column, control in self.choices.items() if column != "circuit"}
        if self.view.value == LOSS_VIEW:
            keep = self.training["model"].isin(chosen)
            for column, value in fixed.items():  # a recipe: the runs of one study
                if column in self.training.columns:
                    keep &= self.training[column] == value
            return [plots.loss_curves_figure(self.training[keep], palette=self.palette)]

        def rows(table: pd.DataFrame) -> pd.DataFrame:
            keep = table["model"].isin(chosen)
            for column, value in fixed.items():
                if column in table.columns:
                    keep &= (table[column] == value) | table[column].isna()
            return table[keep]

        view, layers, kind, circuit = self.view.value, list(self.layers.value), self.kind.value, self.circuit.value
        spectra, summary, similarity = (rows(self.tables[name]) for name in ("spectra", "summary", "similarity"))
        init_spectra, init_summary = (self._baseline(rows(self.tables[name]), circuit, kind) if name in self.tables
                                      else None for name in INIT_TABLES)
        # the paper's values are of the QK weights (Frobenius): no mark beside another circuit or view
        paper = circuit == "qk" and set(summary.get("measure", pd.Series(["frobenius"])).dropna()) <= {"frobenius"}
        common = {"circuit": circuit, "palette": self.palette}
        if view == "spectra":
            figures = [plots.spectra_figure(spectra, kind=kind, layers=layers, init=init_spectra,
                                            seed_figure=paper and kind == "uncentered", **common)]
        elif view == "cumulative variance":
            figures = [plots.cumulative_variance_figure(spectra, kind=kind, layers=layers, **common)]
        elif view == "effective rank":
            figures = [plots.effective_rank_figure(summary, kind=kind, highlight_layers=layers, init=init_summary,
                                                   paper=paper, **common)]
        else:
            figures = [plots.similarity_heatmaps(similarity, layer, **common) for layer in layers]
        shown = [f"{choice_name(column)}: {value}" for column, value in fixed.items()
                 if len(self.choices[column].options) > 1 and column not in TITLED]
        for fig in figures if shown else ():  # a saved image names the choices it was drawn with
            fig.suptitle(f"{fig.get_suptitle()} ({', '.join(shown)})")
        return figures

    @staticmethod
    def _baseline(table: pd.DataFrame, circuit: str, kind: str) -> pd.DataFrame | None:
        """The rows of a random-initialisation table for `circuit` and `kind`, None where it has none
        (a study keeps the QK weights' baseline only)."""
        chosen = table[(table["circuit"] == circuit) & (table["kind"] == kind)]
        return chosen if len(chosen) else None

    def figure_bundle(self) -> dict:
        """The figures shown as one PNG (or the reason there is none), as a display bundle: made
        once per state."""
        entry = self.drawn[self.shown]
        if entry["bundle"] is None and not self.figures:
            entry["bundle"] = {"text/plain": NO_METHOD}
        elif entry["bundle"] is None:
            view, *_, methods = self.shown
            with collection_paused():
                png = stacked_png(self.figures)
            entry["bundle"] = {"image/png": png, "text/plain": f"headlab explorer: {view} of {len(methods)} methods"}
        return entry["bundle"]

    def _ipython_display_(self) -> None:
        """The controls, then the figures as a PNG output that `render` updates in place."""
        display(super()._repr_mimebundle_(), raw=True)
        display(self.figure_bundle(), raw=True, display_id=self.figure_display.display_id)
        self.displayed = True


def combined_layers_label(roles: dict[str, int]) -> str:
    """The layer menu's entry for all the `plots.layer_roles` at once: 'early, middle and late (L=0, 2, 3)',
    'early and late (L=0, 1)'."""
    names = [role.lower() for role in roles]
    return f"{', '.join(names[:-1])} and {names[-1]} (L={', '.join(map(str, roles.values()))})"


def explore(analysis, training: pd.DataFrame | None = None) -> Explorer:
    """Interactive view of an analysis: `analysis` is a `headlab.analysis.Analysis` (or anything
    with .similarity, .spectra and .summary DataFrames) or a dict of those three tables, and of a
    study's `init_spectra` and `init_summary` if it has them (the random-initialisation baseline);
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
    return Explorer({name: tables[name] for name in (*TABLES, *INIT_TABLES) if name in tables}, training)
