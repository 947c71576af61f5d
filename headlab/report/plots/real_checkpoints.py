"""Real checkpoints beside the seed figure (`headlab.study.real_tables`): each model's uncentred spectrum
at its early, middle and late layer in the weights view and the data-aware view, its random Gaussian
twin of the same shapes, and the seed figure's curve of the model's attention family."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from headlab.report.plots.colours import ROLE_MARKERS, colour_of
from headlab.report.plots.style import REFERENCE_COLOR, NotebookFigure, styled
from headlab.study.paper import SEED_SPECTRA
from headlab.study.real_tables import PANELS, VIEWS
from headlab.study.seed_distance import resampled

VIEW_TITLES = {"weights": "weights view", "data-aware": "data-aware view"}


def relative_index(n: int) -> np.ndarray:
    """Where eigenvalue i of n sits on an axis common to every head count: the middle of its slot, (i − ½)/n."""
    return (np.arange(n) + 0.5) / n


@styled
def real_checkpoint_spectra(spectra: pd.DataFrame, models: pd.DataFrame) -> Figure:
    """Rows: the two views; columns: early, middle, late layer. Per model (coloured by its attention family):
    the trained spectrum (solid), its random Gaussian twin (dotted, mean of the draws) and the family's seed
    curve scaled to sum 6 (dashed, open markers), against the relative index (i − ½)/H; eigenvalues of a
    cosine matrix average 1, so the grey line at 1 is no shared direction for every H.

    spectra, models: the real tables' `spectra` and `models` (`headlab.study.real_tables.read_real_tables`)."""
    role = dict(zip(models["model"], models["role"]))
    fig = NotebookFigure(figsize=(13, 8.6), layout="constrained")
    axes = fig.subplots(len(VIEWS), len(PANELS), sharex=True)
    rows = spectra[spectra["kind"] == "uncentered"]
    for row, view in enumerate(VIEWS):
        for col, panel in enumerate(PANELS):
            ax = axes[row, col]
            for model in models["model"]:
                here = rows[(rows["model"] == model) & (rows["panel"] == panel) & (rows["measure"] == view)]
                colour = colour_of(role[model])
                marker = ROLE_MARKERS[colour]
                trained = here[here["state"] == "trained"].sort_values("index")
                n = len(trained)
                ax.plot(relative_index(n), trained["eigenvalue"], color=colour, marker=marker, lw=2.2,
                        label=f"{model}, L={int(trained['layer'].iloc[0])}")
                random = here[here["state"] == "gaussian"].groupby("index")["eigenvalue"].mean()
                ax.plot(relative_index(n), random.to_numpy(), color=colour, ls=":", lw=1.6)
                seed = resampled(SEED_SPECTRA[role[model]][panel].eigenvalues())
                ax.plot(relative_index(seed.size), seed, color=colour, ls="--", lw=1.3, marker=marker, mfc="none",
                        ms=7)
            ax.axhline(1.0, color=REFERENCE_COLOR, lw=0.8)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{panel} layer · {VIEW_TITLES[view]}", fontsize=12)
            ax.legend(fontsize=9, loc="upper right", title="trained (layer)", title_fontsize=9)
            if col == 0:
                ax.set_ylabel("eigenvalue (their mean is 1)")
            if row == len(VIEWS) - 1:
                ax.set_xlabel("relative index (i − ½) / H")
    styles = [Line2D([], [], color=REFERENCE_COLOR, lw=2.2, label="trained checkpoint"),
              Line2D([], [], color=REFERENCE_COLOR, ls=":", lw=1.6, label="random Gaussian weights, same shapes"),
              Line2D([], [], color=REFERENCE_COLOR, ls="--", marker="o", mfc="none",
                     label="seed figure (paper 128M, Fig. 11): the family's curve, scaled to sum 6")]
    fig.legend(handles=styles, loc="outside lower center", ncol=3, fontsize=11)
    fig.suptitle("Uncentred eigenvalue spectra of head similarity: real checkpoints beside the seed figure\n(colour: "
                 "attention family, blue MHA, brown GQA, red MQA)", fontsize=13, fontweight="bold")
    return fig
