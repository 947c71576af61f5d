"""How every figure looks: titles, markers, colours and sizes, seaborn's style around each
drawing, the figure class that shows itself in a notebook, and saving a figure into a folder."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from headlab.io import Manifest

KIND_TITLES = {"uncentered": "uncentered", "centered": "centered, PCA-based"}
CIRCUIT_TITLES = {"qk": "QK circuit", "ov": "OV circuit", "pattern": "attention maps"}
MEASURE_TITLES = {"frobenius": "Weights (Frobenius)", "data": "Data-aware weights (Σ of inputs)",
                  "jensen_shannon": "Behaviour (attention maps, 1 − JS)"}
SPECTRA_TITLE = "Eigenvalue spectra of head similarity matrices"
TITLE_LINE = 95  # characters: a longer title puts what is drawn (recipe, view, seeds) on a second line
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")
HEATMAP_CMAP = "RdBu_r"
REFERENCE_COLOR = "0.35"
HIGHLIGHT_COLOR = "0.88"
PANEL_SIZE = (4.6, 3.9)  # inches per panel of a row of layer panels
SINGLE_SIZE = (9.0, 4.6)  # a one-axes figure with its legend on the right
BAND = "min–max over seeds"
# A recipe as a title names it (`headlab.study.table_files.recipe_name`): whether it is the paper's.
RECIPE_TITLES = {"Muon split": "Muon split (the paper's recipe)",
                 "AdamW on W_Q, W_K": "AdamW on W_Q, W_K (not the paper's)",
                 "AdamW": "AdamW everywhere (not the paper's)"}
MLA_ROPE_TITLES = {"included": "MLA: RoPE part included", "excluded": "MLA: latent only (RoPE part excluded)"}


class NotebookFigure(Figure):
    """A matplotlib Figure that IPython displays as a PNG even when no inline backend is active
    (`%matplotlib inline` registers a formatter for every Figure, which then takes precedence)."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()


def styled(draw):
    """Draw inside seaborn's whitegrid style and notebook context, leaving global rcParams as
    they were (the style lives on in the artists it created)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs) -> Figure:
        # imported on the first drawing, not with the module: seaborn loads scipy.stats (~1.8 CPU-s),
        # which every `headlab train` process and torchrun rank paid without drawing anything
        import seaborn as sns

        with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.9):
            return draw(*args, **kwargs)
    return wrapper


# The files a figure is saved as: PNG at 130 dpi (what report.md shows), and with `svg` also SVG (for
# print: about as long again to draw, so only on request), without a date and with its element ids
# hashed with a fixed salt instead of a random one (rc_context below): the same figure gives the same
# bytes in every run.
FIGURE_FORMATS = {".png": {"dpi": 130}, ".svg": {"metadata": {"Date": None}}}


def figure_suffixes(svg: bool = False) -> list[str]:
    """The formats a figure is saved as: PNG, and SVG with `svg`."""
    return [suffix for suffix in FIGURE_FORMATS if svg or suffix != ".svg"]


def figure_files(name: str, svg: bool = False) -> list[str]:
    """The files `save_figure` writes for `name`: <name>.png, and <name>.svg with `svg`."""
    return [name + suffix for suffix in figure_suffixes(svg)]


def save_figure(figure: Figure, manifest: Manifest, name: str, svg: bool = False) -> Path:
    """Write `figure` as `figure_files(name, svg)` (<name>.png, and <name>.svg with `svg`) into the
    folder of `manifest`, which records them (`name` may hold a subfolder: 'figures/x'); each is
    drawn into memory and written atomically, never through a link. A format not drawn this time
    that an earlier write left (<name>.svg, listed) is retired: it would show an older drawing, and
    the folder's writer deletes it when it ends (`headlab.io.writing`). Returns the PNG's path."""
    drawn = {}
    with matplotlib.rc_context({"svg.hashsalt": "headlab"}):
        for suffix in figure_suffixes(svg):
            buffer = io.BytesIO()
            figure.savefig(buffer, format=suffix[1:], bbox_inches="tight", **FIGURE_FORMATS[suffix])
            drawn[name + suffix] = buffer.getvalue()
    manifest.write_all({file: lambda out, data=data: out.write(data) for file, data in drawn.items()})
    for stale in (name + suffix for suffix in FIGURE_FORMATS if name + suffix not in drawn):
        if stale in manifest.files:
            manifest.retire(stale)
    return manifest.file(name + ".png")
