"""`analyze()`: every layer's head similarity, eigen-spectra and effective rank, as tidy tables.

    result = analyze(model_or_path, label="MHA", circuit="qk")   # "qk", "ov" or "both"
    result.summary                                               # one row per layer, circuit, kind
    result.save("analysis/mha");  Analysis.load("analysis/mha")
    both = concat([result, other])                               # compare models

`source` is a headlab GPT, a headlab run folder (config.json + model.safetensors), a Hugging Face
checkpoint folder or .safetensors file (see `headlab.heads` for the layouts and for what lies
outside the bilinear form: RoPE, norms, biases), or a `ModelHeads`.

Tables (layers and heads from 0, eigenvalue index from 1; `spectrum.py` has the formulas):
  similarity   model, layer, circuit, head_i, head_j, value — cosine G[i,j] of A_i, A_j (Fig. 6)
  spectra      model, layer, circuit, kind, index, eigenvalue, variance_ratio, cumulative
  summary      model, layer, circuit, kind, n_heads, effective_rank, effective_rank_pct_of_heads,
               effective_rank_pct_of_ceiling, n_components_90, participation_ratio,
               mean_offdiag_similarity (of the uncentred G, repeated on both kinds' rows)
  norms        model, layer, circuit, part, frobenius_norm — mean over heads of ‖L_h‖_F and
               ‖R_h‖_F (parts query, key for qk; value, output for ov); for LRKV also
               ‖W_shared‖_F and the mean ‖U_h B_hᵀ‖_F (key_shared, key_residual, ...) (Fig. 8)
  lrkv_cosine  model, layer, circuit, head, cosine — ⟨W_shared, U_h B_hᵀ⟩_F / (‖W_shared‖ ‖U_h B_hᵀ‖)
               per head, keys (qk) and values (ov); LRKV only, else empty (App. B)

`attention_similarity()` is the behaviour-space counterpart: the same similarity table from the
heads' attention maps on a batch of tokens (circuit "pattern", value 1 − mean Jensen–Shannon
distance), so weight-space and behaviour-space similarity can be set side by side.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from .attention.common import attention_probabilities
from .heads import CIRCUITS, LRKVWeights, load_heads
from .spectrum import KINDS, cosine_similarity, frobenius_gram, mean_offdiagonal, similarity_spectrum

COLUMNS = {
    "similarity": ["model", "layer", "circuit", "head_i", "head_j", "value"],
    "spectra": ["model", "layer", "circuit", "kind", "index", "eigenvalue", "variance_ratio", "cumulative"],
    "summary": ["model", "layer", "circuit", "kind", "n_heads", "effective_rank", "effective_rank_pct_of_heads",
                "effective_rank_pct_of_ceiling", "n_components_90", "participation_ratio",
                "mean_offdiag_similarity"],
    "norms": ["model", "layer", "circuit", "part", "frobenius_norm"],
    "lrkv_cosine": ["model", "layer", "circuit", "head", "cosine"],
}
REQUIRED_FILES = ("similarity", "spectra", "summary")  # an analysis folder always has these
SIDES = {"qk": ("query", "key"), "ov": ("value", "output")}
PATTERN = "pattern"  # the `circuit` of attention-map similarity
SPECTRUM_METRICS = ("effective_rank", "effective_rank_pct_of_heads", "effective_rank_pct_of_ceiling",
                    "n_components_90", "participation_ratio")  # summary columns read off a Spectrum


@dataclass
class Analysis:
    """The tidy tables of one or more analysed models (columns in `COLUMNS`)."""

    similarity: pd.DataFrame
    spectra: pd.DataFrame
    summary: pd.DataFrame
    norms: pd.DataFrame
    lrkv_cosine: pd.DataFrame

    def save(self, folder: str | Path) -> Path:
        """Write every table as <name>.csv in `folder` (created if needed)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in COLUMNS:
            getattr(self, name).to_csv(folder / f"{name}.csv", index=False)
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "Analysis":
        """Read an analysis folder written by `save` (norms/lrkv_cosine may be absent)."""
        folder = Path(folder)
        missing = [f"{n}.csv" for n in REQUIRED_FILES if not (folder / f"{n}.csv").exists()]
        if missing:
            raise ValueError(f"{folder} is not an analysis folder: missing {', '.join(missing)}")
        tables = {}
        for name, columns in COLUMNS.items():
            path = folder / f"{name}.csv"
            tables[name] = pd.read_csv(path, dtype={"model": str}) if path.exists() else pd.DataFrame(columns=columns)
        return cls(**tables)

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(self.summary["model"]))


def concat(analyses: Iterable[Analysis]) -> Analysis:
    """Stack several analyses into one; a model label may appear in only one of them per circuit."""
    analyses = list(analyses)
    seen: dict[tuple[str, str], int] = {}
    for n, a in enumerate(analyses):
        for key in set(zip(a.summary["model"], a.summary["circuit"])):
            if key in seen:
                raise ValueError(f"model label {key[0]!r} ({key[1]}) is in analyses {seen[key]} and {n}: "
                                 "pass label= to analyze() to tell them apart")
            seen[key] = n
    return Analysis(**{name: _stack([getattr(a, name) for a in analyses]) for name in COLUMNS})


def _stack(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate, leaving out empty tables (they would turn integer columns into floats)."""
    filled = [t for t in tables if len(t)]
    return pd.concat(filled, ignore_index=True) if filled else tables[0]


def analyze(source, label: str | None = None, circuit: str = "qk",
            layers: Sequence[int] | None = None) -> Analysis:
    """Head-similarity analysis of every layer (or of `layers`) of `source` for `circuit`
    ("qk", "ov" or "both"), labelled `label` (default: the model's own label)."""
    if circuit not in (*CIRCUITS, "both"):
        raise ValueError(f"circuit = {circuit!r} is invalid: allowed values are {', '.join(CIRCUITS)}, both")
    circuits = CIRCUITS if circuit == "both" else (circuit,)
    heads = load_heads(source, label)
    if heads.n_heads < 2:
        raise ValueError(f"{heads.label} has n_heads = {heads.n_heads}: head similarity needs at least 2 heads")
    pieces: dict[str, list[dict]] = {name: [] for name in COLUMNS}
    for layer in range(heads.n_layers) if layers is None else layers:
        weights = heads.layer(layer)
        for c in circuits:
            for name, piece in _layer_rows(heads.label, layer, c, weights).items():
                pieces[name].append(piece)
    return Analysis(**{name: _table(pieces[name], name) for name in COLUMNS})


def _rows(model: str, layer: int, circuit: str, **columns) -> dict[str, np.ndarray]:
    """The columns of some table rows; model, layer and circuit are repeated on every row."""
    columns = {name: np.asarray(values) for name, values in columns.items()}
    n = len(next(iter(columns.values())))
    return {"model": np.full(n, model, dtype=object), "layer": np.full(n, layer),
            "circuit": np.full(n, circuit, dtype=object), **columns}


def _table(pieces: list[dict], name: str) -> pd.DataFrame:
    """One table from row pieces (built once: a DataFrame per layer costs more than the math)."""
    return pd.DataFrame({c: np.concatenate([p[c] for p in pieces]) if pieces else [] for c in COLUMNS[name]})


def _similarity_rows(model: str, layer: int, circuit: str, matrix: np.ndarray) -> dict:
    """An H × H matrix as rows (model, layer, circuit, head_i, head_j, value)."""
    i, j = np.indices(matrix.shape)
    return _rows(model, layer, circuit, head_i=i.ravel(), head_j=j.ravel(), value=matrix.ravel())


def _layer_rows(model: str, layer: int, circuit: str, weights) -> dict[str, dict]:
    left, right = weights.factors(circuit)
    similarity = cosine_similarity(frobenius_gram(left, right))
    n = similarity.shape[0]
    spectra = [similarity_spectrum(similarity, kind) for kind in KINDS]
    rows = {
        "similarity": _similarity_rows(model, layer, circuit, similarity),
        "spectra": _rows(model, layer, circuit, kind=np.repeat(KINDS, n), index=np.tile(np.arange(1, n + 1), 2),
                         eigenvalue=np.concatenate([s.eigenvalues for s in spectra]),
                         variance_ratio=np.concatenate([s.variance_ratio for s in spectra]),
                         cumulative=np.concatenate([s.cumulative for s in spectra])),
        "summary": _rows(model, layer, circuit, kind=list(KINDS), n_heads=[n, n],
                         **{metric: [getattr(s, metric) for s in spectra] for metric in SPECTRUM_METRICS},
                         mean_offdiag_similarity=[mean_offdiagonal(similarity)] * 2),
    }
    parts = {side: f.head_norms().mean() for side, f in zip(SIDES[circuit], (left, right))}
    if isinstance(weights, LRKVWeights):
        projection = "key" if circuit == "qk" else "value"
        shared, residual = weights.decomposition(projection)
        residual_norms = np.linalg.norm(residual, axis=(1, 2))
        parts[f"{projection}_shared"] = np.linalg.norm(shared)
        parts[f"{projection}_residual"] = residual_norms.mean()
        denominator = np.linalg.norm(shared) * residual_norms
        inner = np.einsum("de,hde->h", shared, residual)
        cosine = np.divide(inner, denominator, out=np.zeros_like(inner), where=denominator > 0)
        rows["lrkv_cosine"] = _rows(model, layer, circuit, head=np.arange(n), cosine=cosine)
    rows["norms"] = _rows(model, layer, circuit, part=list(parts), frobenius_norm=list(parts.values()))
    return rows


# ---- behaviour space: similarity of attention maps ---------------------------------------------

@contextlib.contextmanager
def recorded_attention():
    """Record (q, k, scale) exactly as every headlab attention module hands them to its softmax
    kernel (`attention.common.attend`) in an uncached forward pass, after RoPE and QK-norm: the
    model's own scores are q kᵀ · scale, so no family's score computation is re-implemented."""
    from .attention import ATTENTION_CLASSES

    calls: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    modules = {sys.modules[cls.__module__] for cls in ATTENTION_CLASSES.values()}
    originals = {m: m.attend for m in modules}

    def recording(original):
        def attend(q, k, v, scale):
            calls.append((q.detach(), k.detach(), scale))
            return original(q, k, v, scale)
        return attend

    try:
        for m in modules:
            m.attend = recording(originals[m])
        yield calls
    finally:
        for m, original in originals.items():
            m.attend = original


def attention_pattern(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """The causal attention maps (B, H, T, T), in float64, of recorded q (B, H, T, D) and
    k (B, H_kv, T, D); KV head g serves query heads g·H/H_kv … (g+1)·H/H_kv − 1."""
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    return attention_probabilities(q.double(), k.double(), scale)


def js_distance_matrix(probs: torch.Tensor) -> np.ndarray:
    """H × H mean Jensen–Shannon distance √JSD (log base 2, so in [0, 1]) between the heads'
    attention distributions, averaged over batch and query positions 1…T−1 (position 0 can only
    attend to itself, in every head). probs: (B, H, T, T) rows summing to 1."""
    p = probs[:, :, 1:]
    rows = []
    for i in range(p.size(1)):
        mid = (p[:, i:i + 1] + p) / 2
        kl_i = (torch.xlogy(p[:, i:i + 1], p[:, i:i + 1]) - torch.xlogy(p[:, i:i + 1], mid)).sum(-1)
        kl_j = (torch.xlogy(p, p) - torch.xlogy(p, mid)).sum(-1)
        jsd = ((kl_i + kl_j) / (2 * math.log(2))).clamp(0.0, 1.0)
        rows.append(jsd.sqrt().mean(dim=(0, 2)))
    distance = torch.stack(rows).numpy()
    return (distance + distance.T) / 2


@torch.no_grad()
def attention_similarity(model, tokens: torch.Tensor, label: str | None = None) -> pd.DataFrame:
    """Behaviour-space head similarity of a headlab GPT on `tokens` (B, T): per layer, the
    similarity table (circuit "pattern") with value = 1 − mean Jensen–Shannon distance between
    two heads' attention maps (1: identical maps; 0: disjoint supports everywhere)."""
    config = getattr(model, "config", None)
    if not hasattr(config, "attention"):
        raise TypeError("attention_similarity needs a headlab GPT (attention maps are recorded from its modules)")
    was_training = model.training
    model.eval()
    try:
        with recorded_attention() as calls:
            model(tokens)
    finally:
        model.train(was_training)
    if len(calls) != config.n_layer:
        raise RuntimeError(f"recorded {len(calls)} attention calls for {config.n_layer} layers")
    label = label or config.label
    pieces = [_similarity_rows(label, layer, PATTERN, 1.0 - js_distance_matrix(attention_pattern(q, k, s)))
              for layer, (q, k, s) in enumerate(calls)]
    return _table(pieces, "similarity")
