# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Comparing heads layer by layer
#
# The flagship figure of this study: **eigenvalue spectra of head similarity matrices** in an
# early, a middle and a late layer, for all six attention variants, with the figures that explain
# it and an interactive explorer.
#
# **You will learn** how to read a head-similarity spectrum (a steep drop after the first
# eigenvalue: heads alike; a flat spectrum: heads diverse), why the centred and uncentred spectra
# tell different stories, how effective rank changes with depth for each variant, how our
# effective ranks compare with the paper's Table 3, and how to explore every layer and method
# with `headlab.widgets.explore`.

# %% [markdown]
# ## Colab
# On Colab this cell installs headlab and turns on Colab's support for ipywidgets 8. Set
# `REPO_URL` to the repository that holds headlab first; elsewhere the cell does nothing.

# %%
REPO_URL = "https://github.com/<owner>/headlab"  # <- PLACEHOLDER: set to headlab's repository URL
try:
    import google.colab  # noqa: F401
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
if IN_COLAB:
    assert "<owner>" not in REPO_URL, "set REPO_URL above to the repository that holds headlab"
    # %pip install --quiet "headlab @ git+{REPO_URL}"
    from google.colab import output
    output.enable_custom_widget_manager()  # ipywidgets 8 (explore())

# %% [markdown]
# ## Parameters
# The same switch as notebook 01, whose runs this notebook reuses (it trains them first if they
# are missing). `SEEDS > 1` draws the mean over seeds with a min–max band.

# %% tags=["parameters"]
SMALL = True  # True: tiny models, seconds (CI). False: the cpu-small study
SEEDS = 1  # as in notebook 01
RUNS = None  # None: runs/notebooks/<small|full>, where notebook 01 trains

# %%
# %matplotlib inline
import torch

from headlab import plots
from headlab.reproduce import NotebookStudy, collect_tables, report_tables
from headlab.widgets import explore

if SMALL:
    torch.set_num_threads(1)  # tiny tensors: more threads only add synchronisation overhead
STUDY = NotebookStudy.choose(SMALL, RUNS)
VARIANTS = STUDY.variants

# %% [markdown]
# ## The runs and their tables
# `collect_tables` analyses the QK circuit of every run and returns the tidy tables (with a `seed`
# column) and the validation-loss history.

# %%
runs = STUDY.train(SEEDS, progress=False)
tables, training = collect_tables(runs)
colours = plots.palette(tables["summary"]["model"])  # one colour per method, in every figure
layers = plots.layer_roles(tables["summary"]["layer"])
layers

# %% [markdown]
# ## The flagship figure
# Each panel is one layer; each line one variant's H eigenvalues of the head-similarity matrix G,
# largest first. Uncentred, the eigenvalues sum to H: a first eigenvalue near H means every head's
# QK form points the same way, a flat line at 1 means the heads are mutually orthogonal. With
# `SMALL = True` the models are barely trained and every line stays close to 1; the `cpu-small`
# runs separate.

# %%
plots.spectra_figure(tables["spectra"], kind="uncentered", palette=colours)

# %% [markdown]
# Centred (a PCA of the heads): the common direction all heads share is removed first, so what is
# left is how the heads differ from their mean. One eigenvalue is always 0, since the centred matrix
# has rank at most H − 1. Where sharing keys (MQA, GQA) makes heads alike mainly along that common
# direction, centring narrows their gap to MHA: the paper reads MQA's rise from 72.6 % (uncentred)
# to 78.4 % (centred) of H as "query compensation", though removing a dominant mean direction
# raises the centred rank of any method whose heads share one.

# %%
plots.spectra_figure(tables["spectra"], kind="centered", palette=colours)

# %% [markdown]
# ## How many directions do the heads span?
# Cumulative variance explained: the number of components a layer's heads need to reach 90 %.

# %%
plots.cumulative_variance_figure(tables["spectra"], kind="centered", palette=colours)

# %% [markdown]
# Effective rank per layer summarises each spectrum in one number: from 1 (all heads alike) up to
# the dashed ceiling (H uncentred, H − 1 centred).

# %%
plots.effective_rank_figure(tables["summary"], kind="uncentered", palette=colours)

# %%
plots.effective_rank_figure(tables["summary"], kind="centered", palette=colours)

# %% [markdown]
# ## Beside the paper
# The mean effective rank over layers as % of H, in the form of the paper's Table 3, with the
# paper's 128M figures beside ours. The paper's centred values (82–83 % for six heads) sit at the
# ceiling H − 1 = 83.3 %, so differences there are small by construction.

# %%
report_tables(tables, training, VARIANTS)["rank"].round(1)

# %% [markdown]
# ## Inside one layer
# The H × H similarity matrices behind the middle panel (seed 0). Off-diagonal cells near 0 are
# heads with unrelated QK forms; a block of high values is a group of heads that score alike.

# %%
similarity = tables["similarity"].query("seed == 0")
plots.similarity_heatmaps(similarity, layer=layers["Middle"], palette=colours)

# %% [markdown]
# ## Explore
# Toggle methods, pick any layer (or early, middle and late together), switch between centred and
# uncentred spectra, and change the view: spectra, heatmaps, effective rank, cumulative variance or
# loss curves. Every change redraws. The explorer draws its first view as soon as it is created, so
# a run without a browser (CI) renders it too; `explorer.figures` holds the figures last drawn.

# %%
explorer = explore({**tables, "similarity": similarity}, training=training)
explorer

# %% [markdown]
# ## Saving figures
# Every figure is a matplotlib `Figure`: save it at any size and format. `headlab reproduce` (or
# `headlab.reproduce.draw_figures(tables, training, folder)`) writes all of them as PNG and SVG
# beside a report that sets our numbers against the paper's.

# %%
flagship = plots.spectra_figure(tables["spectra"], kind="uncentered", palette=colours)
flagship.savefig(STUDY.folder / "spectra_uncentered.png", dpi=150, bbox_inches="tight")
