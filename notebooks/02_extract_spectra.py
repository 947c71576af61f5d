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
# # 02 · From attention weights to head-similarity spectra
#
# How alike are the heads of one layer? The paper behind this study (arXiv 2601.11471, §4.3)
# answers with each head's bilinear form and the spectrum of their similarity matrix.
#
# **You will learn** how a layer's heads become an H × H similarity matrix, what its centered and
# uncentered eigen-spectra and the effective rank measure, how to run `headlab.analysis.analyze` on
# a model's weights, what its tidy tables hold, what those tables say for the six variants of the
# study, how the weight-space similarity compares with the similarity of the heads' actual attention
# maps, and how to save the tables for later.
#
# The recipe, per layer and head h (headlab never forms the d × d matrices; it works with the
# narrow factors):
#
# * the QK circuit: A_h = W_Q,h W_K,hᵀ, so that a query x scores a key y as xᵀ A_h y (the OV
#   circuit, W_V,h W_O,h, is what the head writes back);
# * cosine similarity G[i, j] = ⟨A_i, A_j⟩_F / (‖A_i‖_F ‖A_j‖_F);
# * the **uncentered** spectrum: eigenvalues of G (they sum to H); the **centered** one: of J G J with
#   J = I − 11ᵀ/H, i.e. a PCA of the heads after removing their common direction;
# * the **effective rank**: exp of the entropy of the normalised eigenvalues, from 1 (all heads alike)
#   up to H uncentered, H − 1 centered.

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
# The notebook has two parts, and each mode says where their numbers come from:
#
# * **From weights, by hand** (`SOURCE`): the extraction itself, on one model's weights. With
#   `SMALL = True` the Standard MHA of notebook 01's six `tiny` variants, trained here in seconds if
#   notebook 01 has not left them (barely trained: its numbers only show that everything runs). With
#   `SMALL = False` nothing is trained: the pretrained **all-MiniLM-L6-v2** (6 layers × 12 heads, a
#   real checkpoint installed with the `notebooks` and `colab` extras, read from disk; notebook 05
#   studies it in full). `SOURCE` takes any run folder instead (after `make demo`, e.g.
#   `"../runs/reproduce/runs/standard-mha-seed0"`), or a Hugging Face checkpoint folder.
# * **The six variants, from the study's tables**: what `analyze` gives for every run of the
#   study, read from its tables. With `SMALL = True` those of the six tiny runs (one seed, made
#   here); with `SMALL = False` the 3-seed `cpu-small` study of `make demo`: its tables in
#   `runs/reproduce` if it has finished, else the copy shipped inside headlab (the line printed says
#   which and why, and the commit that trained them). Full mode never trains: it takes seconds.
#   `RUNS` shows any finished study folder instead, its preset and recipe read from the folder;
#   `PRESET` another preset's study (e.g. `"cpu-small-adamw-qk"`, shipped too), as in notebook 03.

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # True: tiny models, seconds (CI). False: the cpu-small study's tables and MiniLM's weights, no training
SEEDS = None  # runs per variant (seeds 0, 1, ...); None: every seed the study has (1 in small mode, 3 in full)
RUNS = None  # a study folder; None: make demo's runs/reproduce (full) or runs/notebooks/small/<settings> (small)
PRESET = None  # e.g. "cpu-small-adamw-qk"; None: the preset RUNS' study records, else tiny (small) or cpu-small (full)
SOURCE = None  # the weights taken apart by hand; None: the tiny Standard MHA (small) or all-MiniLM-L6-v2 (full)

# %%
# %matplotlib inline
from os.path import relpath

import pandas as pd
import torch

from headlab.report import plots
from headlab.report.paper_tables import recipe_text
from headlab.analysis.similarity import Analysis, analyze
from headlab.analysis.heads import load_heads
from headlab.analysis.hf_layouts import minilm_checkpoint
from headlab.study.notebook import NotebookStudy
from headlab.schema import FLAGSHIP_MLA_ROPE
from headlab.study.tables import study_tables
from headlab.analysis.gram import frobenius_gram
from headlab.analysis.spectrum import cosine_similarity, similarity_spectrum

if SMALL:
    torch.set_num_threads(1)  # tiny tensors: more threads only add synchronisation overhead
STUDY = NotebookStudy.choose(SMALL, RUNS, PRESET)
SEEDS = SEEDS or STUDY.seeds or (1 if SMALL else 3)
if SOURCE is None and SMALL:  # notebook 01's tiny runs: trained here in seconds where it has not left them
    runs = STUDY.train(SEEDS, progress=False)
    SOURCE = next(run.folder for run in runs if run.role == "mha" and run.seed == 0)
SOURCE = SOURCE or minilm_checkpoint()  # full mode: pretrained weights, nothing to train

# %% [markdown]
# ## One layer by hand
# `load_heads` reads any supported model (a headlab model or run folder, a Hugging Face checkpoint
# folder) as per-layer factors; `factors("qk")` gives every head's (W_Q,h, W_K,h). Four calls then
# give the layer's similarity matrix and spectra: this is all `analyze` does, for every layer.

# %%
heads = load_heads(SOURCE)
queries, keys = heads.layer(0).factors("qk")
G = cosine_similarity(frobenius_gram(queries, keys))
print(f"{heads.label}: {heads.n_layers} layers x {heads.n_heads} heads")
for kind in ("uncentered", "centered"):
    spectrum = similarity_spectrum(G, kind)
    print(f"{kind:>10}: eigenvalues {spectrum.eigenvalues.round(2)}, effective rank "
          f"{spectrum.effective_rank:.2f} of at most {spectrum.ceiling}")
pd.DataFrame(G).round(2)  # layer 0's similarity matrix: head i (rows) against head j

# %% [markdown]
# ## `analyze`: every layer, as tidy tables
# `analyze(source, label=..., circuit=...)` takes the same sources. It returns an `Analysis` whose
# tables have one row per observation:
#
# * `similarity`: model, layer, circuit, head_i, head_j, value
# * `spectra`: model, layer, circuit, kind, index (from 1), eigenvalue, variance_ratio, cumulative
# * `summary`: one row per layer, circuit and kind: effective rank (also as % of H and % of the
#   ceiling), components for 90 % of the variance, participation ratio, mean off-diagonal similarity
# * `norms` and `lrkv_cosine`: projection norms, and for LRKV how each head's residual U_h B_hᵀ lines
#   up with the shared projection

# %%
one = analyze(SOURCE, circuit="both")
one.summary

# %%
one.spectra.query("layer == 0 and circuit == 'qk'")

# %% [markdown]
# ## The six variants, from the study's tables
# `study_tables` reads the study's tables: `analyze` of every run (with `seed` and `role` columns),
# at both of MLA's RoPE settings (`mla_rope`; this notebook shows the flagship's, `FLAGSHIP_MLA_ROPE`),
# and the other measures of the study. `train=SMALL`: in full mode it never trains. Below, the QK
# effective rank per layer as a percentage of H (the measure of the paper's Table 3), uncentered and
# centered, the mean over seeds.

# %%
tables = study_tables(STUDY, SEEDS, train=SMALL, stand_in=STUDY.stand_in)
flagship = {name: tables[name][tables[name]["mla_rope"] == FLAGSHIP_MLA_ROPE] for name in ("summary", "similarity")}
colours = plots.table_palette(tables["summary"])  # the colours of every figure of notebooks 02 and 03
qk = flagship["summary"].query("circuit == 'qk'")
print(f"{tables.meta['preset']}, {tables['summary']['seed'].nunique()} seed(s) per variant. {recipe_text(tables.meta)}")
qk.pivot_table(index="model", columns=["kind", "layer"], values="effective_rank_pct_of_heads", sort=False).reindex(
    columns=["uncentered", "centered"], level="kind").round(1)

# %% [markdown]
# The OV circuit (values and outputs) under the same measure. MQA and GQA share values as well
# as keys, LRKV shares a value projection plus residuals, so the OV picture need not match QK's.

# %%
ov = flagship["summary"].query("circuit == 'ov' and kind == 'centered'")
ov.pivot_table(index="model", columns="layer", values="effective_rank_pct_of_heads", sort=False).round(1)

# %% [markdown]
# For LRKV: how large each head's residual U_h B_hᵀ is next to the shared projection (`norm_ratio`
# = ‖U_h B_hᵀ‖_F / ‖W_shared‖_F), and the mean principal angle between their column spaces beside
# that of random subspaces of the same shapes (`angle_random`; near it: the residual adds new
# directions rather than rescaling the shared one). Means over heads and seeds, per layer.

# %%
tables["lrkv_factors"].groupby(["model", "projection", "layer"])[["norm_ratio", "angle_mean", "angle_random"]].mean(
    ).round(2)

# %% [markdown]
# ## Weights against behaviour
# The similarity above is of weights. `attention_similarity(model, tokens)` measures what the heads
# do on real text: 1 − the mean Jensen–Shannon distance between two heads' attention maps (1:
# identical maps); the study's `measures` table holds it for every run, on validation windows.
# Heads can have dissimilar forms yet attend alike, since RoPE and the softmax sit between the two:
# the mean off-diagonal similarity of each layer, in weight space (`frobenius`) and in behaviour
# (`jensen_shannon`), the mean over seeds:

# %%
views = tables["measures"].query("kind == 'uncentered' and measure in ['frobenius', 'jensen_shannon']")
views.pivot_table(index="model", columns=["measure", "layer"], values="mean_offdiag_similarity", sort=False).round(2)

# %% [markdown]
# The weight-space similarity matrices G of the first layer (seed 0) of each variant, on the −1…1
# colour scale. Cells near 0 mean the heads' forms point in different directions; next to a high
# behaviour similarity above, the heads attend alike anyway.

# %%
plots.similarity_heatmaps(flagship["similarity"].query("seed == 0").drop(columns="seed"), layer=0, palette=colours)

# %% [markdown]
# ## Save the tables
# `Analysis.save` writes one CSV per table; `Analysis.load` reads them back, e.g. for a pandas
# session of your own. They go to `STUDY.outputs`, beside (never into) the study's runs.

# %%
saved = one.save(STUDY.outputs / "analysis")
print(f"{relpath(saved)}: {sorted(path.name for path in saved.iterdir())}")
Analysis.load(saved).summary.equals(one.summary)
