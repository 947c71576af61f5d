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
# layers 0, 6 and 11 matched to our first, middle and last. In the first layer, where the paper's
# heads share most, every method's trained λ₁ lies far below the paper's bar and nearer its dashed
# random start (the numbers are in the tables below).

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
# from index 1 to 2 in the first layer, as in the paper's figure, and less in the later ones.

# %%
spectra(RECIPES[1])

# %% [markdown]
# ## Method by method: λ₁ beside the paper's and random initialisation
# Each study's distance to the seed figure, as the study tabulated it (`distance_table`): per
# method and panel, the paper's λ₁ (read off), ours trained and at random initialisation (mean ±
# sd over seeds), and d₁, the L1 distance between our spectrum and the seed's, each divided by its
# sum (0: the same shape; at most 2). The line printed above each table gives the range of λ₁ over
# the six methods in the first layer. Read the differences between methods against the ± columns:
# an ordering smaller than the spread over seeds is not one.

# %%
def first_layer(recipe):
    """The range over methods of the seed-mean λ₁ in the first panel: trained, random init, the paper's."""
    rows = studies[recipe]["seed_distance"].query("panel == 'Early'")
    means = rows.groupby(["state", "role"])["first_eigenvalue"].mean()
    span = lambda values: f"{values.min():.2f}–{values.max():.2f}"
    return (f"{recipe} ({recipe_name(studies[recipe].meta)}), first layer: λ₁ {span(means['trained'])} trained, "
            f"{span(means['init'])} at random init; the paper's {span(rows['seed_first_eigenvalue'])}")


print(first_layer(RECIPES[0]))
studies[RECIPES[0]]["distance_table"]

# %%
print(first_layer(RECIPES[1]))
studies[RECIPES[1]]["distance_table"]

# %% [markdown]
# The shape (the drop after λ₁) is one question; whether the methods fall in the paper's order is
# another. The rank correlation (Spearman) of our six seed-mean λ₁ with the paper's, per panel: 1
# would be the paper's order, 0 none, −1 the reverse. With six methods a correlation this far from
# 1 says the order does not follow the paper's.

# %%
def order_against_paper(recipe):
    trained = studies[recipe]["seed_distance"].query("state == 'trained'")
    means = trained.groupby(["panel", "role"], sort=False)[["first_eigenvalue", "seed_first_eigenvalue"]].mean()
    return means.groupby("panel", sort=False).apply(
        lambda panel: panel["first_eigenvalue"].corr(panel["seed_first_eigenvalue"], method="spearman"))


pd.DataFrame({recipe_name(studies[recipe].meta): order_against_paper(recipe) for recipe in RECIPES}).T.round(2)

# %% [markdown]
# ## The effective rank, beside Table 3
# The paper's Table 3 gives each method's effective rank as % of H (uncentered and centered); the
# study's `rank_table` sets ours (mean ± sd over seeds of the layer mean, the range over layers in
# brackets) beside it, with the random-init value of the same runs. Under the paper's recipe every
# rank sits within two points of its random-init value, the ceiling; with AdamW on W_Q and W_K the
# uncentered ranks fall below it, all but MLA's latent-only row (the paper's definition of its heads).

# %%
pd.concat({recipe_name(studies[recipe].meta): studies[recipe]["rank_table"].set_index(["role", "ours"])
           for recipe in RECIPES}, names=["recipe"])

# %% [markdown]
# ## The data-aware view
# The weights view above compares the heads' QK forms W_Q,h W_K,hᵀ as matrices. The data-aware
# view weights the same forms by the second moments Σ of each layer's actual inputs (validation
# tokens): it asks how alike the heads score real tokens. Each figure: effective rank (% of H) per
# layer in three views, weights, data-aware and behaviour (the heads' attention maps). Dashed in
# the weights panel: random initialisation (the study keeps the weights' baseline only; the
# data-aware view at random init is step 0 of the next section); bars there: Table 3 (the paper
# measured the weights only). Under either recipe the data-aware ranks lie far below the weights':
# the inputs carry directions that the heads' scores share.

# %%
def views(recipe):
    tables = studies[recipe]
    return plots.measures_figure(tables["measures"], kind="uncentered", palette=colours,
                                 init=flagship(tables, "init_summary"), paper=True)


views(RECIPES[0])

# %%
views(RECIPES[1])

# %% [markdown]
# ## The mechanism, through training
# Both views of Standard MHA's first layer as it trains, from step 0 (random initialisation) to
# the last: λ₁ of the weights view and of the data-aware view, under each recipe, beside the
# paper's λ₁. The regime study (science/regime_study.md) measured this in runs retrained with a
# probe that reads the whole model at each snapshot; the table is shipped with headlab (means over
# 3 seeds, at the page's precision, without their spread: read it for its large movements only).
# Printed below the table: where each recipe starts and ends.

# %%
through = read_shipped(THROUGH_TRAINING)
print(through.meta["note"])
rows = through["through_training"]
for recipe, run in rows.groupby("recipe", sort=False):
    first, last = run.iloc[0], run.iloc[-1]
    print(f"{recipe}: weights λ₁ {first['weights_lambda1']:.2f} → {last['weights_lambda1']:.2f}, data-aware λ₁ "
          f"{first['data_aware_lambda1']:.2f} → {last['data_aware_lambda1']:.2f} (steps {first['step']}–{last['step']})")
plots.views_through_training_figure(rows)

# %% [markdown]
# Under either recipe the data-aware λ₁ climbs within the first hundred steps, from its random-init
# value to about 4.5 of 6 by the end: the layer's inputs carry a direction that every head's scores
# share. The weights view is where the recipes part: under Muon it stays near its random start; with
# AdamW on W_Q and W_K it rises in the first hundred steps and stays above Muon's, so the gap between
# the two views is smaller at the end.

# %% [markdown]
# ## What it means, and where to go next
# At our scale the paper's recipe does not give the paper's figure: Muon, which orthogonalises each
# update of W_Q and W_K, keeps the heads' forms about as unlike each other as they were drawn,
# while the inputs they read have a shared direction that AdamW lets the forms take up. The regime
# study varies one setting at a time under Muon (batch, length, weight decay, head width, context,
# vocabulary, architecture) and finds none that moves λ₁ near the paper's. With AdamW on W_Q and
# W_K the figure takes the seed figure's shape, a drop after λ₁, but not its order of methods nor
# its sizes (the tables above). To go further:
#
# * train either study yourself: `headlab reproduce` (`make demo`), or `headlab reproduce --preset
#   cpu-small-adamw-qk --out runs/qk`;
# * notebook 03 shows any finished study folder (`RUNS = "../runs/qk"`) or the tables shipped for a
#   preset (`PRESET = "cpu-small-adamw-qk"`), with every figure beside the paper and the random-init
#   baseline, and switches between the two recipes in its explorer;
# * the regime study's page, science/regime_study.md, has every measurement and command.
