"""Spectra and effective rank per layer: the flagship figure, cumulative variance, effective
rank per layer, and the effective rank under each measure of head similarity."""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, PercentFormatter

from headlab.report.plots.checks import checked_rows, seed_count
from headlab.report.plots.methods import Methods, methods_of
from headlab.report.plots.panels import (
    chosen_layers,
    figure_legend,
    figure_title,
    layer_panel_figure,
    layer_roles,
    method_lines,
)
from headlab.report.plots.style import (
    HIGHLIGHT_COLOR,
    KIND_TITLES,
    MEASURE_TITLES,
    PANEL_SIZE,
    REFERENCE_COLOR,
    SINGLE_SIZE,
    SPECTRA_TITLE,
    NotebookFigure,
    styled,
)
from headlab.schema import BEHAVIOUR
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA


@styled
def spectra_figure(spectra: pd.DataFrame, kind: str = "uncentered", layers: Sequence[int] | None = None,
                   circuit: str = "qk", palette: Mapping[str, str] | None = None, init: pd.DataFrame | None = None,
                   seed_figure: bool = False) -> Figure:
    """The flagship figure: eigenvalue against eigenvalue index, one panel per layer ("Early
    Layer (L=0)", "Middle Layer (L=…)", "Late Layer (L=…)" by default), a line per method,
    y-axis from 0 to H, the number of heads (uncentered, λ₁ = H when every head is alike), or
    higher when something drawn is (a seed mark above a smaller model's H), the same in every
    panel, so a flat spectrum looks flat. The title names the recipe and the view (`panels.figure_title`).

    spectra: model, layer, circuit, kind, index (from 1), eigenvalue [, seed].
    kind: "uncentered" (the flagship, as in the seed figure: the eigenvalues of the cosine
    similarity matrix, which sum to H, the last one nonzero; the paper's Figs. 16–17) or
    "centered" (the PCA-based spectrum, Figs. 10–11: the last eigenvalue is 0 by construction,
    which each panel notes). layers: which layers to show, one panel each.
    init: the same spectra of the runs' step-0 weights (a study's init_spectra), drawn per method
    as a thin dashed line (mean over seeds): the random-initialisation baseline.
    seed_figure: mark, per method with a role and per early, middle and late panel, the first
    eigenvalue of the seed figure (the paper's Fig. 11 at 128M, `SEED_SPECTRA`: layers 0, 6 and 11
    of 12, matched to ours by relative depth) as a bar at index 1; uncentered only.
    """
    data = checked_rows(spectra, "spectra", ["model", "layer", "circuit", "kind", "index", "eigenvalue"], circuit, kind)
    baseline = None if init is None else checked_rows(
        init, "init spectra", ["model", "layer", "circuit", "kind", "index", "eigenvalue"], circuit, kind)
    if seed_figure and kind != "uncentered":
        raise ValueError("seed_figure = True is invalid for centered spectra: the seed figure's are uncentered")
    extra = []
    if baseline is not None:
        extra.append(init_handle(seed_count(baseline, "init spectra", ["model", "layer", "index"])))
    if seed_figure:
        extra.append(Line2D([], [], color=REFERENCE_COLOR, linestyle="none", **SEED_MARK,
                            label="paper 128M, Fig. 11: λ₁ (read off)"))
    fig = layer_panel_figure(data, "spectra", layers, "index", "eigenvalue", "Eigenvalue Index", "Eigenvalue",
                             f"{SPECTRA_TITLE} ({KIND_TITLES[kind]})", circuit, palette, extra=extra)
    methods = methods_of(data, palette)
    panels = {layer: name for name, layer in layer_roles(data["layer"].unique()).items()}
    n_heads = int(data["index"].max())  # H: the spectrum of H heads has H eigenvalues
    for ax, layer in zip(fig.axes, chosen_layers(data, layers)):
        if baseline is not None:
            init_lines(ax, baseline[baseline["layer"] == layer], methods)
        if seed_figure and layer in panels:
            seed_marks(ax, data[data["layer"] == layer], methods, panels[layer])
        if kind == "centered":
            ax.text(0.98, 0.97, "last eigenvalue = 0\nby construction (centering)", transform=ax.transAxes,
                    ha="right", va="top", fontsize=8, color=REFERENCE_COLOR)
    top = max([n_heads, *(ax.get_ylim()[1] for ax in fig.axes)])  # one scale for every panel
    for ax in fig.axes:
        ax.set_ylim(0, top)
    return fig


SEED_MARK = {"marker": "_", "markersize": 18, "markeredgewidth": 2.5}  # a seed λ₁: a bar, unlike any method marker


def init_lines(ax, init: pd.DataFrame, methods: Methods, x: str = "index", y: str = "eigenvalue") -> None:
    """Per method of `init` (the step-0 rows of one panel: spectra, or a summary), `y` against `x`,
    the mean over seeds, thin and dashed in the method's colour; each line's gid is 'init:<model>'."""
    for model in methods.order:
        curve = init[init["model"] == model].groupby(x)[y].mean()
        if len(curve):
            ax.plot(curve.index, curve.to_numpy(), color=methods.colors[model], linestyle="--", linewidth=1.1,
                    alpha=0.85, zorder=1.5, gid=f"init:{model}")


def init_handle(n_init: int) -> Line2D:
    """The legend entry of `init_lines` drawn from `n_init` seeds."""
    return Line2D([], [], color=REFERENCE_COLOR, linestyle="--", linewidth=1.1,
                  label=f"random init (step 0), {'mean of ' if n_init > 1 else ''}{n_init} seed"
                        f"{'s' if n_init > 1 else ''}")


def seed_marks(ax, data: pd.DataFrame, methods: Methods, panel: str) -> None:
    """The seed figure's λ₁ at index 1 for each method of `data` (one layer) whose role it has, a
    bar in the method's colour (gid 'seed:<model>'), and the paper's layer in the title."""
    roles = dict(zip(data["model"], data["role"])) if "role" in data else {}
    for model in methods.order:
        curve = SEED_SPECTRA.get(roles.get(model), {}).get(panel)
        if curve is not None:
            ax.plot([1], [curve.first], linestyle="none", color=methods.colors[model], **SEED_MARK, zorder=4,
                    gid=f"seed:{model}")
    ax.set_title(f"{ax.get_title()} · paper L={PAPER_PANELS[panel]}")


@styled
def cumulative_variance_figure(spectra: pd.DataFrame, kind: str = "centered", layers: Sequence[int] | None = None,
                               threshold: float = 0.9, circuit: str = "qk",
                               palette: Mapping[str, str] | None = None) -> Figure:
    """Cumulative variance explained against the number of components, in the panel layout of
    `spectra_figure`, with a dashed line at `threshold` (the paper's Figs. 12–13: 90%).

    spectra: model, layer, circuit, kind, index (from 1), cumulative [, seed].
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold = {threshold!r} is invalid: it is a fraction of variance in (0, 1]")
    data = checked_rows(spectra, "spectra", ["model", "layer", "circuit", "kind", "index", "cumulative"], circuit, kind)
    label = f"{threshold:.0%} of variance"
    fig = layer_panel_figure(data, "spectra", layers, "index", "cumulative", "Number of components",
                             "Cumulative variance explained",
                             f"Cumulative variance of head similarity spectra ({KIND_TITLES[kind]})", circuit,
                             palette, extra=[Line2D([], [], color=REFERENCE_COLOR, linestyle="--", label=label)])
    for ax in fig.axes:
        ax.axhline(threshold, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2, zorder=1)
        ax.set_ylim(0, 1.04)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    return fig


@styled
def effective_rank_figure(summary: pd.DataFrame, kind: str = "centered", circuit: str = "qk",
                          palette: Mapping[str, str] | None = None, highlight_layers: Sequence[int] = (),
                          init: pd.DataFrame | None = None, paper: bool = False) -> Figure:
    """Effective rank per layer, a line per method (the paper's Figs. 7, 9, 14–15), with the
    ceiling dashed (H heads uncentered, H − 1 centered: the centered matrix has rank ≤ H − 1) and a
    "fully redundant" line at 1; `highlight_layers` are shaded.

    summary: model, layer, circuit, kind, n_heads, effective_rank [, seed].
    init: the same rows of the runs' step-0 weights (a study's init_summary), drawn per method as
    a thin dashed line (mean over seeds): the random-initialisation baseline.
    paper: mark, per method with a role, the paper's Table 3 value (the mean over layers, % of H,
    times our H) as a bar right of the last layer; QK only.
    """
    data = checked_rows(summary, "summary", ["model", "layer", "circuit", "kind", "n_heads", "effective_rank"],
                        circuit, kind)
    methods = methods_of(data, palette)
    n_seeds = seed_count(data, "summary", ["model", "layer"])
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    method_lines(ax, data, "layer", "effective_rank", methods, n_seeds)
    references = baselines(ax, data, "layer", "effective_rank", methods, init, circuit, kind, scale="n_heads",
                           paper=paper)
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
    fig.suptitle(figure_title(f"Effective rank per layer ({KIND_TITLES[kind]})", n_seeds, circuit, data),
                 fontweight="bold")
    figure_legend(fig, methods, references, n_seeds)
    return fig


PAPER_MARK_LABEL = "paper 128M, Table 3: mean over layers"


def baselines(ax, data: pd.DataFrame, x: str, y: str, methods: Methods, init: pd.DataFrame | None, circuit: str,
              kind: str, scale: str | None = None, paper: bool = False) -> list:
    """What a per-layer figure of `y` is compared with, drawn on `ax` (whose lines are `data`'s):
    `init`'s same rows (a study's init_summary: the runs' step-0 weights), a thin dashed line per
    method (mean over seeds, gid 'init:<model>'); with `paper`, the paper's Table 3 value per method
    with a role (`PAPER`, % of H; times `data`'s `scale` column, H, where `y` is not a percentage),
    a bar in the method's colour right of the last layer (gid 'paper:<model>'). Returns their
    legend handles."""
    handles = []
    if init is not None:
        rows = init[(init["circuit"] == circuit) & (init["kind"] == kind) & init["model"].isin(methods.order)]
        for column in ("measure", "mla_rope"):  # the init rows of what `data` shows (MLA's heads defined alike)
            if column in rows and column in data:
                rows = rows[rows[column].isin(data[column].dropna().unique())]
        if len(rows):
            init_lines(ax, rows, methods, x, y)
            handles.append(init_handle(rows["seed"].nunique() if "seed" in rows else 1))
    roles = dict(zip(data["model"], data["role"])) if paper and "role" in data and circuit == "qk" else {}
    right = float(data[x].max()) + 0.45
    marked = False
    for model in methods.order:
        numbers = PAPER.get(roles.get(model))
        if numbers is not None:
            value = getattr(numbers, kind)
            if scale is not None:
                value = value / 100 * float(data.loc[data["model"] == model, scale].max())
            ax.plot([right], [value], linestyle="none", color=methods.colors[model], **SEED_MARK, zorder=4,
                    gid=f"paper:{model}")
            marked = True
    if marked:
        ax.set_xlim(right=right + 0.35)
        handles.append(Line2D([], [], color=REFERENCE_COLOR, linestyle="none", **SEED_MARK, label=PAPER_MARK_LABEL))
    return handles


@styled
def measures_figure(summary: pd.DataFrame, kind: str = "centered", measures: Sequence[str] | None = None,
                    palette: Mapping[str, str] | None = None, init: pd.DataFrame | None = None,
                    paper: bool = False) -> Figure:
    """Effective rank (% of H) per layer under each measure of head similarity, one panel per
    measure (weights, data-aware weights, attention maps), a line per method, the y-axis from 0 to
    100 % of H.

    summary: model, layer, measure, kind, effective_rank_pct_of_heads [, seed], one circuit per
    measure (QK for the weight measures, "pattern" for attention maps: filter first).
    init: a study's init_summary (the runs' step-0 weights), drawn dashed in the panels of the
    measures it holds (a study keeps the weights' only). paper: the paper's Table 3 values in the
    weights panel (the paper measured weights only). See `baselines`.
    """
    data = checked_rows(summary, "summary", ["model", "layer", "measure", "kind", "effective_rank_pct_of_heads"],
                        kind=kind)
    shown = list(dict.fromkeys(data["measure"])) if measures is None else list(measures)
    unknown = [m for m in shown if m not in set(data["measure"])]
    if unknown or not shown:
        raise ValueError(f"measures = {shown} is invalid: the table has measures "
                         f"{', '.join(map(str, dict.fromkeys(data['measure'])))}")
    methods = methods_of(data, palette)
    n_seeds = seed_count(data.drop(columns=[c for c in ("mla_rope",) if c in data]), "summary",
                         ["model", "layer", "measure"])
    fig = NotebookFigure(figsize=(PANEL_SIZE[0] * len(shown), PANEL_SIZE[1] + 0.9), layout="constrained")
    references = {}
    for ax, measure in zip(fig.subplots(1, len(shown), squeeze=False, sharey=True)[0], shown):
        rows = data[data["measure"] == measure]
        method_lines(ax, rows, "layer", "effective_rank_pct_of_heads", methods, n_seeds)
        circuit = "pattern" if measure == BEHAVIOUR else "qk"
        for handle in baselines(ax, rows, "layer", "effective_rank_pct_of_heads", methods, init, circuit, kind,
                                paper=paper and measure == "frobenius"):
            label = handle.get_label()
            if label.startswith("random init"):  # a study keeps the weights' baseline only: say which panels
                label = f"{label}: {MEASURE_TITLES.get(measure, measure).split(' (')[0].lower()}"
                if label in references:
                    continue
                handle.set_label(label)
            references.setdefault(label, handle)
        ax.set(title=MEASURE_TITLES.get(measure, measure), xlabel="Layer", ylabel="Effective rank (% of H)")
        ax.set_ylim(0, 104)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(figure_title(f"Do the measures agree? Effective rank per layer ({KIND_TITLES[kind]})", n_seeds,
                              data=data), fontweight="bold")
    figure_legend(fig, methods, list(references.values()), n_seeds=n_seeds, below=True)
    return fig
