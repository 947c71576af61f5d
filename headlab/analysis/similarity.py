"""`analyze()`: every layer's head similarity, eigen-spectra and effective rank, as tidy tables.

    result = analyze(model_or_path, label="MHA", circuit="qk")   # "qk", "ov" or "both"
    analyze(mla_run, mla_rope="excluded")                        # MLA: the paper's latent-only A_h
    result.summary                                               # one row per layer, circuit, kind
    result.save("analysis/mha");  Analysis.load("analysis/mha")
    both = concat([result, other])                               # compare models
    moments = input_moments(model_or_path, encode_text(model_or_path, text))   # headlab.analysis.inputs
    weighted = analyze(model_or_path, measure="data", inputs=moments)          # data-aware measure

`source` is a headlab GPT, a headlab run folder (config.json + model.safetensors), a Hugging Face
checkpoint folder or .safetensors file (`headlab.analysis.hf_layouts` has the layouts,
`headlab.analysis.layer_weights` what lies outside the bilinear form: RoPE, norms, biases), or a
`ModelHeads`.

`mla_rope` ("included" by default, or "excluded") says whether MLA's decoupled RoPE query/key
parts enter A_h; "excluded" is the paper's Table 4 definition W_K,h = W_down W_up,h. It is
recorded as a column of every table, also for families without those parts, where both
settings give identical numbers. The default keeps the whole
pre-softmax score form, as for every other family: leaving the RoPE part out would describe
MLA's heads by a part of their scores only (`headlab reproduce` reports how large each part is).

`measure` is the inner product of head forms: "frobenius" (the paper's, Eq. 11) or "data"
(weighted by the second moments of the layer's inputs, `headlab.analysis.inputs`).

Tables (layers and heads from 0, eigenvalue index from 1; `spectrum.py` has the formulas):
  similarity   model, layer, circuit, measure, mla_rope, head_i, head_j, value — cosine G[i,j] of A_i, A_j
  spectra      model, layer, circuit, measure, mla_rope, kind, index, eigenvalue, variance_ratio, cumulative
  summary      model, layer, circuit, measure, mla_rope, kind, n_heads, effective_rank,
               effective_rank_pct_of_heads, effective_rank_pct_of_ceiling, n_components_90,
               participation_ratio, mean_offdiag_similarity (of the uncentered G, on both kinds' rows)
  norms        model, layer, circuit, mla_rope, part, frobenius_norm — mean over heads of ‖L_h‖_F and
               ‖R_h‖_F (parts query, key for qk; value, output for ov); for LRKV also
               ‖W_shared‖_F and the mean ‖U_h B_hᵀ‖_F (key_shared, key_residual, ...) (Fig. 8)
  lrkv_cosine  model, layer, circuit, mla_rope, head, cosine —
               ⟨W_shared, U_h B_hᵀ⟩_F / (‖W_shared‖ ‖U_h B_hᵀ‖)
               per head, keys (qk) and values (ov); LRKV only, else empty (App. B)

Undefined is NaN (`spectrum.py`, "Dead heads"): a dead head's similarity row and column; the
eigenvalues a layer with dead heads lacks (it has one per live head); and every number of a
layer whose heads are all dead, which has no circuit. `zero_forms.zero_form_note` names them.

The behaviour-space counterpart is `headlab.analysis.attention_maps`; QK-norm's per-token
scale is measured by `headlab.analysis.qk_norm`, and whether the measures agree by
`headlab.analysis.measures.measure_agreement`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from headlab.analysis.gram import normalised_gram
from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import InputMoments
from headlab.analysis.layer_weights import LRKVWeights, MLAWeights, check_mla_rope
from headlab.analysis.spectrum import Spectrum, cosine_similarity, mean_offdiagonal, similarity_spectrum
from headlab.analysis.tables import ANALYSIS, ANALYSIS_MANIFEST, load_tables, save_tables
from headlab.schema import (
    ALL_CIRCUITS,
    CIRCUITS,
    COLUMNS,
    KINDS,
    MEASURES,
    SPECTRUM_METRICS,
    check,
)

REQUIRED_FILES = ("similarity", "spectra", "summary")  # an analysis folder always has these
LARGE_SIMILARITY_ROWS = 5_000_000  # above this the similarity table (H² rows per layer) is warned about
SIDES = {"qk": ("query", "key"), "ov": ("value", "output")}


@dataclass
class Analysis:
    """The tidy tables of one or more analysed models (columns in `COLUMNS`)."""

    similarity: pd.DataFrame
    spectra: pd.DataFrame
    summary: pd.DataFrame
    norms: pd.DataFrame
    lrkv_cosine: pd.DataFrame

    def save(self, folder: str | Path) -> Path:
        """Write every table as <name>.csv in `folder` (created if needed), then `analysis.json`
        (each table's row count and SHA-256) last (`headlab.analysis.tables`)."""
        return save_tables(folder, {name: getattr(self, name) for name in COLUMNS}, ANALYSIS_MANIFEST, ANALYSIS)

    @classmethod
    def load(cls, folder: str | Path) -> "Analysis":
        """Read an analysis folder written by `save`, checking every table against its manifest."""
        folder = Path(folder)
        missing = [f"{n}.csv" for n in REQUIRED_FILES if not (folder / f"{n}.csv").exists()]
        if missing:
            raise ValueError(f"{folder} is not an analysis folder: missing {', '.join(missing)}")
        tables, _ = load_tables(folder, ANALYSIS_MANIFEST, ANALYSIS)
        if set(tables) != set(COLUMNS):
            raise ValueError(f"{folder / ANALYSIS_MANIFEST} names the tables {sorted(tables)}, not an analysis's "
                             f"{sorted(COLUMNS)}")
        return cls(**tables)

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(self.summary["model"]))


def concat(analyses: Iterable[Analysis]) -> Analysis:
    """Stack several analyses into one; a model label may appear in only one of them per circuit
    measure and `mla_rope` setting. (norms and lrkv_cosine do not depend on the measure: analyses
    of one model under two measures repeat their rows.)"""
    analyses = list(analyses)
    seen: dict[tuple, int] = {}
    for n, a in enumerate(analyses):
        keys = ["model", "circuit"] + [c for c in ("measure", "mla_rope") if c in a.summary.columns]
        for key in set(a.summary[keys].itertuples(index=False, name=None)):
            if key in seen:
                raise ValueError(f"model label {key[0]!r} ({', '.join(key[1:])}) is in analyses {seen[key]} and {n}: "
                                 "pass label= to analyze() to tell them apart")
            seen[key] = n
    return Analysis(**{name: stack_tables([getattr(a, name) for a in analyses]) for name in COLUMNS})


def stack_tables(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate, leaving out empty tables (they would turn integer columns into floats)."""
    filled = [t for t in tables if len(t)]
    return pd.concat(filled, ignore_index=True) if filled else tables[0]


def analyze(source, label: str | None = None, circuit: str = "qk",
            layers: Sequence[int] | None = None, mla_rope: str = "included", measure: str = "frobenius",
            inputs: InputMoments | None = None) -> Analysis:
    """Head-similarity analysis of every layer (or of `layers`) of `source` for `circuit`
    ("qk", "ov" or "both"), labelled `label` (default: the model's own label). `mla_rope`:
    whether MLA's decoupled RoPE parts enter A_h ("included") or not ("excluded", the paper's
    latent-only definition); see the module docstring for the default.

    `measure` is the inner product of head forms: "frobenius" (the paper's, Eq. 11) or "data",
    ⟨A_i, A_j⟩_Σ = tr(A_iᵀ Σ_L A_j Σ_R) with the second moments of the layer's inputs from
    `inputs` (`headlab.analysis.inputs.input_moments`): qk weighs queries by Σ_q and keys by Σ_k; ov weighs
    the value side by Σ_k (values are read from the key-side tokens) and leaves the output side
    Euclidean (Σ_R = I), i.e. E_y[⟨A_iᵀy, A_jᵀy⟩]: how alike two heads' writes are for real sources.
    """
    check_mla_rope(mla_rope)
    check("circuit", circuit, (*CIRCUITS, ALL_CIRCUITS))
    check("measure", measure, MEASURES)
    if (measure == "data") != (inputs is not None):
        raise ValueError(f"measure = {measure!r} with inputs = {type(inputs).__name__}: measure 'data' needs "
                         "inputs = headlab.analysis.inputs.input_moments(...), and only it uses them")
    circuits = CIRCUITS if circuit == ALL_CIRCUITS else (circuit,)
    heads = load_heads(source, label)
    if heads.n_heads < 2:
        raise ValueError(f"{heads.label} has n_heads = {heads.n_heads}: head similarity needs at least 2 heads")
    if inputs is not None and inputs.n_layers != heads.n_layers:
        raise ValueError(f"inputs has moments of {inputs.n_layers} layers but {heads.label} has {heads.n_layers}")
    n_layers = heads.n_layers if layers is None else len(layers)
    rows = n_layers * heads.n_heads ** 2 * len(circuits)
    if rows > LARGE_SIMILARITY_ROWS:
        warnings.warn(f"{heads.label}: {n_layers} layers of {heads.n_heads} heads give a similarity table of "
                      f"{rows:,} rows (about {rows * 48 / 2**30:.1f} GiB in memory); pass layers= to analyse fewer",
                      stacklevel=2)
    pieces: dict[str, list[dict]] = {name: [] for name in COLUMNS}
    for layer in range(heads.n_layers) if layers is None else layers:
        weights = heads.layer(layer)
        roots = None if inputs is None else inputs.roots(layer)
        for c in circuits:
            sides = None if roots is None else (roots if c == "qk" else (roots[1], None))
            for name, piece in _layer_rows(heads.label, layer, c, weights, mla_rope, measure, sides).items():
                pieces[name].append(piece)
    return Analysis(**{name: table_from_pieces(pieces[name], name) for name in COLUMNS})


def _rows(model: str, layer: int, circuit: str, mla_rope: str, **columns) -> dict[str, np.ndarray]:
    """The columns of some table rows; model, layer, circuit and mla_rope are repeated on every row."""
    columns = {name: np.asarray(values) for name, values in columns.items()}
    n = len(next(iter(columns.values())))
    return {"model": np.full(n, model, dtype=object), "layer": np.full(n, layer),
            "circuit": np.full(n, circuit, dtype=object), "mla_rope": np.full(n, mla_rope, dtype=object), **columns}


def table_from_pieces(pieces: list[dict], name: str) -> pd.DataFrame:
    """One table from row pieces (built once: a DataFrame per layer costs more than the math)."""
    return pd.DataFrame({c: np.concatenate([p[c] for p in pieces]) if pieces else [] for c in COLUMNS[name]})


def similarity_rows(model: str, layer: int, circuit: str, measure: str, mla_rope: str, matrix: np.ndarray) -> dict:
    """An H × H matrix as rows (model, layer, circuit, measure, mla_rope, head_i, head_j, value)."""
    i, j = np.indices(matrix.shape)
    return _rows(model, layer, circuit, mla_rope, measure=np.full(matrix.size, measure, dtype=object),
                 head_i=i.ravel(), head_j=j.ravel(), value=matrix.ravel())


def spectrum_rows(model: str, layer: int, circuit: str, measure: str, mla_rope: str, similarity: np.ndarray,
                  spectra: Sequence[Spectrum]) -> dict[str, dict]:
    """The similarity, spectra and summary rows of one layer's similarity matrix and its `spectra`
    (one `Spectrum` per kind, in `KINDS` order)."""
    n = similarity.shape[0]
    return {
        "similarity": similarity_rows(model, layer, circuit, measure, mla_rope, similarity),
        "spectra": _rows(model, layer, circuit, mla_rope, measure=np.full(2 * n, measure, dtype=object),
                         kind=np.repeat(KINDS, n), index=np.tile(np.arange(1, n + 1), 2),
                         eigenvalue=np.concatenate([s.eigenvalues for s in spectra]),
                         variance_ratio=np.concatenate([s.variance_ratio for s in spectra]),
                         cumulative=np.concatenate([s.cumulative for s in spectra])),
        "summary": _rows(model, layer, circuit, mla_rope, measure=[measure] * 2, kind=list(KINDS), n_heads=[n, n],
                         **{metric: [getattr(s, metric) for s in spectra] for metric in SPECTRUM_METRICS},
                         mean_offdiag_similarity=[mean_offdiagonal(similarity)] * 2),
    }


def _layer_rows(model: str, layer: int, circuit: str, weights, mla_rope: str, measure: str,
                roots: tuple[np.ndarray, np.ndarray | None] | None) -> dict[str, dict]:
    """The table rows of one layer and circuit; `roots` (R_L, R_R) weigh the data measure."""
    left, right = weights.factors(circuit, mla_rope) if isinstance(weights, MLAWeights) else weights.factors(circuit)
    gram, live = normalised_gram(left, right, *(roots or (None, None)))
    if not np.isfinite(gram).all():  # normalised factors bound every entry: only NaN or inf weights get here
        raise ValueError(f"{model} layer {layer}: the {circuit} weights hold NaN or inf, so the heads' forms are "
                         "undefined; check the checkpoint (a diverged run?)")
    similarity = cosine_similarity(gram, live)
    rows = spectrum_rows(model, layer, circuit, measure, mla_rope, similarity,
                         [similarity_spectrum(similarity, kind) for kind in KINDS])
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
        rows["lrkv_cosine"] = _rows(model, layer, circuit, mla_rope, head=np.arange(len(cosine)), cosine=cosine)
    rows["norms"] = _rows(model, layer, circuit, mla_rope, part=list(parts), frobenius_norm=list(parts.values()))
    return rows
