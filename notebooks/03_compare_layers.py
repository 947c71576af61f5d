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
# eigenvalue: heads alike; a flat spectrum: heads diverse), why the centered and uncentered spectra
# tell different stories, how effective rank changes with depth for each variant, how our
# effective ranks compare with the paper's Table 3 and the random-init baseline, how to explore every
# layer, method and recipe with `headlab.report.widgets.explore`, and how to show any study folder.

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
if IN_COLAB:
    from google.colab import output
    output.enable_custom_widget_manager()  # ipywidgets 8 (explore())

# %% [markdown]
# ## Parameters
# The same switch as notebook 01, whose study this notebook reads. `SMALL = True`: the six `tiny`
# variants, trained here in seconds if notebook 01 has not left them. `SMALL = False`: the 3-seed
# `cpu-small` study of `make demo`, from its tables only: those in `runs/reproduce` if it has
# finished, else the copy shipped inside headlab (the line printed says which, and why); nothing is
# trained, so it takes seconds. `SEEDS > 1` draws the mean over seeds with a min–max band.
#
# `RUNS` shows any finished study folder instead (`headlab reproduce --out DIR`), whatever its preset
# and recipe: both are read from the folder's `study.json`, never assumed. A folder that cannot be
# shown (a study still training, no study) stops with one line; nothing stands in for it.
# `PRESET` asks for another preset's study where `RUNS` is `None`: with `SMALL = False` and nothing
# of it on disk, the tables headlab ships for it stand in (`headlab.study.table_files.shipped_names()`
# lists them: `cpu-small`, `make demo`'s, trained with the paper's Muon split, and
# `cpu-small-adamw-qk`, the same study with AdamW on W_Q and W_K).

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # True: tiny models, seconds (CI). False: the cpu-small study's tables, no training
SEEDS = None  # runs per variant (seeds 0, 1, ...); None: every seed the study has (1 in small mode, 3 in full)
RUNS = None  # a study folder; None: make demo's runs/reproduce (full) or runs/notebooks/small/<settings> (small)
PRESET = None  # e.g. "cpu-small-adamw-qk"; None: the preset RUNS' study records, else tiny (small) or cpu-small (full)

# %%
# %matplotlib inline
from os.path import relpath

import torch

from headlab.report import plots
from headlab.report.widgets import explore
from headlab.report.paper_tables import recipe_text
from headlab.study.claims import measure_claims, per_seed_ranks, per_step_metrics, training_claims
from headlab.study.notebook import NotebookStudy
from headlab.schema import FLAGSHIP_MLA_ROPE
from headlab.study.table_files import recipes_beside, stack_recipes, with_recipe
from headlab.study.tables import study_tables

if SMALL:
    torch.set_num_threads(1)  # tiny tensors: more threads only add synchronisation overhead
STUDY = NotebookStudy.choose(SMALL, RUNS, PRESET)
SEEDS = SEEDS or STUDY.seeds or (1 if SMALL else 3)
VARIANTS = STUDY.variants

# %% [markdown]
# ## The runs and their tables
# `study_tables` reads the study's tidy tables (with `seed` and `role` columns), the ones `headlab
# reproduce` writes beside its runs. Where the study has no finished tables (headlab installed
# without the repository, as on Colab, or no `make demo` yet) and `RUNS` named no folder, it reads
# the tables shipped inside the package for the same settings, if any, and says so and why; else, in
# small mode only (`train=SMALL`), it trains the runs (or reuses the finished ones) and analyses them
# once. Every section below only reads these tables, marked with their training recipe
# (`with_recipe`), which every figure's title names. MLA is analysed twice, recorded in the `mla_rope` column: with its decoupled RoPE query/key parts inside A_h ("included") and with the paper's
# latent-only W_K,h = W_down W_up,h ("excluded"). The figures below use the setting of the report's
# flagship (`FLAGSHIP_MLA_ROPE`); the explorer at the end switches between the two.

# %%
tables = with_recipe(study_tables(STUDY, SEEDS, train=SMALL, stand_in=STUDY.stand_in))  # both settings of mla_rope
shown = ("the tables shipped with headlab" if "shipped" in tables.meta else
         f"the study in {relpath(STUDY.folder)}")  # relative to this notebook: no absolute path in its outputs
print(f"showing {shown}: {tables.meta['preset']}, {len(tables.meta['seeds'])} seed(s), {tables.meta['steps']} steps. "
      f"{recipe_text(tables.meta)}")
training = tables["training"]
flagship = {name: tables[name][tables[name]["mla_rope"] == FLAGSHIP_MLA_ROPE]
            for name in ("spectra", "summary", "similarity", "init_spectra", "init_summary")}
colours = plots.table_palette(tables["summary"])  # one colour per method, in every figure
layers = plots.layer_roles(tables["summary"]["layer"])
layers

# %% [markdown]
# ## The flagship figure
# Each panel is one layer; each line one variant's H eigenvalues of the head-similarity matrix G,
# largest first, on an axis from 0 to H. Uncentered, the eigenvalues sum to H: a first eigenvalue
# near H means every head's QK form points the same way, a flat line at 1 means the heads are
# mutually orthogonal. Dashed: the same runs at step 0 (random initialisation), which is flat. Bars
# at index 1: the paper's λ₁ in its Fig. 11 (the seed figure, 128M), per method, its L = 0, 6 and 11
# matched to our early, middle and late layers. With `SMALL = True` the models are barely trained
# and every line stays near its dashed start. Trained the paper's way (the Muon split of `make demo`)
# the `cpu-small` runs stay far below the paper's marks: Standard MHA's λ₁ at L = 0 is 1.21 ± 0.03
# against 1.02 at random initialisation and 5.0 in the paper, and their effective ranks sit at the
# random-init ceiling. With AdamW on W_Q and W_K (`PRESET = "cpu-small-adamw-qk"`) every spectrum
# drops from index 1 to 2 in the first layer, as in the seed figure; notebook 00 tells that finding.

# %%
plots.spectra_figure(flagship["spectra"], kind="uncentered", palette=colours, init=flagship["init_spectra"],
                     seed_figure=True)

# %% [markdown]
# Centered (a PCA of the heads): the common direction all heads share is removed first, so what is
# left is how the heads differ from their mean. One eigenvalue is always 0, since the centered matrix
# has rank at most H − 1. Where sharing keys (MQA, GQA) makes heads alike mainly along that common
# direction, centering narrows their gap to MHA: the paper reads MQA's rise from 72.6 % (uncentered)
# to 78.4 % (centered) of H as "query compensation", though removing a dominant mean direction
# raises the centered rank of any method whose heads share one.

# %%
plots.spectra_figure(flagship["spectra"], kind="centered", palette=colours, init=flagship["init_spectra"])

# %% [markdown]
# ## How many directions do the heads span?
# Cumulative variance explained: the number of components a layer's heads need to reach 90 %.

# %%
plots.cumulative_variance_figure(flagship["spectra"], kind="centered", palette=colours)

# %% [markdown]
# Effective rank per layer summarises each spectrum in one number: from 1 (all heads alike) up to
# the grey dashed ceiling (H uncentered, H − 1 centered). Dashed in each method's colour: the same
# runs at random initialisation (at the ceiling). Bars right of the last layer: the paper's Table 3
# (its mean over layers, as a fraction of H, times our H).

# %%
plots.effective_rank_figure(flagship["summary"], kind="uncentered", palette=colours, init=flagship["init_summary"],
                            paper=True)

# %%
plots.effective_rank_figure(flagship["summary"], kind="centered", palette=colours, init=flagship["init_summary"],
                            paper=True)

# %% [markdown]
# ## Beside the paper
# The mean effective rank over layers as % of H, in the form of the paper's Table 3, with the
# paper's 128M figures beside ours. The paper's centered values lie between 78.4 % (MQA) and
# 83.0 % (LRKV, r = 64); ours cannot pass the centered ceiling (H − 1)/H, 83.3 % for the six heads of
# `cpu-small`, so differences near it are small by construction.

# %%
tables["rank_table"]  # the study's own table (headlab.study.conclusions), with the random-init value beside each rank

# %% [markdown]
# ## Inside one layer
# The H × H similarity matrices behind the middle panel (seed 0). Off-diagonal cells near 0 are
# heads with unrelated QK forms; a block of high values is a group of heads that score alike.

# %%
similarity = flagship["similarity"].query("seed == 0").drop(columns="seed")
plots.similarity_heatmaps(similarity, layer=layers.get("Middle", layers["Late"]), palette=colours)

# %% [markdown]
# ## Through training
# The study's runs keep light analysis snapshots as they train (the attention weights only, at steps
# 0, 1, 2, 4, … and then ten evenly spaced ones: `TrainConfig.snapshot_every`). The study's
# `snapshot_summary` table holds the analysis of every snapshot of every run; the figure follows the
# effective rank from the initial draw to the last step (symmetric-log step axis). The sentences
# answer, by the report's rule (paired by seed, an ordering only beyond its margin), when MQA's
# centering gap ("query compensation") appears and whether LRKV's diversity tracks MHA's.

# %%
snapshots = tables["snapshot_summary"]
plots.rank_through_training_figure(snapshots.query("mla_rope == @FLAGSHIP_MLA_ROPE"), kind="centered", palette=colours)

# %%
training_claims(per_step_metrics(snapshots))

# %% [markdown]
# ## Do the measures agree?
# Three views of each layer's head diversity: the weights (Frobenius, the paper's), the data-aware
# weights (inner product weighted by the second moments Σ of the layer's inputs on validation
# windows) and behaviour (1 − Jensen–Shannon distance of the heads' attention maps; negative
# eigenvalues of that similarity are clipped and reported in `negative_mass`). Then the Spearman
# correlation between views across layers and seeds, and where the weight-space ordering against
# MHA holds up in the other views.

# %%
views = tables["measures"]
print(f"Σ estimated on {tables.meta['moment_tokens']:,} validation tokens in {tables.meta['moment_seconds']:.1f} s")
plots.measures_figure(views, kind="centered", palette=colours, init=flagship["init_summary"], paper=True)

# %%
tables["measure_agreement"]

# %%
measure_claims(per_seed_ranks(views))

# %% [markdown]
# ## Explore
# Toggle methods, pick any layer (or early, middle and late together), switch between centered and
# uncentered spectra, between the QK circuit (how heads score; the figures above) and the OV circuit
# (what they write back; the study's tables hold both), between MLA's two RoPE settings, and change
# the view: spectra, heatmaps, effective rank, cumulative variance or loss curves. The spectra and
# effective rank carry the random-init baseline and the paper's values, as above. Where headlab
# ships the tables of the same study under another recipe (`recipes_beside`: `cpu-small` under the
# Muon split and under AdamW on W_Q, W_K), a Recipe control switches between them, untrained.
# Every change redraws the image below the controls. That image is an ordinary output too, so a
# saved notebook shows the last view where widgets cannot run (GitHub, an HTML export);
# `explorer.figures` holds the figures last drawn.

# %%
stacked = stack_recipes([tables, *recipes_beside(tables)])
print(f"recipes in the explorer: {', '.join(dict.fromkeys(stacked['summary']['recipe']))}")
explorer = explore({**stacked, "similarity": stacked["similarity"].query("seed == 0").drop(columns="seed")},
                   training=stacked["training"])
explorer

# %% [markdown]
# ## Saving figures
# Every figure is a matplotlib `Figure`: save it at any size and format; this notebook's go to
# `STUDY.outputs`, never into the study's folder. `headlab reproduce` (`make demo`) writes all of
# them as PNG (with `--svg` also SVG) beside a report that sets our numbers against the paper's.

# %%
figure = plots.spectra_figure(flagship["spectra"], kind="uncentered", palette=colours, init=flagship["init_spectra"],
                              seed_figure=True)
STUDY.outputs.mkdir(parents=True, exist_ok=True)
figure.savefig(STUDY.outputs / "spectra_uncentered.png", dpi=150, bbox_inches="tight")
print(f"saved {relpath(STUDY.outputs / 'spectra_uncentered.png')}: the {tables.meta['preset']} study's flagship, "
      f"{figure.get_suptitle().splitlines()[-1]}")
