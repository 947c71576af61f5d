"""Do the measures agree? Each layer's effective rank under three views of head similarity:

    weights       measure "frobenius": cos⟨A_i, A_j⟩_F of the QK forms (the paper's, Eq. 11)
    data          measure "data": cos⟨A_i, A_j⟩_Σ with Σ the second moments of the layer's
                  inputs on validation windows (`headlab.analysis.inputs`)
    behaviour     measure "jensen_shannon": S = 1 − D, D the mean Jensen–Shannon distance of the
                  heads' attention maps on validation windows (`analysis.attention_similarity`)

    summary = measure_views(model, label, moment_tokens, behaviour_tokens)   # one model, three views
    measure_agreement(summary, pair_pattern_with="qk")                      # Spearman between measures

Behaviour's effective rank. S is not a Gram matrix, so it need not be positive semi-definite.
Its centered matrix is: √JSD is a Hilbertian metric (Fuglede & Topsøe 2004), so each per-position
distance matrix is conditionally negative definite, and so are their mean D and its centering:
J S J = −J D J ⪰ 0. The uncentered S = 11ᵀ − D can have negative eigenvalues. Treatment (both
kinds alike): negative eigenvalues are clipped to 0 before the variance ratios, as classical
multidimensional scaling does, and the clipped share Σ|λ₋| / Σ|λ| is reported in the
`negative_mass` column (0 for the weight views), so a reader sees how much was dropped.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from headlab.analysis.attention_maps import attention_similarity, layer_matrices
from headlab.analysis.inputs import input_moments
from headlab.analysis.layer_weights import check_circuit
from headlab.analysis.similarity import analyze
from headlab.analysis.spectrum import clipped_spectrum, mean_offdiagonal
from headlab.schema import BEHAVIOUR, KINDS, NOT_APPLICABLE, PATTERN, VIEWS_SUMMARY


def behaviour_summary(similarity: pd.DataFrame) -> pd.DataFrame:
    """Summary rows (columns `VIEWS_SUMMARY`) of an `attention_similarity` table, per model and layer,
    by `clipped_spectrum`."""
    rows = []
    for model, layer, matrix in layer_matrices(similarity):
        n = len(matrix)
        for kind in KINDS:
            spectrum, negative = clipped_spectrum(matrix, kind)
            rows.append({"model": model, "layer": layer, "circuit": PATTERN, "measure": BEHAVIOUR,
                         "mla_rope": NOT_APPLICABLE, "kind": kind, "n_heads": n,
                         "effective_rank": spectrum.effective_rank,
                         "effective_rank_pct_of_heads": spectrum.effective_rank_pct_of_heads,
                         "negative_mass": negative, "mean_offdiag_similarity": mean_offdiagonal(matrix)})
    return pd.DataFrame(rows, columns=VIEWS_SUMMARY)


def measure_views(model, label: str, moment_tokens: torch.Tensor, behaviour_tokens: torch.Tensor,
                  mla_rope: str = "included", text: str = "") -> tuple[pd.DataFrame, float, int]:
    """One model's QK effective rank under the three views: weights and data-aware weights (at
    `mla_rope`; Σ from `moment_tokens`, described as `text`) and behaviour (attention maps on
    `behaviour_tokens`). Returns the summary rows (columns `VIEWS_SUMMARY`), the seconds spent estimating
    Σ and the number of tokens it was estimated on."""
    start = time.perf_counter()
    moments = input_moments(model, moment_tokens, text=text)
    seconds = time.perf_counter() - start
    weights = [analyze(model, label, mla_rope=mla_rope).summary,
               analyze(model, label, mla_rope=mla_rope, measure="data", inputs=moments).summary]
    behaviour = behaviour_summary(attention_similarity(model, behaviour_tokens, label))
    summary = pd.concat([w.assign(negative_mass=0.0)[VIEWS_SUMMARY] for w in weights] + [behaviour], ignore_index=True)
    return summary, seconds, moments.n_tokens


# ---- do the measures agree? ------------------------------------------------------------------

def spearman(a: pd.Series, b: pd.Series) -> float:
    """ρ = Pearson(rank(a), rank(b)), ties given their average rank (as scipy.stats.spearmanr,
    without scipy.stats' import, half a second of every start of the command line)."""
    return float(np.corrcoef(a.rank().to_numpy(), b.rank().to_numpy())[0, 1])


def measure_agreement(summary: pd.DataFrame, metric: str = "effective_rank",
                      pair_pattern_with: str | None = None) -> pd.DataFrame:
    """Spearman rank correlation of `metric` between every two measures, per model, circuit and
    kind, across the layers (and seeds, when `summary` has a `seed` column) that both measured:
    columns model, circuit, kind, measure_a, measure_b, n_points, spearman (NaN when fewer than
    3 points, or when one measure is constant over them). Measures are compared within a circuit.

    `pair_pattern_with` ("qk" or "ov"): the convention that attention-map rows (circuit
    "pattern") describe that circuit, so behaviour is compared with its weight measures; an
    attention map is the softmax of the QK scores, so "qk" is the natural choice."""

    if pair_pattern_with is not None:
        check_circuit(pair_pattern_with)
        summary = summary.assign(circuit=summary["circuit"].replace(PATTERN, pair_pattern_with))
    points = ["layer"] + (["seed"] if "seed" in summary else [])
    repeated = summary.duplicated(["model", "circuit", "kind", "measure"] + points)
    if repeated.any():
        first = summary[repeated].iloc[0]
        raise ValueError(f"summary has several rows for model {first['model']!r}, circuit {first['circuit']}, "
                         f"measure {first['measure']}, {', '.join(f'{c} {first[c]}' for c in points)}: "
                         "tell them apart with a seed column or distinct model labels")
    rows = []
    for (model, circuit, kind), group in summary.groupby(["model", "circuit", "kind"], sort=False):
        wide = group.pivot(index=points, columns="measure", values=metric)
        measures = list(dict.fromkeys(group["measure"]))
        for a_index, a in enumerate(measures):
            for b in measures[a_index + 1:]:
                pair = wide[[a, b]].dropna()
                constant = pair[a].nunique() < 2 or pair[b].nunique() < 2
                rho = float("nan") if len(pair) < 3 or constant else spearman(pair[a], pair[b])
                rows.append((model, circuit, kind, a, b, len(pair), rho))
    return pd.DataFrame(rows, columns=["model", "circuit", "kind", "measure_a", "measure_b", "n_points", "spearman"])
