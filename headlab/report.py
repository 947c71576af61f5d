"""The report of a study: tables over seeds, the paper's numbers keyed by role, figures, and
prose generated from the statistics by a stated rule (`headlab.stats`).

    study = Study("cpu-small", None, Path("runs/reproduce"))
    write_report(study.train(seeds=3), study.folder, preset="cpu-small", corpus=study.load_corpus())

Output folder (beside the study's runs/):
    figures/*.png, *.svg      the flagship spectra figure and the supporting figures
    spectra.csv, summary.csv, similarity.csv, norms.csv, training.csv
    report.md                 our numbers (mean ± sd over seeds) beside the paper's

The rule every comparative sentence follows: for a metric and a variant, the per-seed
differences to Standard MHA of the same seed give a 95% t-interval; an ordering is stated
(with the difference ± the interval's half-width) only when the interval excludes zero, else
the two are "within seed noise". One seed: no orderings at all.

MLA's decoupled RoPE parts: every run is analysed both ways (`mla_rope` column); the flagship
figure and every other figure use `FLAGSHIP_MLA_ROPE`, and the tables show MLA both ways.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import measures, plots, through_training
from .analysis import analyze, concat, norm_scale_effect
from .data import Corpus, random_windows
from .heads import MLA_ROPE, load_heads
from .stats import Difference, chance_orderings, paired_difference, spread
from .study import StudyRun, loss_unit

# The figures use the whole pre-softmax score of MLA, as for every other family (see
# `headlab.analysis`); the paper's latent-only definition is shown beside it in the tables.
FLAGSHIP_MLA_ROPE = "included"
FIGURES = ("spectra_uncentered", "spectra_centered", "cumulative_variance", "effective_rank_uncentered",
           "effective_rank_centered", "similarity_heatmaps", "loss_curves", "loss_vs_cache")
METRICS = {  # per-seed column -> (what it is, unit (None: the metrics' loss_unit), decimals, which way is better)
    "val_loss": ("validation loss", None, 3, "lower"),
    "uncentred": ("uncentred effective rank", "points of % of H", 2, "higher"),
    "centred": ("centred effective rank", "points of % of H", 2, "higher"),
}


@dataclass(frozen=True)
class PaperNumbers:
    """One variant's numbers at 128M in arXiv 2601.11471 v3."""

    label: str
    uncentred: float  # Table 3, effective rank % of H (GQA's was estimated by the authors)
    centred: float
    kv_cache_pct: float  # Tables 7 and 8, % of MHA (MLA: the latent d_c alone)
    loss: float  # Table 8, test cross-entropy per GPT-2 token on FineWeb-Edu


PAPER = {  # keyed by role (`headlab.config.comparison_roles`), never by position
    "mha": PaperNumbers("Standard MHA", 95.4, 82.4, 100.0, 2.903),
    "lrkv-small": PaperNumbers("LRKV (r=16)", 88.8, 81.5, 29.2, 2.905),
    "lrkv-large": PaperNumbers("LRKV (r=64)", 96.2, 83.0, 66.7, 2.888),
    "mqa": PaperNumbers("MQA", 72.6, 78.4, 16.7, 2.929),
    "mla": PaperNumbers("MLA (d_c=128)", 83.9, 78.5, 8.3, 2.901),
    "gqa": PaperNumbers("GQA (3 groups)", 90.5, 79.6, 50.0, 2.918),
}


# ---- tables ----------------------------------------------------------------------------------

def collect_tables(runs: list[StudyRun], mla_rope=MLA_ROPE, unit: str = loss_unit("byte")
                   ) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """Analysis tables of every run at every `mla_rope` setting (with `seed` and `role`
    columns), and the training table (model, role, seed, step, tokens, val_loss, val_bpb,
    kv_cache_pct, loss_unit = `unit`, the runs' tokenizer's: `headlab.study.loss_unit`). Filter on
    `mla_rope` before drawing a figure."""
    per_seed: dict[int, list] = {}
    for r in runs:
        per_seed.setdefault(r.seed, []).extend(analyze(r.run.model, label=r.label, mla_rope=s) for s in mla_rope)
    roles = {r.label: r.role for r in runs}
    tables = {}
    for name in ("similarity", "spectra", "summary", "norms"):
        stacked = pd.concat([getattr(concat(analyses), name).assign(seed=seed) for seed, analyses in per_seed.items()],
                            ignore_index=True)
        tables[name] = stacked.assign(role=stacked["model"].map(roles))
    training = pd.DataFrame([
        {"model": r.label, "role": r.role, "seed": r.seed, "step": m["step"], "tokens": m["tokens"],
         "val_loss": m["val_loss"], "val_bpb": m["val_bpb"], "kv_cache_pct": 100 * r.config.kv_cache_fraction_of_mha(),
         "loss_unit": unit}
        for r in runs for m in r.run.metrics if "val_loss" in m])
    return tables, training


def final_losses(training: pd.DataFrame) -> pd.DataFrame:
    """The last validation record of every (model, seed) run in a training table."""
    return training.sort_values("step").groupby(["model", "seed"]).tail(1)


def per_seed_metrics(tables: dict[str, pd.DataFrame], training: pd.DataFrame) -> pd.DataFrame:
    """One row per (role, model, mla_rope, seed): final validation loss (in its loss_unit, and
    in bits per byte) and the QK effective rank (% of H) averaged over layers, uncentred and centred."""
    summary = tables["summary"][tables["summary"]["circuit"] == "qk"]
    ranks = (summary.pivot_table(index=["role", "model", "mla_rope", "seed"], columns="kind",
                                 values="effective_rank_pct_of_heads", aggfunc="mean")
             .rename(columns={"uncentered": "uncentred", "centered": "centred"}).reset_index())
    losses = final_losses(training)[["role", "seed", "val_loss", "val_bpb", "loss_unit"]]
    return ranks.merge(losses, on=["role", "seed"], validate="many_to_one")[
        ["role", "model", "mla_rope", "seed", "val_loss", "val_bpb", "loss_unit", "uncentred", "centred"]]


def layer_range(tables: dict[str, pd.DataFrame], model: str, mla_rope: str, kind: str) -> tuple[float, float]:
    """Min and max over layers of the seed-mean effective rank (% of H) of one model."""
    s = tables["summary"]
    rows = s[(s["circuit"] == "qk") & (s["model"] == model) & (s["mla_rope"] == mla_rope) & (s["kind"] == kind)]
    by_layer = rows.groupby("layer")["effective_rank_pct_of_heads"].mean()
    return float(by_layer.min()), float(by_layer.max())


def _variant_rows(metrics: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(role, model, mla_rope) of the rows the rank tables and claims show: every variant at the
    flagship setting in the figure order of `PAPER`'s roles, then MLA at each other setting."""
    flagship = metrics[metrics["mla_rope"] == FLAGSHIP_MLA_ROPE]
    order = list(PAPER)
    rows = sorted(set(zip(flagship["role"], flagship["model"], flagship["mla_rope"])), key=lambda r: order.index(r[0]))
    others = metrics[(metrics["role"] == "mla") & (metrics["mla_rope"] != FLAGSHIP_MLA_ROPE)]
    return rows + sorted(set(zip(others["role"], others["model"], others["mla_rope"])))


def _name(role: str, model: str, mla_rope: str) -> str:
    """A variant's name in tables and prose; MLA's says what enters A_h."""
    if role != "mla":
        return model
    return f"{model}, RoPE part {mla_rope}" + (" (the paper's definition)" if mla_rope == "excluded" else "")


def _values(metrics: pd.DataFrame, role: str, mla_rope: str, column: str) -> pd.Series:
    """A metric of one variant by seed (the MHA baseline has no RoPE parts: any setting)."""
    rows = metrics[(metrics["role"] == role) & (metrics["mla_rope"] == mla_rope)]
    return rows.set_index("seed")[column].sort_index()


def difference_to_mha(metrics: pd.DataFrame, role: str, mla_rope: str, column: str) -> Difference:
    """Paired per-seed difference variant − Standard MHA of one metric (seeds both have)."""
    ours, mha = _values(metrics, role, mla_rope, column), _values(metrics, "mha", mla_rope, column)
    seeds = ours.index.intersection(mha.index)
    return paired_difference(ours[seeds].to_numpy(), mha[seeds].to_numpy())


def rank_table(tables: dict[str, pd.DataFrame], metrics: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 3 form: mean ± sd over seeds of the layer-mean effective rank (% of H),
    with the range over layers of the seed means, beside the paper's value for the same role."""
    rows = []
    for role, model, mla_rope in _variant_rows(metrics):
        row = {"role": role, "ours": _name(role, model, mla_rope)}
        for column, kind in (("uncentred", "uncentered"), ("centred", "centered")):
            low, high = layer_range(tables, model, mla_rope, kind)
            seeds = spread(_values(metrics, role, mla_rope, column)).format(1)
            row[f"{column} % of H"] = f"{seeds} [{low:.1f}–{high:.1f}]"
        paper = PAPER[role]
        rows.append({**row, "paper (128M)": paper.label, "paper uncentred": paper.uncentred,
                     "paper centred": paper.centred})
    return pd.DataFrame(rows)


def cache_table(runs: list[StudyRun]) -> pd.DataFrame:
    """The paper's Tables 7 and 8 form: KV values per token and layer, % of MHA, the paper's %."""
    configs = {r.role: r.config for r in runs}
    return pd.DataFrame([{"role": role, "ours": config.label,
                          "KV values/token/layer": config.kv_cache_values_per_token(),
                          "% of MHA": 100 * config.kv_cache_fraction_of_mha(), "paper (128M)": PAPER[role].label,
                          "paper % of MHA": PAPER[role].kv_cache_pct} for role, config in configs.items()])


def loss_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """The paper's Tables 1 and 8 form: final validation loss mean ± sd over seeds, the paired
    difference to MHA ± the 95% t half-width, beside the paper's cross-entropy and its difference.
    Unless the loss is per byte already, bits per byte follow it."""
    unit = metrics["loss_unit"].iloc[0]
    rows = []
    for role, model, mla_rope in _variant_rows(metrics):
        if mla_rope != FLAGSHIP_MLA_ROPE:
            continue  # the loss does not depend on the analysis
        losses = _values(metrics, role, mla_rope, "val_loss")
        difference = difference_to_mha(metrics, role, mla_rope, "val_loss")
        paper = PAPER[role]
        bits = {} if unit == loss_unit("byte") else {
            "val bits/byte": spread(_values(metrics, role, mla_rope, "val_bpb")).format(3)}
        rows.append({"role": role, "ours": model, f"val loss ({unit})": spread(losses).format(3), **bits,
                     "vs MHA (paired)": "—" if role == "mha" else difference.format(3), "seeds": len(losses),
                     "paper (128M)": paper.label, "paper CE": paper.loss,
                     "paper vs MHA": paper.loss - PAPER["mha"].loss})
    return pd.DataFrame(rows)


# ---- prose from statistics -------------------------------------------------------------------

def claims(metrics: pd.DataFrame) -> list[str]:
    """One sentence per variant and metric, by the module's rule: an ordering against Standard
    MHA only where the paired 95% t-interval excludes zero; "within seed noise" otherwise; and
    a sentence on what centring does to each variant's rank, by the same rule. With one seed,
    the single sentence "One seed: no orderings claimed."."""
    if metrics["seed"].nunique() < 2:
        return ["One seed: no orderings claimed."]
    sentences = []
    for column, (what, unit, decimals, _) in METRICS.items():
        unit = unit or metrics["loss_unit"].iloc[0]
        for role, model, mla_rope in _variant_rows(metrics):
            if role == "mha" or (column == "val_loss" and mla_rope != FLAGSHIP_MLA_ROPE):
                continue
            sentences.append(_sentence(f"{_name(role, model, mla_rope)}: {what}",
                                       difference_to_mha(metrics, role, mla_rope, column),
                                       ("higher than", "lower than", "within seed noise of Standard MHA"), "Standard MHA",
                                       unit, decimals))
    for role, model, mla_rope in _variant_rows(metrics):
        rise = paired_difference(_values(metrics, role, mla_rope, "centred").to_numpy(),
                                 _values(metrics, role, mla_rope, "uncentred").to_numpy())
        paper = PAPER[role]
        sentences.append(_sentence(f"{_name(role, model, mla_rope)}: centring", rise,
                                   ("raises", "lowers", "leaves the effective rank within seed noise"), "the effective rank",
                                   "points of % of H", 2, f"the paper: {paper.uncentred:.1f}% → {paper.centred:.1f}%"))
    return sentences


def _sentence(subject: str, d: Difference, verbs: tuple[str, str, str], what: str, unit: str, decimals: int,
              note: str = "") -> str:
    """One claim by the rule: '<subject> <up|down> <what> by |d̄| ± h <unit> (<note>).' when the
    interval excludes zero, else '<subject> <undecided> (d̄ ± h <unit>; <note>).'."""
    up, down, undecided = verbs
    if d.decided:
        tail = f" ({note})" if note else ""
        return (f"{subject} {up if d.mean > 0 else down} {what} by {abs(d.mean):.{decimals}f} ± "
                f"{d.half_width:.{decimals}f} {unit}{tail}.")
    return f"{subject} {undecided} ({d.format(decimals)} {unit}{'; ' + note if note else ''})."


def rule_text(n_seeds: int, n_comparisons: int) -> str:
    """The rule the comparison prose follows, as the report states it, with how many of its
    `n_comparisons` orderings chance alone would produce."""
    if n_seeds < 2:
        return ("With one seed there is no estimate of seed noise, so this report states no ordering between "
                "variants; train more seeds (`--seeds 3`) for comparisons.")
    return (f"Each comparison pairs a variant's run with Standard MHA's run of the same seed (same data order and "
            f"initial draw) and takes the {n_seeds} per-seed differences d_i. An ordering is stated only when the "
            f"95% t-interval d̄ ± t(0.975, {n_seeds - 1}) · s_d / √{n_seeds} excludes zero, and is then given as "
            "difference ± half-width; otherwise the two are called within seed noise. No other ordering is claimed. "
            f"The {n_comparisons} comparisons below are each tested at 95% with no correction for their number: were "
            f"there no true difference behind any of them (a variant against Standard MHA, or centred against "
            f"uncentred), about {chance_orderings(n_comparisons):.1f} of them would still come out as orderings, so an ordering whose interval barely excludes zero is a lead to re-test "
            "with more seeds, not a finding.")


# ---- figures and the 1/rms measurement -------------------------------------------------------

def draw_figures(tables: dict[str, pd.DataFrame], training: pd.DataFrame, folder: Path) -> list[Path]:
    """Every figure of the report, at `FLAGSHIP_MLA_ROPE`, as PNG and SVG; returns the PNG paths."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = {name: table[table["mla_rope"] == FLAGSHIP_MLA_ROPE] for name, table in tables.items()}
    spectra, summary, similarity = chosen["spectra"], chosen["summary"], chosen["similarity"]
    colours = plots.palette(summary["model"].unique())
    shown = list(plots.layer_roles(summary["layer"]).values())
    middle = shown[len(shown) // 2]  # the middle layer, or the late one of a 2-layer model
    final = final_losses(training)
    figures = {
        "spectra_uncentered": plots.spectra_figure(spectra, kind="uncentered", palette=colours),
        "spectra_centered": plots.spectra_figure(spectra, kind="centered", palette=colours),
        "cumulative_variance": plots.cumulative_variance_figure(spectra, kind="centered", palette=colours),
        "effective_rank_uncentered": plots.effective_rank_figure(summary, kind="uncentered", palette=colours),
        "effective_rank_centered": plots.effective_rank_figure(summary, kind="centered", palette=colours),
        "similarity_heatmaps": plots.similarity_heatmaps(
            similarity[similarity["seed"] == 0].drop(columns="seed"), layer=middle, palette=colours),
        "loss_curves": plots.loss_curves_figure(training, palette=colours),
        "loss_vs_cache": plots.loss_vs_cache_figure(final[["model", "seed", "kv_cache_pct", "val_loss", "loss_unit"]],
                                                    palette=colours),
    }
    return [plots.save_figure(figure, folder, name) for name, figure in figures.items()]


def norm_effect_table(runs: list[StudyRun], corpus: Corpus, batch_size: int = 8) -> pd.DataFrame:
    """`analysis.norm_scale_effect` for every QK-normed variant's seed-0 run on validation
    windows of `corpus` (the one the runs trained on): per model and kind, the largest change
    over layers (points of % of H) that a per-head median 1/rms and the per-token 1/rms make,
    and the range of the median 1/rms."""
    rows = []
    for r in runs:
        if r.seed != 0 or not r.config.qk_norm:
            continue
        tokens, _ = random_windows(corpus.val, batch_size, r.config.seq_len, torch.Generator().manual_seed(0))
        effect = norm_scale_effect(r.run.model, tokens, r.label)
        ranks = effect.pivot_table(index=["layer", "kind"], columns="measure", values="effective_rank_pct_of_heads")
        for kind, word in (("uncentered", "uncentred"), ("centered", "centred")):
            k = ranks.xs(kind, level="kind")
            rows.append({"model": r.label, "kind": word,
                         "median 1/rms per head": (k["weights, median 1/rms per head"] - k["weights"]).abs().max(),
                         "per-token 1/rms": (k["token scores with 1/rms"] - k["token scores"]).abs().max(),
                         "median 1/rms range": f"{effect['median_inv_rms_min'].min():.2f}–"
                                               f"{effect['median_inv_rms_max'].max():.2f}"})
    return pd.DataFrame(rows)


# ---- report.md -------------------------------------------------------------------------------

def rope_to_latent_ratio(runs: list[StudyRun]) -> pd.Series:
    """Per MLA run (by seed): the mean over layers and heads of ‖A_h^RoPE‖_F / ‖A_h^latent‖_F, the
    RoPE part of each head's QK form against its latent part (A_h^RoPE = A_h with the RoPE parts
    included minus A_h without them)."""
    ratios = {}
    for r in runs:
        if r.role != "mla":
            continue
        heads, per_layer = load_heads(r.run.model), []
        for layer in range(heads.n_layers):
            forms = {}
            for setting in MLA_ROPE:
                left, right = heads.layer(layer).factors("qk", mla_rope=setting)
                forms[setting] = np.einsum("hde,hfe->hdf", left.heads(), right.heads())
            rope = np.linalg.norm(forms["included"] - forms["excluded"], axis=(1, 2))
            per_layer.append(rope / np.linalg.norm(forms["excluded"], axis=(1, 2)))
        ratios[r.seed] = float(np.mean(per_layer))
    return pd.Series(ratios, name="rope_to_latent")


def _markdown(frame: pd.DataFrame, decimals: int) -> str:
    """A markdown table; floats to `decimals` places, differences ('vs' columns) signed."""
    def cell(column: str, value) -> str:
        if not isinstance(value, float):
            return str(value)
        return f"{value:{'+' if 'vs' in column else ''}.{decimals}f}"

    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row)) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def corpus_text(corpus: Corpus) -> str:
    """How the report names the training data: 'Shakespeare (byte-level)', '`hf:…` (gpt2 tokens)'."""
    name = "Shakespeare" if corpus.name == "shakespeare" else f"`{corpus.name}`"
    return f"{name} ({'byte-level' if corpus.tokenizer_name == 'byte' else corpus.tokenizer_name + ' tokens'})"


def write_report(runs: list[StudyRun], out: str | Path, preset: str, started: float | None = None, *,
                 corpus: Corpus) -> Path:
    """Analyse `runs` (both `mla_rope` settings) trained on `corpus`, write the tables as CSV,
    draw the figures and write report.md into `out`; returns the report's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    unit = loss_unit(corpus.tokenizer_name)
    tables, training = collect_tables(runs, unit=unit)
    for name, table in (*tables.items(), ("training", training)):
        table.to_csv(out / f"{name}.csv", index=False)
    figure_paths = draw_figures(tables, training, out / "figures")
    metrics = per_seed_metrics(tables, training)
    sentences = claims(metrics)
    n_seeds = metrics["seed"].nunique()
    config = runs[0].config
    layers = sorted(tables["summary"]["layer"].unique())
    elapsed = "" if started is None else f" ({(time.perf_counter() - started) / 60:.1f} min)"
    norm_effect = norm_effect_table(runs, corpus)
    data = corpus_text(corpus)
    held_out = "Shakespeare" if corpus.name == "shakespeare" else f"`{corpus.name}`"
    if (corpus.name, corpus.tokenizer_name) == ("shakespeare", "byte"):
        ours = "Our models are tiny byte-level models trained for minutes on Shakespeare"
    else:
        ours = f"Our models were trained on {int(training['tokens'].max()):,} tokens of {data} each"
    rope_ratio = spread(rope_to_latent_ratio(runs).to_numpy())
    dynamics = through_training.section(runs, out, FLAGSHIP_MLA_ROPE)
    agreement = measures.section(runs, out, corpus, FLAGSHIP_MLA_ROPE)
    lines = [
        "# Head spectra under KV sharing: reproduction report",
        "",
        f"Preset `{preset}` ({config.n_layer} layers, {config.n_head} heads, d_model {config.d_model}, d_h "
        f"{config.head_dim}), **{n_seeds} seed(s)** per variant, {data}. Every number in the "
        f"'ours' columns was computed in this run{elapsed}; columns marked 'paper' quote arXiv 2601.11471 v3 at "
        "128M (6 heads), matched to our variants by role, not by position. Numbers are mean ± standard deviation "
        "over seeds; brackets give the range over layers of the seed means.",
        "",
        "![Eigenvalue spectra of head similarity matrices](figures/spectra_uncentered.png)",
        "",
        f"The flagship figure shows the uncentred spectra (eigenvalues sum to H, none is zero by construction), "
        f"mean over {n_seeds} seed(s){' with a min–max band' if n_seeds > 1 else ''}. For MLA it uses "
        f"`mla_rope = \"{FLAGSHIP_MLA_ROPE}\"`: the whole pre-softmax score form, as for every other family. "
        "MLA's decoupled RoPE query/key parts are part of every head's score, and the key part is shared by all "
        "heads, as in MQA; in these runs the RoPE part of a head's QK form is "
        f"{rope_ratio.format(2)} times its latent part in Frobenius norm (mean over layers and heads), so leaving "
        f"it out would describe MLA's heads by the {'smaller' if rope_ratio.mean > 1 else 'larger'} part of their "
        "scores only. The paper's Table 4 defines "
        "MLA's key as W_down W_up,h (latent only), so the tables show MLA both ways.",
        "",
        "## Effective rank (the paper's Table 3)",
        "",
        f"Mean over layers {layers[0]}-{layers[-1]} of the entropy effective rank of the QK circuit, % of H. The "
        "paper's GQA row was estimated by its authors, not measured.",
        "",
        _markdown(rank_table(tables, metrics).drop(columns="role"), 1),
        "",
        "## KV cache per token (the paper's Tables 7 and 8)",
        "",
        "The paper's MLA figure counts the latent d_c only; ours also counts the decoupled RoPE key d_R.",
        "",
        _markdown(cache_table(runs).drop(columns="role"), 1),
        "",
        "## Validation loss (the paper's Tables 1 and 8)",
        "",
        f"Ours: {unit} on the held-out 10% of {held_out}"
        + ("" if unit == loss_unit("byte") else f" (and bits per byte, at {corpus.bytes_per_token:.2f} bytes per token)")
        + ", with the paired difference to MHA ± the 95% "
        "t half-width. Paper: test cross-entropy per GPT-2 token on FineWeb-Edu at 128M, from its rank ablation "
        "(Table 8), which has both LRKV ranks. Only the differences to MHA are comparable.",
        "",
        _markdown(loss_table(metrics).drop(columns="role"), 3),
        "",
        "## How this compares",
        "",
        rule_text(n_seeds, len(sentences)),
        "",
        *[f"- {sentence}" for sentence in sentences],
        "",
        f"{ours}, the paper's are "
        "128M-parameter models trained on 100B FineWeb-Edu tokens: compare orderings and gaps, not absolute "
        f"values. Centred effective rank cannot exceed H − 1, i.e. {100 * (config.n_head - 1) / config.n_head:.1f}% "
        f"of H for {config.n_head} heads. Removing the dominant mean direction is expected to raise the centred rank "
        "of any method whose heads share keys, so a rise under centring is weak evidence of a learned mechanism.",
        "",
        *dynamics,
        *agreement,
        "## What A_h leaves out: QK-norm's 1/rms",
        "",
        "headlab's QK-norm divides each head's query and key by their own rms, a scale per head and per token "
        "that A_h treats as 1. The largest change over layers of the effective rank (points of % of H) from the "
        "seed-0 runs on validation text (`headlab.analysis.norm_scale_effect`): scaling each head's A_h by its "
        "median 1/rms moves nothing, since a constant per head cancels in the cosine similarity; the per-token "
        "part, measured on the similarity of the heads' scores over token pairs with and without 1/rms, is "
        "what the weight-space analysis leaves out.",
        "",
        _markdown(norm_effect, 2) if len(norm_effect) else "No variant with QK-norm in this study.",
        "",
        "## Figures",
        "",
        *[f"![{p.stem}](figures/{p.name})" for p in figure_paths],
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
