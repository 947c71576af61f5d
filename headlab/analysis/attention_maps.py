"""Behaviour-space head similarity: the heads' attention maps on a batch of tokens, compared by
Jensen–Shannon distance, in the similarity table of `headlab.analysis.similarity` (circuit
"pattern", measure "jensen_shannon", mla_rope "n/a", value 1 − mean Jensen–Shannon distance), so
weight-space and behaviour-space similarity can be set side by side; `attention_analysis` adds
their spectra and effective ranks, the tables `analyze` writes for the weights. Maps of headlab
models are recorded from their attention kernels; those of Hugging Face checkpoints are the
probabilities `transformers` returns (`headlab.analysis.hf_models`).

S = 1 − D is not a Gram matrix: its uncentered spectrum can have negative eigenvalues, which are
clipped to 0 (`headlab.analysis.spectrum.clipped_spectrum`; `headlab.analysis.measures` says why
and reports the clipped share)."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pandas as pd
import torch

from headlab.analysis.heads import load_heads
from headlab.analysis.hf_models import hf_attention_maps
from headlab.analysis.inputs import load_forward_model, run_forward
from headlab.analysis.similarity import Analysis, similarity_rows, spectrum_rows, table_from_pieces
from headlab.analysis.spectrum import clipped_spectrum
from headlab.model.attention.common import AttentionCore, attention_probabilities
from headlab.model.gpt import eval_mode
from headlab.schema import BEHAVIOUR, COLUMNS, KINDS, NOT_APPLICABLE, PATTERN


@contextlib.contextmanager
def recorded_attention(model: torch.nn.Module):
    """Record (q, k, scale) exactly as every attention module of `model` hands them to its
    kernel (`AttentionCore`, after RoPE and QK-norm) while the context is open, through forward
    pre-hooks on those modules: the model's own scores are q kᵀ · scale, so no family's score
    computation is re-implemented, and other models (or threads using them) are untouched."""
    calls: list[tuple[torch.Tensor, torch.Tensor, float]] = []

    def record(module, args, kwargs):
        given = dict(zip(("q", "k", "v", "scale"), args), **kwargs)
        calls.append((given["q"].detach(), given["k"].detach(), given["scale"]))

    handles = [m.register_forward_pre_hook(record, with_kwargs=True)
               for m in model.modules() if isinstance(m, AttentionCore)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def attention_pattern(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """The causal attention maps (B, H, T, T), in float64, of recorded q (B, H, T, D) and
    k (B, H_kv, T, D); KV head g serves query heads g·H/H_kv … (g+1)·H/H_kv − 1."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    return attention_probabilities(q.double(), k.double(), scale)


def js_distance_matrix(probs: torch.Tensor) -> np.ndarray:
    """H × H mean Jensen–Shannon distance √JSD (log base 2, so in [0, 1]; the value of scipy's
    `jensenshannon`) between the heads' attention distributions, averaged over batch and query
    positions 1…T−1 (causal position 0 can only attend to itself, in every head; a bidirectional
    model's position 0, BERT's [CLS], is left out alike). probs: (B, H, T, T) rows summing to 1,
    on any device.

        JSD(p, q) = E(m) − (E(p) + E(q)) / 2,   m = (p + q) / 2,   E(p) = −Σ p log₂ p

    one entropy per pair rather than two divergences, computed where `probs` lives: at the
    paper's context of 2048 a layer's maps are B·H·T² numbers, which scipy on the CPU took a
    minute per layer over."""
    p = probs[:, :, 1:].double()
    entropy = -torch.special.xlogy(p, p).sum(-1)  # (B, H, T − 1), nats
    heads = p.size(1)
    distance = torch.zeros(heads, heads, dtype=torch.float64, device=p.device)
    for i in range(heads - 1):
        mixture = (p[:, i:i + 1] + p[:, i + 1:]) / 2
        divergence = -torch.special.xlogy(mixture, mixture).sum(-1) - (entropy[:, i:i + 1] + entropy[:, i + 1:]) / 2
        distance[i, i + 1:] = (divergence.clamp(min=0) / math.log(2)).sqrt().mean(dim=(0, 2))
    return (distance + distance.T).cpu().numpy()


@torch.no_grad()
def attention_similarity(source, tokens: torch.Tensor, label: str | None = None) -> pd.DataFrame:
    """Behaviour-space head similarity of `source` (a headlab GPT, run folder, Hugging Face
    checkpoint folder, hf:ORG/NAME, or a `LoadedModel` of one) on `tokens` (B, T)
    (`headlab.analysis.inputs.encode_text`): per layer, the similarity table (circuit "pattern")
    with value = 1 − mean Jensen–Shannon distance between two heads' attention maps (1: identical
    maps; 0: disjoint supports everywhere).
    `label` defaults to the one the weights view gives the model."""
    loaded = load_forward_model(source)
    model, kind = loaded.module, loaded.kind
    with eval_mode(model):
        maps = _headlab_maps(model, tokens) if kind == "headlab" else hf_attention_maps(model, tokens)
    label = label or (model.config.label if kind == "headlab" else load_heads(loaded.source).label)
    pieces = [similarity_rows(label, layer, PATTERN, BEHAVIOUR, NOT_APPLICABLE, 1.0 - js_distance_matrix(probs))
              for layer, probs in enumerate(maps)]
    return table_from_pieces(pieces, "similarity")


def layer_matrices(similarity: pd.DataFrame):
    """(model, layer, S) for each model and layer of a similarity table, S its H × H matrix."""
    for (model, layer), group in similarity.groupby(["model", "layer"], sort=False):
        n = int(group["head_i"].max()) + 1
        matrix = np.zeros((n, n))
        matrix[group["head_i"].to_numpy(), group["head_j"].to_numpy()] = group["value"].to_numpy()
        yield model, layer, matrix


def attention_analysis(source, tokens: torch.Tensor, label: str | None = None) -> Analysis:
    """`attention_similarity` with its spectra and summary (circuit "pattern"), as an Analysis
    that stacks onto the weight views' (`concat`); norms and lrkv_cosine are the weights' only."""
    pieces = [spectrum_rows(model, layer, PATTERN, BEHAVIOUR, NOT_APPLICABLE, matrix,
                            [clipped_spectrum(matrix, kind)[0] for kind in KINDS])
              for model, layer, matrix in layer_matrices(attention_similarity(source, tokens, label))]
    return Analysis(**{name: table_from_pieces([piece[name] for piece in pieces if name in piece], name)
                       for name in COLUMNS})


def _headlab_maps(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's causal attention maps (B, H, T, T) of a headlab GPT, from its recorded q, k."""
    with recorded_attention(model) as calls:
        run_forward(model, tokens)
    if len(calls) != model.config.n_layer:
        raise RuntimeError(f"recorded {len(calls)} attention calls for {model.config.n_layer} layers")
    return [attention_pattern(q, k, s) for q, k, s in calls]
