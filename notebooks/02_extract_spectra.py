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
# one model or all six, what its tidy tables hold, how the weight-space similarity compares with
# the similarity of the heads' actual attention maps, and how to save the tables for later.
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
# The same switch as notebook 01, whose runs this notebook reuses (with `SMALL = False`, those of
# `make demo`): when they are there, nothing is trained here; otherwise the six variants are
# trained first (seconds with `SMALL = True`; with `SMALL = False`, the time `make demo` takes: see the README).

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # True: tiny models, seconds (CI). False: the cpu-small study
RUNS = None  # None: make demo's runs/reproduce (full) or runs/notebooks/small/<settings> (small)

# %%
# %matplotlib inline
import pandas as pd
import torch

from headlab.report import plots
from headlab.analysis.attention_maps import attention_similarity
from headlab.analysis.similarity import Analysis, analyze, concat
from headlab.data.corpus import load_corpus
from headlab.data.shards import random_windows
from headlab.analysis.heads import load_heads
from headlab.study.notebook import NotebookStudy
from headlab.analysis.spectrum import cosine_similarity, frobenius_gram, similarity_spectrum

if SMALL:
    torch.set_num_threads(1)  # tiny tensors: more threads only add synchronisation overhead
STUDY = NotebookStudy.choose(SMALL, RUNS)

# %% [markdown]
# ## The trained models
# `STUDY.train` with the settings of notebook 01 finds its runs and loads them (training only
# what is missing). Each entry is a `StudyRun` (role, config, seed, folder, run).

# %%
runs = STUDY.train(progress=False)
models = {r.label: r.run.model for r in runs}
list(models)

# %% [markdown]
# ## One layer by hand
# `load_heads` reads any supported model as per-layer factors; `factors("qk")` gives every head's
# (W_Q,h, W_K,h). Four calls then give the layer's similarity matrix and spectra: this is all
# `analyze` does, for every layer.

# %%
heads = load_heads(models["Standard MHA"])
queries, keys = heads.layer(0).factors("qk")
G = cosine_similarity(frobenius_gram(queries, keys))
print(f"{heads.label}: {heads.n_layers} layers x {heads.n_heads} heads; layer 0 similarity:\n{G.round(2)}")
for kind in ("uncentered", "centered"):
    spectrum = similarity_spectrum(G, kind)
    print(f"{kind:>10}: eigenvalues {spectrum.eigenvalues.round(3)}, effective rank "
          f"{spectrum.effective_rank:.2f} of at most {spectrum.ceiling}")

# %% [markdown]
# ## `analyze`: every layer, as tidy tables
# `analyze(source, label=..., circuit=...)` accepts a headlab model, a run folder or a Hugging Face
# checkpoint (notebook 05). It returns an `Analysis` whose tables have one row per observation:
#
# * `similarity`: model, layer, circuit, head_i, head_j, value
# * `spectra`: model, layer, circuit, kind, index (from 1), eigenvalue, variance_ratio, cumulative
# * `summary`: one row per layer, circuit and kind: effective rank (also as % of H and % of the
#   ceiling), components for 90 % of the variance, participation ratio, mean off-diagonal similarity
# * `norms` and `lrkv_cosine`: projection norms, and for LRKV how each head's residual U_h B_hᵀ lines
#   up with the shared projection

# %%
mha = analyze(models["Standard MHA"], circuit="both")
mha.summary

# %%
mha.spectra.query("layer == 0 and circuit == 'qk'")

# %% [markdown]
# ## All six variants
# `concat` stacks analyses; the model label keeps them apart. Below, the QK effective rank per
# layer as a percentage of H (the measure of the paper's Table 3), uncentered and centered.

# %%
analysis = concat(analyze(model, label=label, circuit="both") for label, model in models.items())
qk = analysis.summary.query("circuit == 'qk'")
qk.pivot_table(index="model", columns=["kind", "layer"], values="effective_rank_pct_of_heads", sort=False).round(1)

# %% [markdown]
# The OV circuit (values and outputs) under the same measure. MQA and GQA share values as well
# as keys, LRKV shares a value projection plus residuals, so the OV picture need not match QK's.

# %%
ov = analysis.summary.query("circuit == 'ov' and kind == 'centered'")
ov.pivot_table(index="model", columns="layer", values="effective_rank_pct_of_heads", sort=False).round(1)

# %% [markdown]
# For LRKV: how large each head's residual is next to the shared projection (`norms`), and the
# cosine between W_shared and each head's U_h B_hᵀ (`lrkv_cosine`; near 0: the residual adds a
# new direction rather than rescaling the shared one).

# %%
analysis.norms.query("model.str.startswith('LRKV')").pivot_table(
    index=["model", "circuit", "part"], columns="layer", values="frobenius_norm").round(3)

# %%
analysis.lrkv_cosine.groupby(["model", "circuit", "layer"])["cosine"].describe()[["mean", "min", "max"]].round(3)

# %% [markdown]
# ## Weights against behaviour
# The similarity above is of weights. `attention_similarity` measures what the heads do on real
# text: 1 − the mean Jensen–Shannon distance between two heads' attention maps (1: identical maps).
# Heads can have dissimilar forms yet attend alike, since RoPE and the softmax sit between the two.

# %%
corpus = load_corpus("shakespeare")
tokens, _ = random_windows(corpus.val, 8, runs[0].config.seq_len, torch.Generator().manual_seed(0))
patterns = pd.concat([attention_similarity(model, tokens, label=label) for label, model in models.items()])
plots.similarity_heatmaps(patterns, layer=0, circuit="pattern")

# %% [markdown]
# The same layer in weight space: the QK similarity G of each variant, on the same −1…1 colour
# scale. Weight-space cosines near 0 mean the heads' forms point in different directions; a high
# behaviour similarity next to them means the heads attend alike anyway.

# %%
plots.similarity_heatmaps(analysis.similarity, layer=0)

# %% [markdown]
# ## Save the tables
# `Analysis.save` writes one CSV per table; `Analysis.load` reads them back, e.g. for notebook 03
# or a pandas session of your own. They go to `STUDY.outputs`, beside (never into) the study's runs.

# %%
saved = analysis.save(STUDY.outputs / "analysis")
print(sorted(path.name for path in saved.iterdir()))
Analysis.load(saved).summary.equals(analysis.summary)
