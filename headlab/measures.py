"""Do the measures agree? Each layer's effective rank under three views of head similarity:

    weights       measure "frobenius": cos⟨A_i, A_j⟩_F of the QK forms (the paper's, Eq. 11)
    data          measure "data": cos⟨A_i, A_j⟩_Σ with Σ the second moments of the layer's
                  inputs on validation windows (`headlab.inputs`)
    behaviour     measure "jensen_shannon": S = 1 − D, D the mean Jensen–Shannon distance of the
                  heads' attention maps on validation windows (`analysis.attention_similarity`)

    table = measure_table(runs, corpus)            # summary rows with seed, role, negative_mass
    measure_agreement(table[...], pair_pattern_with="qk")       # Spearman between measures

Behaviour's effective rank. S is not a Gram matrix, so it need not be positive semi-definite.
Its centred matrix is: √JSD is a Hilbertian metric (Fuglede & Topsøe 2004), so each per-position
distance matrix is conditionally negative definite, and so are their mean D and its centring:
J S J = −J D J ⪰ 0. The uncentred S = 11ᵀ − D can have negative eigenvalues. Treatment (both
kinds alike): negative eigenvalues are clipped to 0 before the variance ratios, as classical
multidimensional scaling does, and the clipped share Σ|λ₋| / Σ|λ| is reported in the
`negative_mass` column (0 for the weight views), so a reader sees how much was dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import plots
from .analysis import BEHAVIOUR, NOT_APPLICABLE, PATTERN, analyze, attention_similarity, measure_agreement
from .data import Corpus, random_windows
from .inputs import input_moments
from .spectrum import KINDS, Spectrum, double_center, mean_offdiagonal
from .stats import Difference, paired_difference, spread
from .study import StudyRun

VIEWS = {"frobenius": "weights", "data": "data-aware weights", BEHAVIOUR: "behaviour (attention maps)"}
SUMMARY = ["model", "layer", "circuit", "measure", "mla_rope", "kind", "n_heads", "effective_rank",
           "effective_rank_pct_of_heads", "negative_mass", "mean_offdiag_similarity"]


def clipped_spectrum(similarity: np.ndarray, kind: str) -> tuple[Spectrum, float]:
    """The `kind` spectrum of a symmetric similarity that may not be PSD, with its negative
    eigenvalues clipped to 0, and the clipped share Σ|λ₋| / Σ|λ| (0 when nothing was clipped)."""
    if kind not in KINDS:
        raise ValueError(f"kind = {kind!r} is invalid: allowed values are {', '.join(KINDS)}")
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or not np.allclose(s, s.T, atol=1e-9):
        raise ValueError(f"similarity must be a symmetric square matrix; got shape {s.shape}")
    matrix = double_center(s) if kind == "centered" else s
    values = np.linalg.eigvalsh((matrix + matrix.T) / 2)[::-1]
    total = np.abs(values).sum()
    negative = float(-values[values < 0].sum() / total) if total > 0 else 0.0
    return Spectrum(kind, np.clip(values, 0.0, None)), negative


def behaviour_summary(similarity: pd.DataFrame) -> pd.DataFrame:
    """Summary rows (columns `SUMMARY`) of an `attention_similarity` table, per model and layer,
    by `clipped_spectrum`."""
    rows = []
    for (model, layer), group in similarity.groupby(["model", "layer"], sort=False):
        n = int(group["head_i"].max()) + 1
        matrix = np.zeros((n, n))
        matrix[group["head_i"].to_numpy(), group["head_j"].to_numpy()] = group["value"].to_numpy()
        for kind in KINDS:
            spectrum, negative = clipped_spectrum(matrix, kind)
            rows.append({"model": model, "layer": layer, "circuit": PATTERN, "measure": BEHAVIOUR,
                         "mla_rope": NOT_APPLICABLE, "kind": kind, "n_heads": n,
                         "effective_rank": spectrum.effective_rank,
                         "effective_rank_pct_of_heads": spectrum.effective_rank_pct_of_heads,
                         "negative_mass": negative, "mean_offdiag_similarity": mean_offdiagonal(matrix)})
    return pd.DataFrame(rows, columns=SUMMARY)


@dataclass(frozen=True)
class MeasureTable:
    """The three views of every run (summary rows with seed and role) and the seconds spent
    estimating Σ (input moments), in total over runs."""

    summary: pd.DataFrame
    moment_seconds: float
    moment_tokens: int


def measure_table(runs: list[StudyRun], corpus: Corpus, mla_rope: str = "included", moment_windows: int = 32,
                  behaviour_windows: int = 8) -> MeasureTable:
    """Per run, the QK effective rank under the weights and data-aware views (at `mla_rope`) and
    the behaviour view, on seeded validation windows of `corpus` (`moment_windows` for Σ,
    `behaviour_windows` for the attention maps; the same windows for every run)."""
    pieces, seconds, tokens = [], 0.0, 0
    for r in runs:
        model = r.run.model
        windows = {n: random_windows(corpus.val, n, r.config.seq_len, torch.Generator().manual_seed(0))[0]
                   for n in (moment_windows, behaviour_windows)}
        start = time.perf_counter()
        moments = input_moments(model, windows[moment_windows], text=f"{corpus.name} validation windows")
        seconds += time.perf_counter() - start
        tokens += moments.n_tokens
        weights = [analyze(model, r.label, mla_rope=mla_rope).summary,
                   analyze(model, r.label, mla_rope=mla_rope, measure="data", inputs=moments).summary]
        behaviour = behaviour_summary(attention_similarity(model, windows[behaviour_windows], r.label))
        frame = pd.concat([w.assign(negative_mass=0.0)[SUMMARY] for w in weights] + [behaviour], ignore_index=True)
        pieces.append(frame.assign(seed=r.seed, role=r.role))
    return MeasureTable(pd.concat(pieces, ignore_index=True), seconds, tokens)


def per_seed_ranks(summary: pd.DataFrame) -> pd.DataFrame:
    """Layer-mean effective rank (% of H) per role, model, measure, kind and seed."""
    return (summary.groupby(["role", "model", "measure", "kind", "seed"], sort=False)["effective_rank_pct_of_heads"]
            .mean().rename("rank").reset_index())


def _difference(ranks: pd.DataFrame, role: str, measure: str, kind: str) -> Difference:
    """Paired per-seed difference role − Standard MHA of the layer-mean rank under one measure."""
    rows = ranks[(ranks["measure"] == measure) & (ranks["kind"] == kind)]
    ours = rows[rows["role"] == role].set_index("seed")["rank"]
    mha = rows[rows["role"] == "mha"].set_index("seed")["rank"]
    seeds = ours.index.intersection(mha.index).sort_values()
    return paired_difference(ours[seeds].to_numpy(), mha[seeds].to_numpy())


def _ordering(d: Difference) -> str:
    if not d.decided:
        return f"within seed noise ({d.format(1)})"
    return f"{'higher' if d.mean > 0 else 'lower'} by {abs(d.mean):.1f} ± {d.half_width:.1f}"


def claims(ranks: pd.DataFrame) -> list[str]:
    """Per variant and kind with a weight-space ordering against Standard MHA (the paper's kind
    of conclusion), whether the data-aware and behaviour views show the same ordering beyond seed
    noise ("holds up"), the opposite one ("reversed"), or none ("not confirmed"); by the rule of
    `headlab.stats`. Variants without a weight-space ordering are listed once."""
    if ranks["seed"].nunique() < 2:
        return ["One seed: no orderings claimed, so no weight-space conclusion is tested."]
    sentences, undecided = [], []
    models = dict(zip(ranks["role"], ranks["model"]))
    for role in dict.fromkeys(ranks["role"]):
        if role == "mha":
            continue
        for kind, word in (("uncentered", "uncentred"), ("centered", "centred")):
            weights = _difference(ranks, role, "frobenius", kind)
            if not weights.decided:
                undecided.append(f"{models[role]} ({word})")
                continue
            parts = []
            for measure in ("data", BEHAVIOUR):
                d = _difference(ranks, role, measure, kind)
                verdict = ("holds up" if d.decided and np.sign(d.mean) == np.sign(weights.mean)
                           else "reversed" if d.decided else "not confirmed")
                parts.append(f"{VIEWS[measure]}: {_ordering(d)}, {verdict}")
            sentences.append(f"{models[role]}, {word} (points of % of H against Standard MHA): weights "
                             f"{_ordering(weights)}; {'; '.join(parts)}.")
    if undecided:
        sentences.append("No weight-space ordering against Standard MHA to test (within seed noise): "
                         + ", ".join(undecided) + ".")
    return sentences


def section(runs: list[StudyRun], out: Path, corpus: Corpus, mla_rope: str = "included") -> list[str]:
    """The report's "Do the measures agree?" section: writes measures.csv, measure_agreement.csv
    and the figures (figures/measures_<kind>.png, .svg) into `out`; returns the markdown lines."""
    from .report import _markdown  # the report's table format (report imports this module)

    table = measure_table(runs, corpus, mla_rope)
    summary = table.summary
    summary.to_csv(out / "measures.csv", index=False)
    agreement = measure_agreement(summary, pair_pattern_with="qk")
    agreement.to_csv(out / "measure_agreement.csv", index=False)
    colours = plots.palette(summary["model"].unique())
    for kind in KINDS:
        plots.save_figure(plots.measures_figure(summary, kind=kind, palette=colours), out / "figures", f"measures_{kind}")
    ranks = per_seed_ranks(summary)
    overview = (ranks.groupby(["model", "measure", "kind"], sort=False)["rank"]
                .apply(lambda values: spread(values.to_numpy()).format(1)).unstack("measure").reset_index())
    overview = overview.rename(columns={**VIEWS, "kind": "kind"})
    clipped = summary.loc[summary["measure"] == BEHAVIOUR, "negative_mass"]
    agreement_shown = agreement.assign(pair=agreement["measure_a"] + " vs " + agreement["measure_b"])[
        ["model", "kind", "pair", "n_points", "spearman"]]
    return [
        "## Do the measures agree?",
        "",
        "Each layer's QK effective rank (% of H) under three views: the weights (Frobenius, the paper's), the "
        "data-aware weights (inner product weighted by the second moments Σ of each layer's inputs on "
        f"{table.moment_tokens:,} validation tokens; estimating Σ took {table.moment_seconds:.1f} s for all "
        f"{len(runs)} runs), and behaviour (1 − mean Jensen–Shannon distance of the heads' attention maps on "
        "validation windows). The behaviour similarity is not a Gram matrix: its centred form is positive "
        "semi-definite (the JS distance is Hilbertian), its uncentred form need not be; negative eigenvalues are "
        f"clipped to 0, which dropped at most {100 * clipped.max():.2f}% of the absolute eigenvalue mass "
        "(`negative_mass` in measures.csv). Mean ± sd over seeds of the layer mean:",
        "",
        _markdown(overview, 1),
        "",
        "![measures](figures/measures_uncentered.png)",
        "",
        "![measures](figures/measures_centered.png)",
        "",
        "Spearman rank correlation between measures across layers and seeds (attention maps paired with the QK "
        "circuit, whose softmax they are):",
        "",
        _markdown(agreement_shown, 2),
        "",
        "Where the weight-space conclusion holds up: for each variant whose weight-space effective rank differs "
        "from Standard MHA's beyond seed noise, the same paired comparison under the other two views.",
        "",
        *[f"- {sentence}" for sentence in claims(ranks)],
        "",
    ]
