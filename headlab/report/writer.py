"""The report of a study, drawn from its tables alone (`headlab.study.table_files`): report.md beside
the figures, our numbers (mean ± sd over seeds) next to the paper's, and prose generated from the
statistics by a stated rule (`headlab.study.claims`).

    write_report(read_study_tables("runs/reproduce"), "runs/reproduce")   # what `headlab report` does
    write_report(read_study_tables("runs/reproduce"), "runs/reproduce", svg=True)   # `headlab report --svg`

Output (beside the study's tables, each file written atomically and listed in study.json, so a
folder headlab did not write, a file there it did not write, or a `figures` link is refused):
    figures/*.png             the flagship spectra figure and the supporting figures (with
                              svg=True, `--svg`, also figures/*.svg: vector, for print)
    report.md

MLA's decoupled RoPE parts: every run is analysed both ways (`mla_rope` column); the flagship
figure and every other figure use the study's flagship setting, and the tables show MLA both ways.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headlab.analysis.zero_forms import zero_form_note
from headlab.io import Manifest, writing
from headlab.report import plots
from headlab.report.paper_tables import cache_table, markdown_table, optimizer_lines, recipe_text
from headlab.schema import BEHAVIOUR, KINDS
from headlab.study.claims import MARGINS
from headlab.study.paper import SEED_HEADS
from headlab.study.table_files import MANIFEST, STUDY, StudyTables, loss_unit, with_recipe

FIGURES = ("spectra_uncentered", "spectra_centered", "cumulative_variance", "effective_rank_uncentered",
           "effective_rank_centered", "similarity_heatmaps", "loss_curves", "loss_vs_cache")
# What the README shows (`write_docs`): the flagship figure, then how head diversity runs with depth
# and what each variant's cache saving costs in loss.
DOCS_FIGURES = ("spectra_uncentered", "effective_rank_centered", "loss_vs_cache")
DOCS_MANIFEST, DOCS = "docs.json", "a docs folder"  # what `write_docs` wrote, so it overwrites nothing else
FIGURES_FOLDER = "figures"


# ---- figures ---------------------------------------------------------------------------------------

def draw_figures(tables: StudyTables, manifest: Manifest, folder: str | None, names: tuple[str, ...] = FIGURES,
                 svg: bool = False) -> list[Path]:
    """The figures `names` of the report's main part (default: all), at the flagship `mla_rope`, as
    PNG (and with `svg` SVG) in subfolder `folder` (None: the top) of `manifest`'s folder; returns
    the PNG paths."""
    tables = with_recipe(tables)  # every figure's title names the recipe
    flagship = tables.meta["flagship_mla_rope"]
    chosen = {name: tables[name][tables[name]["mla_rope"] == flagship] for name in ("spectra", "summary", "similarity")}
    spectra, summary, similarity = chosen["spectra"], chosen["summary"], chosen["similarity"]
    init, init_summary = (None if table is None else table[table["mla_rope"] == flagship]
                          for table in (init_table(tables, "init_spectra"), init_table(tables, "init_summary")))
    training = tables["training"]
    colours = plots.table_palette(summary)
    shown = list(plots.layer_roles(summary["layer"]).values())
    middle = shown[len(shown) // 2]  # the middle layer, or the late one of a 2-layer model
    final = tables["final_losses"]
    # each drawn when its turn to be saved comes: `write_docs` saves three, and a write refused
    # midway (a file headlab did not write where a figure goes) stops before drawing the rest
    figures = {
        "spectra_uncentered": lambda: plots.spectra_figure(spectra, kind="uncentered", palette=colours, init=init,
                                                           seed_figure=True),
        "spectra_centered": lambda: plots.spectra_figure(spectra, kind="centered", palette=colours, init=init),
        "cumulative_variance": lambda: plots.cumulative_variance_figure(spectra, kind="centered", palette=colours),
        **{f"effective_rank_{kind}": lambda kind=kind: plots.effective_rank_figure(
            summary, kind=kind, palette=colours, init=init_summary, paper=True) for kind in KINDS},
        "similarity_heatmaps": lambda: plots.similarity_heatmaps(
            similarity[similarity["seed"] == similarity["seed"].min()].drop(columns="seed"), layer=middle,
            palette=colours),
        "loss_curves": lambda: plots.loss_curves_figure(training, palette=colours),
        "loss_vs_cache": lambda: plots.loss_vs_cache_figure(
            final[["model", "seed", "kv_cache_pct", "val_loss", "loss_unit", "recipe"]], palette=colours),
    }
    return [plots.save_figure(figures[name](), manifest, figure_name(folder, name), svg=svg) for name in names]


def figure_name(folder: str | None, name: str) -> str:
    return name if folder is None else f"{folder}/{name}"


def figure_files(folder: str | None, names: tuple[str, ...], svg: bool = False) -> list[str]:
    """The files `draw_figures` writes for `names` into subfolder `folder` (with `svg`, SVGs too)."""
    return [file for name in names for file in plots.figure_files(figure_name(folder, name), svg=svg)]


def write_docs(tables: StudyTables, out: str | Path, svg: bool = False) -> Path:
    """The README's opening, from a study's tables: `DOCS_FIGURES` (PNG, and with `svg` SVG) and headline.md,
    the loss and effective-rank tables (mean ± sd over seeds; differences to MHA paired by seed
    ± the 95% t half-width) and the verdicts of the report's rule with their margins. Returns
    headline.md's path. (How long a study took is not a table's: tables are redrawn from reused
    runs in minutes, so the README states the measured time.)"""
    out = Path(out)
    with writing(out, DOCS_MANIFEST, DOCS, "docs writer") as manifest:
        manifest.check_writable([*figure_files(None, DOCS_FIGURES, svg), "headline.md"])  # refused before drawing
        draw_figures(tables, manifest, None, DOCS_FIGURES, svg=svg)
        manifest.write_bytes("headline.md", "\n".join(headline_lines(tables)).encode())
    return out / "headline.md"


def headline_lines(tables: StudyTables) -> list[str]:
    meta = tables.meta
    return [f"`{meta['preset']}`: {meta['n_layer']} layers x {meta['n_head']} heads, {meta['steps']} steps, "
            f"{len(meta['seeds'])} seeds, {meta['corpus_description']}. {recipe_text(meta)}", "",
            markdown_table(tables["loss_table"], 3), "", markdown_table(tables["rank_table"], 1), "",
            *said(tables, "margins"), "", *[f"- {s}" for s in said(tables, "comparison", without_change=True)], "",
            *seed_distance_lines(tables)]


def said(tables: StudyTables, section: str, without_change: bool = False) -> list[str]:
    """The sentences of one section of the study's claims (`headlab.study.conclusions`); with
    `without_change`, the comparison's without their change since half-way (the headline's)."""
    rows = tables["claims"][tables["claims"]["section"] == section]
    return [sentence if not (without_change and isinstance(change, str) and change) else
            sentence.replace(f" [{change}]", "") for sentence, change in zip(rows["sentence"], rows["change"])]


def quantity(tables: StudyTables, name: str) -> str | None:
    """A number the prose quotes, as the study wrote it (`quantities`), None where it has none."""
    rows = tables["quantities"][tables["quantities"]["name"] == name]
    return rows["text"].iloc[0] if len(rows) else None


# ---- baselines: random initialisation and the seed figure -------------------------------------------

def init_table(tables: StudyTables, name: str) -> pd.DataFrame | None:
    """The random-initialisation table `name` (init_spectra, init_summary) of a study, None for
    tables written before studies made it."""
    return tables.tables.get(name)


def seed_distance_lines(tables: StudyTables) -> list[str]:
    """The distance to the seed figure: what it compares, then its table (or why there is none)."""
    if "distance_table" not in tables.tables:
        return ["No random-initialisation baseline in these tables (written before studies made init_spectra): "
                "write them again (`headlab reproduce`) to compare with the seed figure.", ""]
    n_head, rows = tables.meta["n_head"], tables["distance_table"].drop(columns="role")
    shape = ""
    if n_head != SEED_HEADS:  # d₁ is NaN: spectra of different lengths
        shape = f" Our {n_head} heads against the paper's {SEED_HEADS}: d₁ compares spectra of one length only."
        rows = rows.drop(columns=[column for column in rows if column.startswith("d₁")])
    return [
        "How far our flagship lies from the seed figure (the paper's Fig. 11 at 128M, uncentered, QK): per method and "
        "panel, the first eigenvalue λ₁ (of H) and d₁ = Σᵢ |λᵢ/Σλ − sᵢ/Σs|, the L1 distance between our spectrum "
        "and the seed's, each divided by its sum (0: the same shape, at most 2); mean ± sd over seeds, for the "
        "trained runs and for the same runs at step 0 (random initialisation). Our early, middle and late layers "
        "stand for the paper's L = 0, 6 and 11 of 12 by relative depth. The seed's values were read off the figure "
        "by eye (about ±0.1; λ₃…λ₅, which its description leaves out, interpolated between λ₂ and λ₆: "
        "`headlab.study.paper`)." + shape,
        "",
        markdown_table(rows, 2),
        "",
    ]


# ---- sections ----------------------------------------------------------------------------------------

def training_section(tables: StudyTables, manifest: Manifest, svg: bool = False) -> list[str]:
    """'Effective rank through training': two figures and the claims of `training_claims`."""
    snapshots = tables["snapshot_summary"]
    summary = snapshots[snapshots["mla_rope"] == tables.meta["flagship_mla_rope"]].drop(columns="mla_rope")
    colours = plots.table_palette(summary)
    figures = [plots.save_figure(plots.rank_through_training_figure(summary, kind=kind, palette=colours),
                                 manifest, f"{FIGURES_FOLDER}/effective_rank_through_training_{kind}", svg=svg)
               for kind in KINDS]
    steps = sorted(tables["step_metrics"]["step"].unique())
    return [
        "## Effective rank through training",
        "",
        f"QK effective rank at the {len(steps)} snapshot steps every run has ({', '.join(map(str, steps))}; "
        "log-spaced early, then evenly spaced, the last being the final checkpoint), early, middle and late layer, "
        f"mean over seeds with a min–max band; MLA at `mla_rope = \"{tables.meta['flagship_mla_rope']}\"`. The "
        "statements use the layer mean and the rule above (paired by seed, an ordering only where the 95% "
        "t-interval excludes zero).",
        "",
        *[f"![{path.stem}](figures/{path.name})" for path in figures],
        "",
        *[f"- {s}" for s in said(tables, "training")],
        "",
    ]


def factors_section(tables: StudyTables, manifest: Manifest, svg: bool = False) -> list[str]:
    """"LRKV's factors": the residual-to-shared norm ratio (at the end and through training), the
    principal angles between the shared and residual subspaces, and MHA's rank-r bound; nothing
    for a study without LRKV (or with tables older than these diagnostics)."""
    if "lrkv_factors" not in tables.tables or tables["lrkv_factors"].empty:
        return []
    colours = plots.table_palette(tables["summary"])
    figure = plots.save_figure(plots.factor_norm_figure(tables["factor_training"], palette=colours), manifest,
                               f"{FIGURES_FOLDER}/lrkv_norm_ratio_through_training", svg=svg)
    lines = [
        "## LRKV's factors",
        "",
        "Each LRKV head's key (value) projection is W_shared + U_h B_hᵀ. Norm ratio: ‖U_h B_hᵀ‖_F / ‖W_shared‖_F, "
        "mean over layers and heads (the paper's Fig. 8 shows these norms; it gives no ratio). Principal angles: "
        "between the column spaces of W_shared and U_h B_hᵀ in the residual stream, mean over the r angles, layers "
        "and heads; 0° means a residual only re-weights what the shared projection reads, and 'random subspace' is "
        "the mean angle of a random subspace of the same shape (the paper says it computed these angles and "
        "reports none). Mean ± sd over seeds (`headlab.analysis.lrkv`).",
        "",
        markdown_table(tables["factor_table"], 3),
        "",
        f"![lrkv norm ratio](figures/{figure.name})",
        "",
    ]
    if "rank_bound_table" not in tables.tables:
        return lines
    return lines + [
        "### The best a rank-r residual could do",
        "",
        "Standard MHA's key and value projections W_h, with their mean W̄ over heads: the truncated SVD of "
        "W_h − W̄ is the best rank-r residual (Eckart–Young), so MHA rebuilt as W̄ + [W_h − W̄]_r is what an LRKV "
        "of rank r sharing W_shared = W̄ could at best express of these MHA heads. MHA itself: "
        f"{quantity(tables, 'mha_uncentered')} % of H (uncentered); 'trained LRKV − MHA rebuilt': the "
        f"paired difference ± 95% half-width (points), an ordering beyond the ±{MARGINS['uncentered']:g}-point "
        "margin unless marked within it or undecided.",
        "",
        markdown_table(tables["rank_bound_table"], 1),
        "",
    ]


def measures_section(tables: StudyTables, manifest: Manifest, svg: bool = False) -> list[str]:
    """'Do the measures agree?': the three views' ranks, their agreement and `measure_claims`."""
    summary, agreement = tables["measures"], tables["measure_agreement"]
    colours = plots.table_palette(summary)
    labelled, init = with_recipe(tables), init_table(tables, "init_summary")
    init = None if init is None else init[init["mla_rope"] == tables.meta["flagship_mla_rope"]]
    for kind in KINDS:
        plots.save_figure(plots.measures_figure(labelled["measures"], kind=kind, palette=colours, init=init,
                                                paper=True), manifest, f"{FIGURES_FOLDER}/measures_{kind}", svg=svg)
    clipped = summary.loc[summary["measure"] == BEHAVIOUR, "negative_mass"]
    shown = agreement.assign(pair=agreement["measure_a"] + " vs " + agreement["measure_b"])[
        ["model", "kind", "pair", "n_points", "spearman"]]
    meta = tables.meta
    return [
        "## Do the measures agree?",
        "",
        "Each layer's QK effective rank (% of H) under three views: the weights (Frobenius, the paper's), the "
        "data-aware weights (inner product weighted by the second moments Σ of each layer's inputs on "
        f"{meta['moment_tokens']:,} validation tokens; estimating Σ took {meta['moment_seconds']:.1f} s for all "
        f"{meta['n_runs']} runs), and behaviour (1 − mean Jensen–Shannon distance of the heads' attention maps on "
        "validation windows). The behaviour similarity is not a Gram matrix: its centered form is positive "
        "semi-definite (the JS distance is Hilbertian), its uncentered form need not be; negative eigenvalues are "
        f"clipped to 0, which dropped at most {100 * clipped.max():.2f}% of the absolute eigenvalue mass "
        "(`negative_mass` in measures.csv). Mean ± sd over seeds of the layer mean:",
        "",
        markdown_table(tables["measure_table"], 1),
        "",
        "![measures](figures/measures_uncentered.png)",
        "",
        "![measures](figures/measures_centered.png)",
        "",
        "Spearman rank correlation between measures across layers and seeds (attention maps paired with the QK "
        "circuit, whose softmax they are):",
        "",
        markdown_table(shown, 2),
        "",
        "Where the weight-space conclusion holds up: for each variant whose weight-space effective rank differs "
        f"from Standard MHA's by an ordering (beyond the ±{MARGINS['uncentered']:g}-point margin), the same paired "
        "comparison under the other two views.",
        "",
        *[f"- {s}" for s in said(tables, "measures")],
        "",
    ]


# ---- report.md ------------------------------------------------------------------------------------

def write_report(tables: StudyTables, out: str | Path, svg: bool = False) -> Path:
    """Draw the figures (PNG, and with `svg` SVG too) and write report.md into `out` from a study's
    tables (nothing is trained or analysed here); returns the report's path."""
    with writing(out, MANIFEST, STUDY, "report writer") as manifest:
        manifest.check_writable([*figure_files(FIGURES_FOLDER, FIGURES, svg), "report.md"])  # refused before drawing
        manifest.write_bytes("report.md", "\n".join(report_lines(tables, manifest, svg)).encode())
    return Path(out) / "report.md"



def mla_rope_sentence(flagship: str, rope_ratio: str, rope_ratio_mean: float) -> str:
    """What the flagship figure draws for MLA, and how large the RoPE part it includes is (`rope_ratio`:
    the spread over seeds of ‖A_h^RoPE‖_F / ‖A_h^latent‖_F as the study wrote it, its mean)."""
    return (f" For MLA it uses `mla_rope = \"{flagship}\"`: the whole pre-softmax score form, as for every other "
            "family. MLA's decoupled RoPE query/key parts are part of every head's score, and the key part is shared "
            "by all heads, as in MQA; in these runs the RoPE part of a head's QK form is "
            f"{rope_ratio} times its latent part in Frobenius norm (mean over layers and heads), so leaving "
            f"it out would describe MLA's heads by the {'smaller' if rope_ratio_mean > 1 else 'larger'} part of "
            "their scores only. The paper's Table 4 defines MLA's key as W_down W_up,h (latent only), so the tables "
            "show MLA both ways.")

def report_lines(tables: StudyTables, manifest: Manifest, svg: bool = False) -> list[str]:
    """report.md's lines; its figures (with `svg`, SVGs too) are written into `manifest`'s folder on the way."""
    figure_paths = draw_figures(tables, manifest, FIGURES_FOLDER, svg=svg)
    meta, summary = tables.meta, tables["summary"]
    sentences = said(tables, "comparison")
    n_seeds = tables["metrics"]["seed"].nunique()
    unit, flagship = meta["loss_unit"], meta["flagship_mla_rope"]
    layers = sorted(summary["layer"].unique())
    elapsed = "" if meta["minutes"] is None else f" ({meta['minutes']:.1f} min)"
    held_out = "Shakespeare" if meta["corpus"] == "shakespeare" else f"`{meta['corpus']}`"
    if (meta["corpus"], meta["tokenizer"]) == ("shakespeare", "byte"):
        ours = "Our models are tiny byte-level models trained for minutes on Shakespeare"
    else:
        ours = (f"Our models were trained on {int(tables['training']['tokens'].max()):,} tokens of "
                f"{meta['corpus_description']} each")
    rope_ratio = tables["quantities"].set_index("name").loc[["rope_to_latent"]] \
        if "rope_to_latent" in set(tables["quantities"]["name"]) else None
    norm_effect = tables["norm_effect"]
    n_head = meta["n_head"]
    undefined = zero_form_note(tables["similarity"])  # dead heads and layers without a circuit, or None
    lines = [
        "# Head spectra under KV sharing: reproduction report",
        "",
        f"Preset `{meta['preset']}` ({meta['n_layer']} layers, {n_head} heads, d_model {meta['d_model']}, d_h "
        f"{meta['head_dim']}), **{n_seeds} seed(s)** per variant, {meta['corpus_description']}. Every number in the "
        f"'ours' columns was computed in this study{elapsed} and is read from its tables (`headlab report` redraws "
        "this page from them); columns marked 'paper' quote arXiv 2601.11471 v3 at 128M (6 heads), matched to our "
        "variants by role, not by position. Numbers are mean ± standard deviation over seeds; brackets give the "
        "range over layers of the seed means.",
        "",
        recipe_text(meta),
        "",
        *optimizer_lines(meta),
        "![Eigenvalue spectra of head similarity matrices](figures/spectra_uncentered.png)",
        "",
        f"The flagship figure shows the uncentered spectra (eigenvalues sum to H, none is zero by construction), "
        f"mean over {n_seeds} seed(s){' with a min–max band' if n_seeds > 1 else ''}." + (
            mla_rope_sentence(flagship, rope_ratio["text"].iloc[0], float(rope_ratio["value"].iloc[0]))
            if rope_ratio is not None else "") + (
            "" if init_table(tables, "init_spectra") is None else
            " Dashed: the same runs at step 0, before any training (random initialisation). Bars at index 1: the "
            "seed figure's first eigenvalue per method (the paper's Fig. 11 at 128M, read off), its layers 0, 6 and "
            "11 of 12 matched to our early, middle and late layers by relative depth."),
        "",
        "## Distance to the seed figure",
        "",
        *seed_distance_lines(tables),
        "## Effective rank (the paper's Table 3)",
        "",
        f"Mean over layers {layers[0]}-{layers[-1]} of the entropy effective rank of the QK circuit, % of H. The "
        "paper's GQA row was estimated by its authors, not measured."
        + ("" if init_table(tables, "init_summary") is None else
           " 'random init': the same runs at step 0, before any training (mean ± sd over seeds)."),
        "",
        markdown_table(tables["rank_table"].drop(columns="role"), 1),
        "",
        *([undefined, ""] if undefined else []),
        "## KV cache per token (the paper's Tables 7 and 8)",
        "",
        "The paper's MLA figure counts the latent d_c only; ours also counts the decoupled RoPE key d_R.",
        "",
        markdown_table(cache_table(tables["cache"]).drop(columns="role"), 1),
        "",
        "## Validation loss (the paper's Tables 1 and 8)",
        "",
        f"Ours: {unit} on the held-out 10% of {held_out}"
        + ("" if unit == loss_unit("byte")
           else f" (and bits per byte, at {meta['bytes_per_token']:.2f} bytes per token)")
        + ", with the paired difference to MHA ± the 95% "
        "t half-width. Paper: test cross-entropy per GPT-2 token on FineWeb-Edu at 128M, from its rank ablation "
        "(Table 8), which has both LRKV ranks. Only the differences to MHA are comparable.",
        "",
        markdown_table(tables["loss_table"].drop(columns="role"), 3),
        "",
        "## How this compares",
        "",
        *said(tables, "rule"),
        "",
        *[f"- {s}" for s in sentences],
        "",
        f"{ours}, the paper's are "
        "128M-parameter models trained on 100B FineWeb-Edu tokens: compare orderings and gaps, not absolute "
        f"values. Centered effective rank cannot exceed H − 1, i.e. {100 * (n_head - 1) / n_head:.1f}% "
        f"of H for {n_head} heads. Removing the dominant mean direction is expected to raise the centered rank "
        "of any method whose heads share keys, so a rise under centering is weak evidence of a learned mechanism.",
        "",
        *training_section(tables, manifest, svg),
        *factors_section(tables, manifest, svg),
        *measures_section(tables, manifest, svg),
        "## What A_h leaves out: QK-norm's 1/rms",
        "",
        "headlab's QK-norm divides each head's query and key by their own rms, a scale per head and per token "
        "that A_h treats as 1. The largest change over layers of the effective rank (points of % of H) from the "
        "seed-0 runs on validation text (`headlab.analysis.qk_norm.norm_scale_effect`): scaling each head's A_h "
        "by its median 1/rms moves nothing, since a constant per head cancels in the cosine similarity; the "
        "per-token part, measured on the similarity of the heads' scores over token pairs with and without 1/rms, "
        "is what the weight-space analysis leaves out.",
        "",
        markdown_table(norm_effect, 2) if len(norm_effect) else "No variant with QK-norm in this study.",
        "",
        "## Figures",
        "",
        *[f"![{p.stem}](figures/{p.name})" for p in figure_paths],
        "",
    ]
    return lines
