"""Figures of the head-similarity study: tidy tables in, `matplotlib.figure.Figure` out.

    fig = spectra_figure(analysis.spectra)                       # the flagship figure (uncentered)
    save_figure(fig, manifest, "figures/spectra")                # PNG and SVG, listed in the folder's manifest

Every function is pure: it reads tables with the columns of `headlab.analysis` (see each
docstring), keeps one circuit (`"qk"` unless told), and returns a new Figure that pyplot does
not track, so nothing is shown or left open and no global style changes. The figure is a
`NotebookFigure`: in Jupyter, Colab or VS Code it displays itself once, as a PNG, whether or not
`%matplotlib inline` was run (a plain Figure made without pyplot shows only its repr text there).

Methods look the same in every figure. `method_order` puts a table's models in the order of the
paper's figures by their role column (`headlab.schema.ROLES`: Standard MHA, LRKV by ascending
rank, MQA, MLA, GQA), never by parsing a label, then any model without a role (a pretrained
model, say) in the order first seen. `palette` gives each label, in that order, a tab10 colour,
and each label also gets a marker by its place in the palette. A figure
builds its palette from the methods it shows. To keep a method's colour fixed when a figure shows
only some methods, pass one `palette=` built from all of them to every call (the widgets do this).

A table with a `seed` column holding several seeds is drawn as the mean over seeds with a
min–max band (error bars in `loss_vs_cache_figure`); every title says how many seeds it shows.
A table must hold one `mla_rope` setting (see `headlab.analysis`): filter it first.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter, MaxNLocator, PercentFormatter

from headlab.io import Manifest
from headlab.schema import KINDS, role_order

KIND_TITLES = {"uncentered": "uncentered", "centered": "centered, PCA-based"}
CIRCUIT_TITLES = {"qk": "QK circuit", "ov": "OV circuit", "pattern": "attention maps"}
MEASURE_TITLES = {"frobenius": "Weights (Frobenius)", "data": "Data-aware weights (Σ of inputs)",
                  "jensen_shannon": "Behaviour (attention maps, 1 − JS)"}
SPECTRA_TITLE = "Eigenvalue spectra of head similarity matrices"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")
HEATMAP_CMAP = "RdBu_r"
REFERENCE_COLOR = "0.35"
HIGHLIGHT_COLOR = "0.88"
PANEL_SIZE = (4.6, 3.9)  # inches per panel of a row of layer panels
SINGLE_SIZE = (9.0, 4.6)  # a one-axes figure with its legend on the right
BAND = "min–max over seeds"


class NotebookFigure(Figure):
    """A matplotlib Figure that IPython displays as a PNG even when no inline backend is active
    (`%matplotlib inline` registers a formatter for every Figure, which then takes precedence)."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()


# ---- methods: order, colours, markers ------------------------------------------------------

def save_figure(figure: Figure, manifest: Manifest, name: str) -> Path:
    """Write `figure` as <name>.png (130 dpi, what report.md shows) and <name>.svg (for print)
    into the folder of `manifest`, which records them (`name` may hold a subfolder: 'figures/x');
    each is drawn into memory and written atomically, never through a link. Returns the PNG's path."""
    drawn = {}
    # SVG without a date: the same figure gives the same bytes
    for suffix, options in ((".png", {"dpi": 130}), (".svg", {"metadata": {"Date": None}})):
        buffer = io.BytesIO()
        figure.savefig(buffer, format=suffix[1:], bbox_inches="tight", **options)
        drawn[name + suffix] = buffer.getvalue()
    manifest.write_all({file: lambda out, data=data: out.write(data) for file, data in drawn.items()})
    return manifest.file(name + ".png")


def method_order(models: Iterable[str], roles: Iterable[str] | None = None) -> list[str]:
    """The distinct `models` (a table's model column) in figure order: by their `roles` (the
    table's role column, when it has one) in the order of `headlab.schema.ROLES`, then any model
    without a comparison role (a pretrained model, say) in the order first seen. Without roles,
    the order first seen: a table lists its models in the order they were analysed."""
    models = list(models)
    return role_order(roles, models) if roles is not None else list(dict.fromkeys(models))


def table_methods(table: pd.DataFrame) -> list[str]:
    """`method_order` of a table's model column, by its role column where it has one."""
    return method_order(table["model"], table["role"] if "role" in table else None)


def palette(labels: Iterable[str]) -> dict[str, str]:
    """A colour (hex) per distinct label, in the order given (a `method_order`): tab10 in its own
    order (blue, orange, green, red, purple, brown, ... as in the paper's figures), evenly spaced
    hues past ten."""
    order = list(dict.fromkeys(labels))
    colours = sns.color_palette("tab10" if len(order) <= 10 else "husl", len(order)).as_hex()
    return dict(zip(order, colours))


@dataclass(frozen=True)
class _Methods:
    """The methods a figure draws (`order`) and how every method looks."""

    order: list[str]
    colors: dict[str, str]
    markers: dict[str, str]

    def handles(self) -> list[Line2D]:
        """Legend entries, one per drawn method, in order."""
        return [Line2D([], [], color=self.colors[m], marker=self.markers[m], markersize=6, linewidth=1.8, label=m)
                for m in self.order]


def _methods(data: pd.DataFrame, fixed: Mapping[str, str] | None) -> _Methods:
    """The methods of `data` in family order, drawn with the colours of `fixed` (a `palette` that
    names all of them, and possibly more) or of a palette of just these methods."""
    order = table_methods(data)
    colors = dict(fixed) if fixed is not None else palette(order)
    unknown = [m for m in order if m not in colors]
    if unknown:
        raise ValueError(f"palette has no colour for {', '.join(map(repr, unknown))}: "
                         f"it names {', '.join(map(repr, colors))}")
    markers = {m: MARKERS[n % len(MARKERS)] for n, m in enumerate(colors)}
    return _Methods(order, colors, markers)


# ---- layers --------------------------------------------------------------------------------

def layer_roles(layers: Iterable[int]) -> dict[str, int]:
    """The early, middle and late layer among `layers` (numbered from 0): the first, the one at
    index len // 2 and the last; for 12 layers 0, 6 and 11, the paper's 128M choice. A role is
    given only to a layer no earlier role has: two layers are Early and Late, one is Early."""
    available = sorted({int(layer) for layer in layers})
    if not available:
        raise ValueError("no layers to choose from")
    roles = {"Early": available[0], "Late": available[-1], "Middle": available[len(available) // 2]}
    distinct = {}
    for role, layer in roles.items():
        if layer not in distinct.values():
            distinct[role] = layer
    return {role: distinct[role] for role in ("Early", "Middle", "Late") if role in distinct}


def layer_title(layer: int, layers: Iterable[int]) -> str:
    """A panel title: "Early Layer (L=0)", "Middle Layer (L=6)", "Late Layer (L=11)" for the
    `layer_roles` of `layers`, else "Layer (L=4)"."""
    role = next((name for name, value in layer_roles(layers).items() if value == layer), None)
    return f"{role} Layer (L={layer})" if role else f"Layer (L={layer})"


def _chosen_layers(data: pd.DataFrame, layers: Sequence[int] | None) -> list[int]:
    """`layers`, checked against the table, or its distinct early, middle and late layers."""
    available = sorted(data["layer"].unique())
    if layers is None:
        return list(dict.fromkeys(layer_roles(available).values()))
    unknown = [layer for layer in layers if layer not in available]
    if unknown or not layers:
        raise ValueError(f"layers = {list(layers)} is invalid: the table has layers {', '.join(map(str, available))}")
    return list(layers)


# ---- table checks --------------------------------------------------------------------------

def _checked(table: pd.DataFrame, name: str, columns: Sequence[str], circuit: str | None = None,
             kind: str | None = None) -> pd.DataFrame:
    """The rows of `table` for `circuit` and `kind` (when given), after checking its columns and
    those values; `name` is the table's name in error messages."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"the {name} table must be a pandas DataFrame, not {type(table).__name__}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"the {name} table is missing column(s) {', '.join(missing)}: "
                         f"it needs {', '.join(columns)}")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind = {kind!r} is invalid: allowed values are {', '.join(KINDS)}")
    rows = table
    if circuit is not None:
        circuits = list(dict.fromkeys(table["circuit"]))
        if circuit not in circuits:
            raise ValueError(f"circuit = {circuit!r} is not in the {name} table: allowed values are "
                             f"{', '.join(map(str, circuits)) or 'none (the table is empty)'}")
        rows = rows[rows["circuit"] == circuit]
    if kind is not None:
        rows = rows[rows["kind"] == kind]
    if rows.empty:
        raise ValueError(f"the {name} table has no rows" + (f" for circuit {circuit!r}" if circuit else "")
                         + (f" and kind {kind!r}" if kind else ""))
    return rows


def _n_seeds(data: pd.DataFrame, name: str, keys: Sequence[str]) -> int:
    """How many seeds `data` holds, after checking that it has one row per `keys` and seed
    (two runs under one label and no seed column would otherwise be averaged silently)."""
    if "mla_rope" in data.columns and data["mla_rope"].nunique() > 1:
        raise ValueError(f"the {name} table holds several mla_rope settings "
                         f"({', '.join(map(str, dict.fromkeys(data['mla_rope'])))}): pass one setting's rows")
    keys = [*keys, "seed"] if "seed" in data.columns else list(keys)
    duplicated = data[data.duplicated(keys, keep=False)]
    if not duplicated.empty:
        example = duplicated.iloc[0]
        raise ValueError(f"the {name} table has several rows for "
                         + ", ".join(f"{k} = {example[k]!r}" for k in keys)
                         + ": give each run its own `seed` (or model label)")
    return data["seed"].nunique() if "seed" in data.columns else 1


# ---- drawing helpers -----------------------------------------------------------------------

def _styled(draw):
    """Draw inside seaborn's whitegrid style and notebook context, leaving global rcParams as
    they were (the style lives on in the artists it created)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs) -> Figure:
        with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.9):
            return draw(*args, **kwargs)
    return wrapper


def _lines(ax, data: pd.DataFrame, x: str, y: str, methods: _Methods, n_seeds: int) -> None:
    """One line with markers per method; the mean with a min–max band over several seeds."""
    sns.lineplot(data=data, x=x, y=y, hue="model", style="model", hue_order=methods.order,
                 style_order=methods.order, palette=methods.colors, markers=methods.markers, dashes=False,
                 estimator="mean", errorbar=("pi", 100) if n_seeds > 1 else None, markersize=6,
                 linewidth=1.8, legend=False, ax=ax)


def _legend(fig: Figure, methods: _Methods, extra: Sequence = (), n_seeds: int = 1, below: bool = False) -> None:
    """One legend for the whole figure, outside the axes: the methods, then `extra` reference
    lines, then the seed band if any; in one row below a row of panels, else in one column on
    the right (centered, so that it keeps clear of the title)."""
    handles = methods.handles() + list(extra)
    if n_seeds > 1:
        handles.append(Patch(color="0.6", alpha=0.4, label=BAND))
    if below:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    else:
        fig.legend(handles=handles, loc="outside right center", frameon=False)


MLA_ROPE_TITLES = {"included": "MLA: RoPE part included", "excluded": "MLA: latent only (RoPE part excluded)"}


def _title(text: str, n_seeds: int | None, circuit: str = "qk", data: pd.DataFrame | None = None) -> str:
    """`text`, naming the circuit when it is not QK and which definition of MLA's heads `data`
    holds (its one `mla_rope` setting, when it has an MLA row), then how many seeds are shown
    (unless `n_seeds` is None: a measurement that seeds do not enter)."""
    notes = [CIRCUIT_TITLES.get(circuit, circuit)] if circuit != "qk" else []
    settings = [] if data is None or "mla_rope" not in data.columns else \
        list(dict.fromkeys(data.loc[data["model"].str.startswith("MLA"), "mla_rope"].dropna()))
    if len(settings) == 1 and settings[0] in MLA_ROPE_TITLES:  # "n/a": a measure MLA's RoPE does not enter
        notes.append(MLA_ROPE_TITLES[settings[0]])
    if n_seeds is not None:
        notes.append(f"mean of {n_seeds} seeds" if n_seeds > 1 else "1 seed")
    return f"{text} — {', '.join(notes)}" if notes else text


def _loss_unit(data: pd.DataFrame, name: str) -> str:
    """The unit of a table's losses: its `loss_unit` column (one value), else nats/token."""
    if "loss_unit" not in data.columns:
        return "nats/token"
    units = list(dict.fromkeys(data["loss_unit"]))
    if len(units) != 1:
        raise ValueError(f"the {name} table mixes loss units {', '.join(map(str, units))}: pass one unit's rows")
    return str(units[0])


def _layer_panel_figure(data: pd.DataFrame, name: str, layers: Sequence[int] | None, x: str, y: str,
                        xlabel: str, ylabel: str, title: str, circuit: str,
                        palette: Mapping[str, str] | None, extra: Sequence = ()) -> Figure:
    """A row of panels, one per layer (early, middle and late by default), each with a line per
    method of `y` against `x`; one legend; `extra` handles are added to it."""
    chosen = _chosen_layers(data, layers)
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data, name, ["model", "layer", x])
    fig = NotebookFigure(figsize=(PANEL_SIZE[0] * len(chosen), PANEL_SIZE[1] + 0.9), layout="constrained")
    available = data["layer"].unique()
    for ax, layer in zip(fig.subplots(1, len(chosen), squeeze=False)[0], chosen):
        _lines(ax, data[data["layer"] == layer], x, y, methods, n_seeds)
        ax.set(title=layer_title(layer, available), xlabel=xlabel, ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(_title(title, n_seeds, circuit, data), fontweight="bold")
    _legend(fig, methods, extra, n_seeds, below=True)
    return fig


# ---- figures -------------------------------------------------------------------------------

@_styled
def spectra_figure(spectra: pd.DataFrame, kind: str = "uncentered", layers: Sequence[int] | None = None,
                   circuit: str = "qk", palette: Mapping[str, str] | None = None) -> Figure:
    """The flagship figure: eigenvalue against eigenvalue index, one panel per layer ("Early
    Layer (L=0)", "Middle Layer (L=…)", "Late Layer (L=…)" by default), a line per method,
    y-axis from 0.

    spectra: model, layer, circuit, kind, index (from 1), eigenvalue [, seed].
    kind: "uncentered" (the flagship, as in the seed figure: the eigenvalues of the cosine
    similarity matrix, which sum to H, the last one nonzero; the paper's Figs. 16–17) or
    "centered" (the PCA-based spectrum, Figs. 10–11: the last eigenvalue is 0 by construction,
    which each panel notes). layers: which layers to show, one panel each.
    """
    data = _checked(spectra, "spectra", ["model", "layer", "circuit", "kind", "index", "eigenvalue"], circuit, kind)
    fig = _layer_panel_figure(data, "spectra", layers, "index", "eigenvalue", "Eigenvalue Index", "Eigenvalue",
                              f"{SPECTRA_TITLE} ({KIND_TITLES[kind]})", circuit, palette)
    for ax in fig.axes:
        ax.set_ylim(bottom=0)
        if kind == "centered":
            ax.text(0.98, 0.97, "last eigenvalue = 0\nby construction (centering)", transform=ax.transAxes,
                    ha="right", va="top", fontsize=8, color=REFERENCE_COLOR)
    return fig


@_styled
def cumulative_variance_figure(spectra: pd.DataFrame, kind: str = "centered", layers: Sequence[int] | None = None,
                               threshold: float = 0.9, circuit: str = "qk",
                               palette: Mapping[str, str] | None = None) -> Figure:
    """Cumulative variance explained against the number of components, in the panel layout of
    `spectra_figure`, with a dashed line at `threshold` (the paper's Figs. 12–13: 90%).

    spectra: model, layer, circuit, kind, index (from 1), cumulative [, seed].
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold = {threshold!r} is invalid: it is a fraction of variance in (0, 1]")
    data = _checked(spectra, "spectra", ["model", "layer", "circuit", "kind", "index", "cumulative"], circuit, kind)
    label = f"{threshold:.0%} of variance"
    fig = _layer_panel_figure(data, "spectra", layers, "index", "cumulative", "Number of components",
                              "Cumulative variance explained",
                              f"Cumulative variance of head similarity spectra ({KIND_TITLES[kind]})", circuit,
                              palette, extra=[Line2D([], [], color=REFERENCE_COLOR, linestyle="--", label=label)])
    for ax in fig.axes:
        ax.axhline(threshold, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2, zorder=1)
        ax.set_ylim(0, 1.04)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    return fig


@_styled
def similarity_heatmaps(similarity: pd.DataFrame, layer: int, circuit: str = "qk",
                        palette: Mapping[str, str] | None = None, annotate: bool | None = None) -> Figure:
    """One H × H head-similarity heatmap per method at `layer` (the paper's Figs. 6 and 18), on a
    diverging colour scale fixed to −1…1 with one shared colour bar; titles name the method (in
    its colour). annotate: write each cell's value (default: when H ≤ 8). Heads of different
    seeds do not correspond, so the table must hold one seed.

    similarity: model, layer, circuit, head_i, head_j, value.
    """
    data = _checked(similarity, "similarity", ["model", "layer", "circuit", "head_i", "head_j", "value"], circuit)
    data = data[data["layer"] == _chosen_layers(data, [layer])[0]]
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data, "similarity", ["model", "head_i", "head_j"])
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
    fig.suptitle(_title(f"Head similarity matrices, layer L={layer}", 1, circuit, data), fontweight="bold")
    return fig


@_styled
def effective_rank_figure(summary: pd.DataFrame, kind: str = "centered", circuit: str = "qk",
                          palette: Mapping[str, str] | None = None, highlight_layers: Sequence[int] = ()) -> Figure:
    """Effective rank per layer, a line per method (the paper's Figs. 7, 9, 14–15), with the
    ceiling dashed (H heads uncentered, H − 1 centered: the centered matrix has rank ≤ H − 1) and a
    "fully redundant" line at 1; `highlight_layers` are shaded.

    summary: model, layer, circuit, kind, n_heads, effective_rank [, seed].
    """
    data = _checked(summary, "summary", ["model", "layer", "circuit", "kind", "n_heads", "effective_rank"],
                    circuit, kind)
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data, "summary", ["model", "layer"])
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    _lines(ax, data, "layer", "effective_rank", methods, n_seeds)
    references = []
    for layer in highlight_layers:
        ax.axvspan(layer - 0.5, layer + 0.5, color=HIGHLIGHT_COLOR, zorder=0)
    if highlight_layers:
        word = "layer" if len(highlight_layers) == 1 else "layers"
        references.append(Patch(color=HIGHLIGHT_COLOR, label=f"{word} {', '.join(map(str, highlight_layers))}"))
    for n_heads in sorted(data["n_heads"].unique()):
        ceiling = n_heads if kind == "uncentered" else n_heads - 1
        label = f"ceiling: H = {n_heads}" if kind == "uncentered" else f"ceiling: H − 1 = {ceiling}"
        ax.axhline(ceiling, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2, zorder=1)
        references.append(Line2D([], [], color=REFERENCE_COLOR, linestyle="--", label=label))
    ax.axhline(1, color=REFERENCE_COLOR, linestyle=":", linewidth=1.5, zorder=1)
    references.append(Line2D([], [], color=REFERENCE_COLOR, linestyle=":", linewidth=1.5, label="fully redundant"))
    ax.set_ylim(0, max(data["n_heads"]) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="Layer", ylabel="Effective rank (entropy)")
    fig.suptitle(_title(f"Effective rank per layer ({KIND_TITLES[kind]})", n_seeds, circuit, data), fontweight="bold")
    _legend(fig, methods, references, n_seeds)
    return fig


@_styled
def loss_curves_figure(training: pd.DataFrame, palette: Mapping[str, str] | None = None) -> Figure:
    """Validation loss against training tokens, a line per method (rows without a validation
    loss, e.g. training-loss log lines, are skipped).

    training: model, tokens, val_loss [, step, seed, loss_unit (default nats/token), ...].
    """
    data = _checked(training, "training", ["model", "tokens", "val_loss"])
    data = data.dropna(subset=["val_loss"])
    if data.empty:
        raise ValueError("the training table has no validation losses")
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data, "training", ["model", "tokens"])
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    _lines(ax, data, "tokens", "val_loss", methods, n_seeds)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set(xlabel="Training tokens", ylabel=f"Validation loss ({_loss_unit(data, 'training')})")
    fig.suptitle(_title("Validation loss during training", n_seeds), fontweight="bold")
    _legend(fig, methods, n_seeds=n_seeds)
    return fig


@_styled
def loss_vs_cache_figure(results: pd.DataFrame, palette: Mapping[str, str] | None = None) -> Figure:
    """Final validation loss against KV cache size as % of MHA, one labelled point per method
    (the paper's Fig. 5a); with several seeds, the mean and a min–max error bar.

    results: model, kv_cache_pct, val_loss [, seed, loss_unit (default nats/token)].
    """
    data = _checked(results, "results", ["model", "kv_cache_pct", "val_loss"])
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data, "results", ["model"])
    points = data.groupby("model").agg(pct=("kv_cache_pct", "mean"), loss=("val_loss", "mean"),
                                       low=("val_loss", "min"), high=("val_loss", "max"))
    x_max = max(105.0, points["pct"].max() * 1.05)
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    for method in methods.order:
        point = points.loc[method]
        on_right = point.pct > 0.8 * x_max  # label to the left, inside the axes
        color = methods.colors[method]
        if n_seeds > 1:
            ax.errorbar(point.pct, point.loss, yerr=[[point.loss - point.low], [point.high - point.loss]],
                        color=color, capsize=3, linewidth=1.2, zorder=2)
        ax.scatter(point.pct, point.loss, color=color, marker=methods.markers[method], s=80, zorder=3)
        ax.annotate(method, (point.pct, point.loss), xytext=(-7 if on_right else 7, 5), textcoords="offset points",
                    ha="right" if on_right else "left", fontsize=9, color=color)
    ax.set_xlim(0, x_max)
    ax.margins(y=0.15)
    ax.xaxis.set_major_formatter(PercentFormatter(100))
    ax.set(xlabel="KV cache (% of Standard MHA)", ylabel=f"Final validation loss ({_loss_unit(data, 'results')})")
    fig.suptitle(_title("Final loss against KV cache size", n_seeds), fontweight="bold")
    return fig


@_styled
def decode_latency_figure(latency: pd.DataFrame, palette: Mapping[str, str] | None = None) -> Figure:
    """Milliseconds per cached decoding step against the number of cached tokens, a line per
    method, context on a log-2 axis (from `headlab.model.decoding.step_latency`).

    latency: model, context, ms [, seed].
    """
    data = _checked(latency, "latency", ["model", "context", "ms"])
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data, "latency", ["model", "context"])
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    _lines(ax, data, "context", "ms", methods, n_seeds)
    contexts = sorted(data["context"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set(xlabel="Tokens in the cache (T)", ylabel="ms per decoding step")
    fig.suptitle(_title("Cached decoding step against context length", n_seeds if n_seeds > 1 else None),
                 fontweight="bold")
    _legend(fig, methods, n_seeds=n_seeds)
    return fig


@_styled
def rank_through_training_figure(summary: pd.DataFrame, kind: str = "centered", circuit: str = "qk",
                                 layers: Sequence[int] | None = None,
                                 palette: Mapping[str, str] | None = None) -> Figure:
    """Effective rank against training step (symmetric-log axis: the early snapshots are
    log-spaced), a line per method, one panel per layer (early, middle and late by default).

    summary: model, step, layer, circuit, kind, effective_rank [, seed] (`headlab.runs.snapshots`).
    """
    data = _checked(summary, "summary", ["model", "step", "layer", "circuit", "kind", "effective_rank"], circuit, kind)
    fig = _layer_panel_figure(data, "summary", layers, "step", "effective_rank", "Training step",
                              "Effective rank (entropy)", f"Effective rank through training ({KIND_TITLES[kind]})",
                              circuit, palette)
    for ax in fig.axes:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)
    return fig


@_styled
def factor_norm_figure(factor_training: pd.DataFrame, layers: Sequence[int] | None = None,
                       palette: Mapping[str, str] | None = None) -> Figure:
    """LRKV's key residual-to-shared norm ratio (mean over heads of ‖U_h B_hᵀ‖_F / ‖W_shared‖_F)
    against training step, a line per LRKV variant, one panel per layer (early, middle and late
    by default); symmetric-log step axis, as the snapshots are log-spaced early.

    factor_training: model, step, layer, norm_ratio [, seed] (`headlab.study.tables.snapshot_tables`).
    """
    data = _checked(factor_training, "factor_training", ["model", "step", "layer", "norm_ratio"])
    fig = _layer_panel_figure(data, "factor_training", layers, "step", "norm_ratio", "Training step",
                              "‖U_h B_hᵀ‖ / ‖W_shared‖ (keys)", "LRKV's residual-to-shared norm ratio through training",
                              "qk", palette)
    for ax in fig.axes:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)
    return fig


@_styled
def measures_figure(summary: pd.DataFrame, kind: str = "centered", measures: Sequence[str] | None = None,
                    palette: Mapping[str, str] | None = None) -> Figure:
    """Effective rank (% of H) per layer under each measure of head similarity, one panel per
    measure (weights, data-aware weights, attention maps), a line per method.

    summary: model, layer, measure, kind, effective_rank_pct_of_heads [, seed], one circuit per
    measure (QK for the weight measures, "pattern" for attention maps: filter first).
    """
    data = _checked(summary, "summary", ["model", "layer", "measure", "kind", "effective_rank_pct_of_heads"],
                    kind=kind)
    shown = list(dict.fromkeys(data["measure"])) if measures is None else list(measures)
    unknown = [m for m in shown if m not in set(data["measure"])]
    if unknown or not shown:
        raise ValueError(f"measures = {shown} is invalid: the table has measures "
                         f"{', '.join(map(str, dict.fromkeys(data['measure'])))}")
    methods = _methods(data, palette)
    n_seeds = _n_seeds(data.drop(columns=[c for c in ("mla_rope",) if c in data]), "summary",
                       ["model", "layer", "measure"])
    fig = NotebookFigure(figsize=(PANEL_SIZE[0] * len(shown), PANEL_SIZE[1] + 0.9), layout="constrained")
    for ax, measure in zip(fig.subplots(1, len(shown), squeeze=False, sharey=True)[0], shown):
        _lines(ax, data[data["measure"] == measure], "layer", "effective_rank_pct_of_heads", methods, n_seeds)
        ax.set(title=MEASURE_TITLES.get(measure, measure), xlabel="Layer", ylabel="Effective rank (% of H)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(_title(f"Do the measures agree? Effective rank per layer ({KIND_TITLES[kind]})", n_seeds),
                 fontweight="bold")
    _legend(fig, methods, n_seeds=n_seeds, below=True)
    return fig


@_styled
def _grid_point_labels(data: pd.DataFrame, points: list[str], axes: list[str]) -> list[str]:
    """A grid point's tick label: its values of the grid's varying columns `axes` ('1,800 steps',
    'kv_residual_init = 0'), or its key when there are none."""
    if not axes:
        return points
    first = data.drop_duplicates("point").set_index("point").loc[points]

    def value(row, axis: str) -> str:
        if axis == "length":
            return f"{int(row['steps']):,} steps"
        return f"{axis} = {row[axis]:g}" if isinstance(row[axis], (int, float)) else f"{axis} = {row[axis]}"

    return [", ".join(value(row, axis) for axis in axes) for _, row in first.iterrows()]


@_styled
def sweep_figure(table: pd.DataFrame, palette: Mapping[str, str] | None = None, axes: list[str] = ()) -> Figure:
    """The paired difference to Standard MHA (mean ± 95% half-width) of every comparison at every
    grid point of a sweep (`headlab.study.sweep`): a panel per metric, grid points along x in the
    table's order, a line per variant, zero marked; an interval off the zero line is an ordering.

    table: point, comparison, metric, unit, mean, half_width, seeds (and steps, and the columns
    named in `axes`: the grid's varying columns, which label the points).
    """
    data = _checked(table, "sweep", ["point", "comparison", "metric", "unit", "mean", "half_width", "seeds"])
    data = data.rename(columns={"comparison": "model"})
    methods = _methods(data, palette)
    points = list(dict.fromkeys(data["point"]))
    metrics = list(dict.fromkeys(data["metric"]))
    labels = _grid_point_labels(data, points, list(axes))
    fig = NotebookFigure(figsize=(PANEL_SIZE[0] * len(metrics), PANEL_SIZE[1] + 0.6), layout="constrained")
    panels = np.atleast_1d(fig.subplots(1, len(metrics), squeeze=False)[0])
    offsets = np.linspace(-0.15, 0.15, len(methods.order)) if len(methods.order) > 1 else [0.0]
    for ax, metric in zip(panels, metrics):
        rows = data[data["metric"] == metric]
        ax.axhline(0, color=REFERENCE_COLOR, linewidth=1, linestyle="--")
        for offset, method in zip(offsets, methods.order):
            line = rows[rows["model"] == method].set_index("point").reindex(points)
            if line["mean"].isna().all():
                continue
            x = np.arange(len(points)) + offset
            ax.errorbar(x, line["mean"], yerr=line["half_width"].fillna(0), color=methods.colors[method],
                        marker=methods.markers[method], capsize=3, linewidth=1.4, markersize=5)
        tilted = max(map(len, labels)) > 12
        ax.set_xticks(range(len(points)), labels, rotation=30 if tilted else 0, ha="right" if tilted else "center")
        ax.set(title=metric, ylabel=f"vs Standard MHA ({rows['unit'].iloc[0]})")
    n_seeds = int(data["seeds"].max())
    fig.suptitle(f"Paired difference to Standard MHA across the sweep (mean ± 95% interval, {n_seeds} seeds)",
                 fontweight="bold")
    _legend(fig, methods)
    return fig
