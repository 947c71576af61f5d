"""Figures against training progress: validation loss, effective rank and LRKV's factor norms
through training (from the run's snapshots), and λ₁ of two views through training (a probe's table)."""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter

from headlab.report.plots.checks import checked_rows, seed_count, table_loss_unit
from headlab.report.plots.colours import RECIPE_COLOURS
from headlab.report.plots.methods import methods_of
from headlab.report.plots.panels import figure_legend, figure_title, layer_panel_figure, method_lines
from headlab.report.plots.style import KIND_TITLES, REFERENCE_COLOR, SINGLE_SIZE, NotebookFigure, styled
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA


@styled
def loss_curves_figure(training: pd.DataFrame, palette: Mapping[str, str] | None = None) -> Figure:
    """Validation loss against training tokens, a line per method (rows without a validation
    loss, e.g. training-loss log lines, are skipped).

    training: model, tokens, val_loss [, step, seed, loss_unit (default nats/token), ...].
    """
    data = checked_rows(training, "training", ["model", "tokens", "val_loss"])
    data = data.dropna(subset=["val_loss"])
    if data.empty:
        raise ValueError("the training table has no validation losses")
    methods = methods_of(data, palette)
    n_seeds = seed_count(data, "training", ["model", "tokens"])
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    method_lines(ax, data, "tokens", "val_loss", methods, n_seeds)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set(xlabel="Training tokens", ylabel=f"Validation loss ({table_loss_unit(data, 'training')})")
    fig.suptitle(figure_title("Validation loss during training", n_seeds, data=data), fontweight="bold")
    figure_legend(fig, methods, n_seeds=n_seeds)
    return fig


@styled
def rank_through_training_figure(summary: pd.DataFrame, kind: str = "centered", circuit: str = "qk",
                                 layers: Sequence[int] | None = None,
                                 palette: Mapping[str, str] | None = None) -> Figure:
    """Effective rank against training step (symmetric-log axis: the early snapshots are
    log-spaced), a line per method, one panel per layer (early, middle and late by default).

    summary: model, step, layer, circuit, kind, effective_rank [, seed] (`headlab.runs.snapshots`).
    """
    data = checked_rows(summary, "summary", ["model", "step", "layer", "circuit", "kind", "effective_rank"], circuit,
                        kind)
    fig = layer_panel_figure(data, "summary", layers, "step", "effective_rank", "Training step",
                             "Effective rank (entropy)", f"Effective rank through training ({KIND_TITLES[kind]})",
                             circuit, palette)
    for ax in fig.axes:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)
    return fig


@styled
def factor_norm_figure(factor_training: pd.DataFrame, layers: Sequence[int] | None = None,
                       palette: Mapping[str, str] | None = None) -> Figure:
    """LRKV's key residual-to-shared norm ratio (mean over heads of ‖U_h B_hᵀ‖_F / ‖W_shared‖_F)
    against training step, a line per LRKV variant, one panel per layer (early, middle and late
    by default); symmetric-log step axis, as the snapshots are log-spaced early.

    factor_training: model, step, layer, norm_ratio [, seed] (`headlab.study.tables.snapshot_tables`).
    """
    data = checked_rows(factor_training, "factor_training", ["model", "step", "layer", "norm_ratio"])
    fig = layer_panel_figure(data, "factor_training", layers, "step", "norm_ratio", "Training step",
                             "‖U_h B_hᵀ‖ / ‖W_shared‖ (keys)", "LRKV's residual-to-shared norm ratio through training",
                             "qk", palette)
    for ax in fig.axes:
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)
    return fig


@styled
def views_through_training_figure(through: pd.DataFrame) -> Figure:
    """The first eigenvalue λ₁ of the weights view (solid) and of the data-aware view (dashed)
    against training step, a colour per recipe, y from 0 to H; the seed figure's λ₁ of the role at
    its panel (the paper's Fig. 11 at 128M) dotted. Step 0 is the random initialisation.

    through: recipe, role, layer, n_heads, step, weights_lambda1, data_aware_lambda1 [, seeds]: one role
    and layer (the regime study's probe, shipped as `regime-through-training`)."""
    data = checked_rows(through, "through_training", ["recipe", "role", "layer", "n_heads", "step", "weights_lambda1",
                                                      "data_aware_lambda1"])
    (role,), (layer,) = data["role"].unique(), data["layer"].unique()
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    handles = []
    for recipe, rows in data.groupby("recipe", sort=False):
        colour = RECIPE_COLOURS.get(recipe, REFERENCE_COLOR)
        rows = rows.sort_values("step")
        for column, style, view in (("weights_lambda1", "-", "weights"), ("data_aware_lambda1", "--", "data-aware")):
            ax.plot(rows["step"], rows[column], color=colour, linestyle=style, marker="o", markersize=5,
                    markeredgecolor="w", linewidth=1.8, gid=f"{view}:{recipe}")
            handles.append(Line2D([], [], color=colour, linestyle=style, marker="o", label=f"{recipe}: {view}"))
    panel = next((name for name, paper_layer in PAPER_PANELS.items() if paper_layer == layer), None)
    seed = SEED_SPECTRA.get(role, {}).get(panel)
    if seed is not None:
        ax.axhline(seed.first, color=REFERENCE_COLOR, linestyle=":", linewidth=1.5, gid="seed")
        handles.append(Line2D([], [], color=REFERENCE_COLOR, linestyle=":", linewidth=1.5,
                              label=f"paper 128M, Fig. 11: λ₁ at L={layer} (read off)"))
    n_heads = int(data["n_heads"].max())
    ax.set_ylim(0, n_heads)
    ax.set_xlim(left=0)
    ax.set(xlabel="Training step (0: random initialisation)", ylabel=f"λ₁ (of H = {n_heads})")
    label = PAPER[role].label if role in PAPER else role
    n_seeds = int(data["seeds"].max()) if "seeds" in data else None
    fig.suptitle(figure_title(f"{label}, layer L={layer}: λ₁ of the weights and of the data-aware view through "
                              "training", n_seeds), fontweight="bold")
    fig.legend(handles=handles, loc="outside right center", frameon=False)
    return fig
