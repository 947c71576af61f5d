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
# # 00 · The finding: when do our heads look like the paper's?
#
# The LRKV paper (arXiv 2601.11471) shows in its Fig. 11 how alike the attention heads of each
# method are: the eigenvalues of the H × H similarity matrix of the heads' QK forms, largest first.
# A first eigenvalue λ₁ far above 1 means the heads share a direction; a flat spectrum at 1 means
# they are mutually orthogonal. This notebook tells what we found trying to reproduce it, from the
# tables headlab ships (nothing is trained: it runs in seconds, on Colab too).
#
# **You will learn** what the paper's figure shows; that trained the paper's way (Muon on the
# blocks' matrices, at our small scale) our heads stay where random initialisation put them, flat;
# that with AdamW on W_Q and W_K alone the same study takes the figure's shape, a sharp drop from
# λ₁ to λ₂ in every method; how each compares with the paper and with random initialisation, method
# by method; and the mechanism we measured through training: the inputs carry a shared direction
# under either recipe, and Muon keeps the QK weights from taking it up.
#
# Notebooks 01–03 train and take apart such studies yourself; notebook 03 shows any study folder
# and switches between these two recipes in its explorer.

# %% [markdown]
# ## Colab
# On Colab this cell installs headlab with its `colab` extra (no JupyterLab: Colab is the notebook
# server) from `HEADLAB_SOURCE`: a wheel you uploaded (build one in a clone with
# `pip wheel --no-deps . -w dist`), a git URL or a folder. Set it below or as an environment
# variable; left empty it is `REPOSITORY`, the published repository's git URL (pyproject.toml's
# `[project.urls] Repository`), which is `None` until headlab is published: then the cell only says
# what to do. Elsewhere install with `pip install -e ".[notebooks]"` (README) and this cell does nothing.

# %%
import importlib.util
import os
from pathlib import Path

REPOSITORY = None  # the published repository's git URL; None: point HEADLAB_SOURCE at a wheel or a clone
HEADLAB_SOURCE = os.environ.get("HEADLAB_SOURCE", "")  # e.g. "/content/headlab-0.1.0-py3-none-any.whl"
try:
    import google.colab  # noqa: F401
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
if IN_COLAB and importlib.util.find_spec("headlab") is None:
    source = HEADLAB_SOURCE or (REPOSITORY and f"git+{REPOSITORY}")
    if source:  # a file or folder becomes a file:// URL, so pip can take the [colab] extra with it
        url = Path(source).resolve().as_uri() if Path(source).exists() else source
        get_ipython().run_line_magic("pip", f'install --quiet "headlab[colab] @ {url}"')  # noqa: F821
    else:
        print("headlab is not installed and not published yet: upload a wheel built in a clone "
              "(pip wheel --no-deps . -w dist), set HEADLAB_SOURCE to its path in this cell and run it again")


# %% [markdown]
# ## Parameters
# `RECIPES` names the studies to show, as shipped inside headlab (`shipped_names()` lists them):
# `cpu-small` is `make demo`'s study, trained the paper's way; `cpu-small-adamw-qk` is the same
# study with W_Q and W_K left to AdamW. Both are six attention variants × 3 seeds × 900 steps of a
# 4-layer, 6-head model on Shakespeare bytes. `SMALL` changes nothing here (the notebook reads
# tables only, in either mode); every notebook takes it, so all run alike.

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # no effect here: this notebook reads the tables shipped with headlab and trains nothing
RECIPES = ("cpu-small", "cpu-small-adamw-qk")  # shipped studies: the paper's recipe, then AdamW on W_Q, W_K
THROUGH_TRAINING = "regime-through-training"  # the shipped probe of both views through training

# %%
# %matplotlib inline
import pandas as pd

from headlab.report import plots
from headlab.report.paper_tables import recipe_text, seed_figure_spectra
from headlab.schema import FLAGSHIP_MLA_ROPE
from headlab.study.seed_distance import seed_distance
from headlab.study.table_files import read_shipped, recipe_name, with_recipe

studies = {name: with_recipe(read_shipped(name)) for name in RECIPES}
for name, tables in studies.items():
    print(f"{name} ({recipe_name(tables.meta)}): {tables.meta['shipped']['note']}.\n  {recipe_text(tables.meta)}")
colours = plots.table_palette(studies[RECIPES[0]]["summary"])  # each method's colour, in every figure

# %% [markdown]
# ## The paper's figure
# The seed figure: Fig. 11 of the paper, at 128M parameters (12 layers of 6 heads), uncentered,
# in its layers 0, 6 and 11. Its values were read off the figure by eye (about ±0.1; it gives no
# λ₃…λ₅, which are drawn straight between λ₂ and λ₆). Every method drops sharply after λ₁: its
# heads share one direction, most of all in the first layer (Standard MHA's λ₁ is 5 of 6).

# %%
plots.spectra_figure(seed_figure_spectra(), kind="uncentered")  # colours by role: the same as ours

# %% [markdown]
# ## Ours, trained the paper's way
# `make demo`'s study: the six variants trained as the paper trains them (Muon on every block
# matrix, AdamW on the embedding and the head), drawn the same way on an axis from 0 to H. Solid:
# the trained runs (mean over 3 seeds, the band their range). Dashed: the same runs at step 0,
# random initialisation. Bars at index 1: the paper's λ₁ from the figure above, per method, its
# layers 0, 6 and 11 matched to our first, middle and last. The trained spectra hardly leave their
# random start: the heads' QK forms share almost no direction, far below the paper's bars.

# %%
def flagship(tables, name):
    """A study's rows at the report's flagship setting of MLA's heads."""
    return tables[name][tables[name]["mla_rope"] == FLAGSHIP_MLA_ROPE]


def spectra(recipe):
    tables = studies[recipe]
    return plots.spectra_figure(flagship(tables, "spectra"), kind="uncentered", palette=colours,
                                init=flagship(tables, "init_spectra"), seed_figure=True)


spectra(RECIPES[0])

# %% [markdown]
# ## Ours, with AdamW on W_Q and W_K
# The same study, changed in one place: the query and key projections are trained by AdamW, every
# other matrix still by Muon (the preset `cpu-small-adamw-qk`). Now every method's spectrum drops
# sharply from index 1 to 2 in the first layer, as in the paper's figure, and less in the later ones.

# %%
spectra(RECIPES[1])

# %% [markdown]
# ## Method by method: λ₁ beside the paper's and random initialisation
# The first eigenvalue of each method in each panel: the paper's (read off), ours at random
# initialisation and trained under each recipe (mean ± sd over seeds). The shape's drop is where
# λ₁ leaves its random-init value; how close each method comes to the paper's λ₁, and whether the
# methods fall in the paper's order, is a separate question: the last line gives the rank
# correlation (Spearman) of our six λ₁ with the paper's in each panel.

# %%
def first_eigenvalues(tables):
    """λ₁ per role, panel and state (trained, init), one row per seed (`seed_distance`)."""
    panels = plots.layer_roles(tables["spectra"]["layer"])
    distances = seed_distance(tables["spectra"], tables["init_spectra"], panels, FLAGSHIP_MLA_ROPE)
    return distances.assign(recipe=recipe_name(tables.meta))


rows = pd.concat([first_eigenvalues(tables) for tables in studies.values()], ignore_index=True)
trained = rows[rows["state"] == "trained"]
init = rows[(rows["state"] == "init") & (rows["recipe"] == rows["recipe"].iloc[0])]  # one draw: the seeds' step 0
spread = lambda values: f"{values.mean():.2f} ± {values.std():.2f}"
table = pd.concat([
    trained.groupby(["panel", "model"], sort=False)["seed_first_eigenvalue"].first().rename("paper λ₁"),
    init.groupby(["panel", "model"], sort=False)["first_eigenvalue"].agg(spread).rename("random init"),
    trained.pivot_table(index=["panel", "model"], columns="recipe", values="first_eigenvalue", aggfunc=spread,
                        sort=False)], axis=1)
table

# %%
means = trained.groupby(["recipe", "panel", "model"], sort=False)[["first_eigenvalue", "seed_first_eigenvalue"]].mean()
correlation = means.groupby(["recipe", "panel"], sort=False).apply(
    lambda panel: panel["first_eigenvalue"].corr(panel["seed_first_eigenvalue"], method="spearman"))
correlation.unstack("panel").round(2)

# %% [markdown]
# ## The mechanism, through training
# Two views of Standard MHA's first layer as it trains. The weights view is the one above: the
# similarity of the heads' QK forms W_Q,h W_K,hᵀ. The data-aware view weights the same forms by
# the second moments of the layer's actual inputs: it asks how alike the heads score real tokens.
# Under either recipe the data-aware λ₁ climbs steeply in the first hundred steps and ends near the
# paper's λ₁: the inputs carry a direction that every head's scores share. Under Muon the weights
# view stays near its random start; with AdamW on W_Q and W_K it rises with the data-aware one, and
# the gap between the two views closes by almost half. The regime study (science/regime_study.md)
# measured this in runs retrained with a probe that reads the whole model at each snapshot; the
# table is shipped with headlab (means over 3 seeds, at the page's precision).

# %%
through = read_shipped(THROUGH_TRAINING)
print(through.meta["note"])
plots.views_through_training_figure(through["through_training"])

# %% [markdown]
# ## What it means, and where to go next
# At our scale the paper's recipe does not give the paper's figure: Muon, which orthogonalises each
# update of W_Q and W_K, keeps the heads' forms as unlike each other as they were drawn, while the
# inputs they read have a shared direction that AdamW lets the forms take up. The regime study
# varies one setting at a time under Muon (batch, length, weight decay, head width, context,
# vocabulary, architecture) and finds none that moves λ₁ near the paper's. To go further:
#
# * train either study yourself: `headlab reproduce` (`make demo`), or `headlab reproduce --preset
#   cpu-small-adamw-qk --out runs/qk`;
# * notebook 03 shows any study folder (`RUNS = "../runs/qk"`) with every figure beside the paper
#   and the random-init baseline, and switches between the two recipes in its explorer;
# * the regime study's page, science/regime_study.md, has every measurement and command.
