"""A sweep's figure: the paired difference to Standard MHA at every grid point."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headlab.report.plots.checks import checked_rows
from headlab.report.plots.methods import methods_of
from headlab.report.plots.panels import figure_legend
from headlab.report.plots.style import PANEL_SIZE, REFERENCE_COLOR, NotebookFigure, styled


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


@styled
def sweep_figure(table: pd.DataFrame, palette: Mapping[str, str] | None = None, axes: list[str] = ()) -> Figure:
    """The paired difference to Standard MHA (mean ± 95% half-width) of every comparison at every
    grid point of a sweep (`headlab.study.sweep`): a panel per metric, grid points along x in the
    table's order, a line per variant, zero marked; an interval off the zero line is an ordering.

    table: point, comparison, metric, unit, mean, half_width, seeds (and steps, and the columns
    named in `axes`: the grid's varying columns, which label the points) [, role: each comparison
    in its role's colour, as in the flagship figure].
    """
    data = checked_rows(table, "sweep", ["point", "comparison", "metric", "unit", "mean", "half_width", "seeds"])
    data = data.rename(columns={"comparison": "model"})
    methods = methods_of(data, palette)
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
    figure_legend(fig, methods)
    return fig
