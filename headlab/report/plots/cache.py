"""What the KV cache costs and buys: final loss against cache size, decoding time against context."""

from __future__ import annotations

from typing import Mapping

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from headlab.report.plots.checks import checked_rows, seed_count, table_loss_unit
from headlab.report.plots.methods import methods_of
from headlab.report.plots.panels import figure_legend, figure_title, method_lines
from headlab.report.plots.style import SINGLE_SIZE, NotebookFigure, styled


@styled
def loss_vs_cache_figure(results: pd.DataFrame, palette: Mapping[str, str] | None = None) -> Figure:
    """Final validation loss against KV cache size as % of MHA, one labelled point per method
    (the paper's Fig. 5a); with several seeds, the mean and a min–max error bar.

    results: model, kv_cache_pct, val_loss [, seed, loss_unit (default nats/token)].
    """
    data = checked_rows(results, "results", ["model", "kv_cache_pct", "val_loss"])
    methods = methods_of(data, palette)
    n_seeds = seed_count(data, "results", ["model"])
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
    ax.set(xlabel="KV cache (% of Standard MHA)", ylabel=f"Final validation loss ({table_loss_unit(data, 'results')})")
    fig.suptitle(figure_title("Final loss against KV cache size", n_seeds, data=data), fontweight="bold")
    return fig


@styled
def decode_latency_figure(latency: pd.DataFrame, palette: Mapping[str, str] | None = None) -> Figure:
    """Milliseconds per cached decoding step against the number of cached tokens, a line per
    method, context on a log-2 axis (from `headlab.model.decoding.step_latency`).

    latency: model, context, ms [, seed].
    """
    data = checked_rows(latency, "latency", ["model", "context", "ms"])
    methods = methods_of(data, palette)
    n_seeds = seed_count(data, "latency", ["model", "context"])
    fig = NotebookFigure(figsize=SINGLE_SIZE, layout="constrained")
    ax = fig.subplots()
    method_lines(ax, data, "context", "ms", methods, n_seeds)
    contexts = sorted(data["context"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set(xlabel="Tokens in the cache (T)", ylabel="ms per decoding step")
    fig.suptitle(figure_title("Cached decoding step against context length", n_seeds if n_seeds > 1 else None),
                 fontweight="bold")
    figure_legend(fig, methods, n_seeds=n_seeds)
    return fig
