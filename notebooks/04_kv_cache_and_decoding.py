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
# # 04 · KV caches and decoding
#
# KV sharing exists to shrink the decode cache. This notebook measures what each variant really
# stores and what decoding with it costs.
#
# **You will learn** how many bytes each variant's cache holds, read off real cache tensors and
# checked against the formulas (MHA 2·H·d_h values per token and layer, GQA 2·g·d_h, MQA 2·d_h,
# MLA d_c + d_R, LRKV 2·(d_h + H·r), the paper's Eq. 8); what those sizes are at the paper's 128M
# scale; how much faster decoding is with a cache than without; and what the paper's claim that
# LRKV "supports full-dimension RoPE without modification" costs at decode time.
#
# Timing needs no training: the models here are freshly initialised `cpu-small` models, since
# speed and cache size do not depend on the weights' values.

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
# `SMALL = True` (CI) uses short contexts and brief timings: seconds in all. `SMALL = False` times
# a 512-token context and contexts up to 4096 more carefully (about two minutes on a CPU). All
# timings run on one thread, so that they compare across machines (and because on a busy machine
# a second thread can make small models many times slower). Timings are noisy all the same:
# compare ratios and trends, not absolute milliseconds.

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # True: short context, quick timings (CI). False: context 512 and up to 4096

# %%
# %matplotlib inline
import pandas as pd
import torch

import headlab
from headlab.model import decoding
from headlab.report import plots
from headlab.model.gpt import describe

torch.set_num_threads(1)  # single-threaded timings (see above)
CONTEXT = 128 if SMALL else 512  # tokens in the decode cache
NEW_TOKENS = 8 if SMALL else 32  # tokens generated in the speed test
REPEATS = 1 if SMALL else 3  # timed generate() calls per variant and mode (the fastest counts)
ROPE_CONTEXTS = (64, 256, 1024) if SMALL else (128, 256, 512, 1024, 2048, 4096)
MIN_RUN_TIME = 0.1 if SMALL else 1.0  # seconds of decoding steps timed per variant and context
VARIANTS = [config.replace(seq_len=max(ROPE_CONTEXTS) + 1) for config in headlab.comparison_variants("cpu-small")]
colours = plots.palette({config.label: role for role, config in headlab.comparison_roles("cpu-small").items()})
torch.manual_seed(0)
MODELS = {config.label: headlab.GPT(config).eval() for config in VARIANTS}

# %% [markdown]
# ## Cache bytes: real tensors against the formula
# `model.new_cache(batch, max_len)` allocates the decode cache up front; `nbytes()` sums its
# tensors. The formula column is `kv_cache_values_per_token() × n_layer × context × 4 bytes`
# (float32). MLA appears twice: the absorbed cache (the latent and the shared RoPE key) that
# headlab decodes with by default, and the naive cache of decompressed per-head keys and values.

# %%
decoding.cache_bytes_table(MODELS, CONTEXT).round(1)

# %% [markdown]
# ## At the paper's scale
# The same formulas for the paper's 128M configuration (12 layers, 6 heads, d_h = 128, context
# 2048, bf16, batch 1), counted on the meta device so nothing is allocated. The paper's Table 7
# gives LRKV 29.2 % (r = 16) and 66.7 % (r = 64), MQA 16.7 %, GQA 50 % and MLA 8.3 %; the MLA figure
# differs because the paper counts the latent d_c alone, while headlab also caches the decoupled
# RoPE key d_R that MLA needs to decode.

# %%
PAPER_VARIANTS = headlab.comparison_variants("paper-128m")
paper = pd.DataFrame([describe(config, context=2048, dtype="bfloat16") for config in PAPER_VARIANTS]).set_index("label")
paper[["params", "kv_values_per_token_per_layer", "kv_fraction_of_mha", "kv_cache_bytes"]].style.format(
    {"params": "{:,}", "kv_fraction_of_mha": "{:.1%}", "kv_cache_bytes": "{:,}"})

# %% [markdown]
# ## Decoding with and without the cache
# `generate` appends `NEW_TOKENS` greedy tokens to a prompt that fills the rest of the context.
# With the cache (`use_cache=True`) the prompt is processed once and every new token attends to the
# cached keys and values; without it every new token re-runs the model over the whole context.
# The last column checks that both paths chose the same tokens (that first call is also the
# warm-up).

# %%
prompt = torch.randint(0, 256, (1, CONTEXT - NEW_TOKENS), generator=torch.Generator().manual_seed(0))
decoding.generation_speed(MODELS, prompt, NEW_TOKENS, repeats=REPEATS).round(2)

# %% [markdown]
# ## What the paper's RoPE claim costs for LRKV
# LRKV caches K_shared, V_shared and each head's r-wide latents R_h = X U_h. The paper decodes keys
# with its Eq. 6, q_h K_hᵀ = q_h K_sharedᵀ + (q_h B_h) R_hᵀ, which never forms the per-head keys, and
# its Table 10 lists LRKV's extra decode cost as O(H·r·d_h) per step with no dependence on the
# context length T. It also says LRKV "supports full-dimension RoPE without modification", because
# RoPE(K_h) = RoPE(K_shared) + RoPE(R_h) B_hᵀ.
#
# That identity does not hold: RoPE rotates the d_h-wide key K_shared + R_h B_hᵀ at each position,
# and a rotation does not pass through B_h (R_h is r-wide, so there is nothing of width d_h to
# rotate). A model trained with RoPE on its keys, as here and as in the paper, must rebuild every
# head's keys for all T cached positions at every decoding step: T·H·r·d_h extra multiply-adds per
# layer, r times the T·H·d_h of the attention scores themselves, and growing with T. headlab does
# exactly that; its memory saving is still exactly Eq. 8.
#
# The bill at the paper's 128M scale, per generated token (all layers), next to the attention
# scores and to the matmuls with the blocks' weights that every variant pays (one multiply-add per
# parameter outside the embedding and the output head):

# %%
rebuild = decoding.lrkv_key_rebuild_macs(PAPER_VARIANTS, [2048, 8192])
rebuild.style.format("{:,}", subset=[column for column in rebuild.columns if "MACs" in column])

# %% [markdown]
# At the paper's own context of 2048 tokens the key rebuild alone costs about 4 times (r = 16) and
# 15 times (r = 64) all of the model's block matmuls per generated token, and it grows linearly with
# T. The cache is small, but decoding from it is not cheap, unless the model is built differently
# (for instance with positions encoded in the latent space), which is not the model the paper trains.

# %% [markdown]
# Measured: one cached decoding step at growing context length T. The variants that keep per-head
# keys (MHA, GQA) get slower as the cache grows, because attention reads T keys per head; MQA and
# MLA's absorbed path read one shared key per position and stay nearly flat. LRKV is the slowest,
# and its distance to MHA widens with T, because it also rebuilds T·H keys of width d_h from the
# r-wide latents before it can score them.

# %%
latency = decoding.step_latency(MODELS, ROPE_CONTEXTS, min_run_time=MIN_RUN_TIME)
plots.decode_latency_figure(latency, palette=colours)

# %% [markdown]
# The same numbers as a table, with each variant's step time at the longest context relative to
# the shortest. LRKV caches less than MHA yet decodes more slowly, by a margin that grows with T:
# that is the T-dependent key reconstruction the paper says it does not have. (Timings of models
# this small are noisy; read the trend, not single cells.)

# %%
per_step = latency.pivot(index="model", columns="context", values="ms").loc[list(colours)]
per_step.assign(growth=per_step.iloc[:, -1] / per_step.iloc[:, 0]).round(2)
