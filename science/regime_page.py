"""The regime study's page (`science/regime_study.md`), from the per-layer rows of every finished run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from regime_axes import (
    ADAMW_POINT,
    ADAMW_QK_POINT,
    AXES,
    DEEP_COMMAND,
    DEEP_POINT,
    DEFAULT_POINT,
    PAPER_AVERAGED_UPDATES,
    PAPER_TOKENS_AVERAGED,
    PROBE_COMMANDS,
    PROBED,
    ROLES,
    SEED_FIGURE,
    SEED_MHA_EARLY,
    SWEEP,
    THROUGH_TRAINING,
    Axis,
    panels,
)
from regime_trends import draw_figure, extended_trends, fitted_trend, largest_move, trend_lines

from headlab.report.paper_tables import markdown_table
from headlab.study.stats import paired_difference, spread


def cell(values) -> str:
    return spread(values).format(2) if len(values) else "–"


def axis_rows(axis: Axis, finals: pd.DataFrame) -> list[dict]:
    rows = []
    for folder, value in axis.points.items():
        for role in ROLES.values():
            runs = finals[(finals["point"] == folder) & (finals["role"] == role)]
            if runs.empty:
                continue
            n_layer = int(runs["n_layer"].iloc[0])
            at = {name: runs[runs["layer"] == layer] for name, layer in panels(n_layer).items()}
            per_seed = runs.groupby("seed")
            rows.append({
                "setting": value, **({axis.x.replace("_", " "): f"{runs[axis.x].iloc[0]:,.4g}"} if axis.x else {}),
                "variant": role, "seeds": runs["seed"].nunique(),
                **{f"λ₁ {name} (L={layer})": cell(at[name]["lambda1"].to_numpy())
                   for name, layer in panels(n_layer).items()},
                "λ₁ early at init": cell(at["early"]["lambda1_init"].to_numpy()),
                "ER % of H": cell(per_seed["er_pct"].mean().to_numpy()),
                "ER % at init": cell(per_seed["er_pct_init"].mean().to_numpy()),
                "data-aware λ₁ early": cell(at["early"]["lambda1_data"].to_numpy()),
                "val bpb": cell(per_seed["val_bpb"].first().to_numpy()),
            })
    return rows


def separation(finals: pd.DataFrame, folder: str, layer: int) -> str:
    """MQA − MHA λ₁ at `layer`, paired by seed (the seeds both have), with its 95% interval."""
    at = finals[(finals["point"] == folder) & (finals["layer"] == layer)].pivot(
        index="seed", columns="role", values="lambda1").dropna()
    if not {"MHA", "MQA"} <= set(at.columns) or len(at) < 2:
        return "–"
    d = paired_difference(at["MQA"], at["MHA"])
    return d.format(2) + ("" if d.decided else " (noise)")


def mean_at(finals: pd.DataFrame, folder: str, role: str = "MHA", layer: int = 0, column: str = "lambda1") -> float:
    return float(finals[(finals["point"] == folder) & (finals["role"] == role) & (finals["layer"] == layer)][column]
                 .mean())


def first_screen(finals: pd.DataFrame, sentence: str) -> str:
    """The two sentences proposed for the README's first screen, every number from the tables."""
    default, init = mean_at(finals, DEFAULT_POINT), mean_at(finals, DEFAULT_POINT, column="lambda1_init")
    adamw_qk, adamw = mean_at(finals, ADAMW_QK_POINT), mean_at(finals, ADAMW_POINT)
    bpb = {f: mean_at(finals, f, column="val_bpb") for f in (DEFAULT_POINT, ADAMW_POINT, ADAMW_QK_POINT)}
    muon_points = set(finals[finals["qk_by_muon"]]["point"])
    under_muon = {f: mean_at(finals, f) for axis in AXES for f in axis.points if f in muon_points}
    under_muon = {f: v for f, v in under_muon.items() if not math.isnan(v)}
    top = max(under_muon, key=under_muon.get)
    top_axis = next(a for a in AXES if top in a.points)
    tried = ", ".join(a.name for a in AXES if any(f in under_muon and f != DEFAULT_POINT for f in a.points))
    muon_clause = (f"under Muon none of the other settings we could train on two cores ({tried}) took it above "
                   f"{under_muon[top]:.2f} (the highest: {top_axis.name}, {top_axis.points[top]})" if tried else
                   "no other setting could be trained on two cores in time")
    return (f"Our weights-view spectra are not the paper's Fig. 11: trained as `make demo` trains them, Standard "
            f"MHA's first eigenvalue at L = 0 is {default:.2f} ({init:.2f} at random initialisation; the seed figure "
            f"shows {SEED_MHA_EARLY:.1f}), so the heads' QK forms share almost no direction. The cause we found is "
            f"Muon on W_Q and W_K at our scale: with AdamW on those two matrices only (Muon elsewhere) it is "
            f"{adamw_qk:.2f} and with AdamW everywhere {adamw:.2f} (validation {bpb[ADAMW_QK_POINT]:.2f} and "
            f"{bpb[ADAMW_POINT]:.2f} bits per byte against Muon's {bpb[DEFAULT_POINT]:.2f}), while {muon_clause}; "
            f"{sentence}.{extended_trends(finals)}")


def page(finals: pd.DataFrame, throughs: pd.DataFrame, figure: Path, out: Path, root: Path) -> str:
    best, move = largest_move(finals)
    sentence = draw_figure(finals, figure)
    lines = ["# Regime study: when does the weights view get a dominant first eigenvalue? (issue 36)", "",
             "## Summary (the README's first screen quotes it)", "", first_screen(finals, sentence), "",
             f"The axis that moves Standard MHA's λ₁ at L = 0 most, by {move:.2f} between its points: "
             f"“{best.name.removesuffix(' by')}”.", "", *preset_check(finals),
             f"![first eigenvalue against the axis that moves it most]({figure.relative_to(out.parent)})", "",
             "## How these numbers were made", "",
             f"Every point is a `cpu-small` study (4 layers of 6 heads, d_h 32, d_model 128, bytes of Shakespeare) "
             f"that differs from the default point (`{DEFAULT_POINT}`: Muon + AdamW split, 16 x 64 tokens a step, "
             "900 steps, weight decay 0.1) in one setting. ROOT is the folder the sweeps were written to "
             f"(here `{root}`). The optimizer axis (and with it the default point) ran from main at 91a3e0b; the "
             "W_Q, W_K and batch axes and cpu-deep from 7cb5876, which adds TrainConfig.muon_qk; weight decay, "
             "length 0.25 and d_h 16 from f6d60f2, the other d_h, context, d_model, vocabulary and probed runs "
             "from 90e152d, the architecture from the branch that adds ModelConfig.arch (each `git archive`d, "
             "run with PYTHONPATH on the copy; none changes a default). The default point and the optimizer axis:", "",
             f"    {SWEEP} --out ROOT/optimizer --set optimizer=adamw,muon", "",
             "This page (it trains nothing, reads every finished run):", "",
             f"    python science/regime_study.py page --root ROOT --out {out}", "",
             "λ₁: the first eigenvalue of the uncentred cosine similarity of the heads' QK forms A_h = W^Q_h W^K_hᵀ "
             "(the paper's Eq. 11; H = 6, so λ₁ runs from 1, no shared direction, to 6, one form for all heads). "
             "Each cell is mean ± sd over seeds. 'at init' is the run's step-0 snapshot (its initial draw). ER: "
             "the entropy effective rank of the same spectrum, % of H, mean over layers. 'data-aware': λ₁ of the "
             "same forms weighed by the second moments of each layer's inputs on 32 validation windows. val bpb: "
             "validation bits per byte (comparable across tokenizers).", ""]
    for axis in AXES:
        trained, untrained = axis_commands(axis, finals)
        lines += [f"## {axis.name}", "", *(f"    {c}" for c in trained), ""]
        if axis.note:
            lines += [axis.note + ".", ""]
        if untrained:
            lines += [f"Not trained (no rows below): {'; '.join(f'`{c}`' for c in untrained)}.", ""]
        rows = axis_rows(axis, finals)
        if not trained:
            lines += ["Not trained in time: the shared CPU ran a Muon run in 300–1,000 s, so this axis has only the "
                      "default point (in the optimizer table).", ""]
            continue
        lines += [markdown_table(pd.DataFrame(rows), 2), "", *trend_lines(axis, finals)]
        separations = [{"setting": value, **{f"MQA − MHA, λ₁ {name} (L={layer})": separation(finals, folder, layer)
                                             for name, layer in panels(int(finals["n_layer"].iloc[0])).items()}}
                       for folder, value in axis.points.items() if separation(finals, folder, 0) != "–"]
        if separations:
            lines += ["Separation of the methods in the weights view: MQA − MHA, paired by seed, 95% interval "
                      "('(noise)' where it includes 0):", "", markdown_table(pd.DataFrame(separations), 2), ""]
    lines += deep_panels(finals)
    lines += mechanism(finals, throughs, root)
    return "\n".join(lines)


def axis_commands(axis: Axis, finals: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The commands of `axis` whose point has finished runs (shown above its rows), and the others."""
    done = set(finals["point"])
    return ([c for point, c in axis.commands.items() if point in done],
            [c for point, c in axis.commands.items() if point not in done])


def correlation_words(rho: float, closes: str) -> str:
    """What the sign of a Spearman correlation between λ₁ and the gap says: `closes` is where or as."""
    return (f"negative: the gap closes {closes} λ₁ grows" if rho < 0 else
            f"positive: the gap opens {closes} λ₁ grows" if rho > 0 else "zero: no monotone relation")


def deep_panels(finals: pd.DataFrame) -> list[str]:
    """The paper's panels L = 0 / 6 / 11 on cpu-deep with AdamW on W_Q, W_K, beside the seed figure."""
    runs = finals[finals["point"] == DEEP_POINT]
    lines = ["## The paper's panels: cpu-deep (12 layers) with AdamW on W_Q, W_K", ""]
    if runs.empty:
        return [*lines, f"    {DEEP_COMMAND.format(seeds=3)}", "", "No finished runs yet.", ""]
    lines += [f"    {DEEP_COMMAND.format(seeds=runs['seed'].nunique())}", ""]
    rows = []
    for role, seed_values in SEED_FIGURE.items():
        at = runs[runs["role"] == role]
        if at.empty:
            continue
        for name, layer in panels(int(at["n_layer"].iloc[0])).items():
            here = at[at["layer"] == layer]
            rows.append({"variant": role, "panel": f"{name} (L={layer})", "seeds": len(here),
                         "λ₁": cell(here["lambda1"].to_numpy()), "λ₁ at init": cell(here["lambda1_init"].to_numpy()),
                         "seed figure λ₁": f"{seed_values[list(panels(12)).index(name)]:.1f}",
                         "val bpb": cell(here["val_bpb"].to_numpy())})
    return [*lines, "The default recipe (Muon on W_Q, W_K too) at this depth is drawn in "
            "science/figures/cpu_deep_muon_spectra_uncentered.png (science/scale_study.md).",
            "", markdown_table(pd.DataFrame(rows), 2), ""]


def preset_check(finals: pd.DataFrame) -> list[str]:
    """Issue 36's test of a regime for a preset, on the AdamW-on-W_Q, W_K point (preset cpu-small-adamw-qk)."""
    mha = finals[(finals["point"] == ADAMW_QK_POINT) & (finals["role"] == "MHA") & (finals["layer"] == 0)]
    if mha.empty:
        return []
    n_layer = int(mha["n_layer"].iloc[0])
    deep = finals[(finals["point"] == DEEP_POINT) & (finals["role"] == "MHA") & (finals["layer"] == 0)]
    separations = ", ".join(f"L = {layer}: {separation(finals, ADAMW_QK_POINT, layer)}"
                            for layer in panels(n_layer).values())
    return ["## The preset: cpu-small-adamw-qk", "",
            "Issue 36 asks of a regime for a preset: Standard MHA's λ₁ at L = 0 ≥ 2, the methods separated beyond "
            "seed noise in the weights view, 3 seeds of the six variants in 30 minutes on two cores. cpu-small with "
            f"AdamW on W_Q, W_K (everything else as `make demo`): λ₁ = {cell(mha['lambda1'].to_numpy())} "
            f"({mha['seed'].nunique()} seeds); MQA − MHA, paired by seed: {separations}; validation "
            f"{mean_at(finals, ADAMW_QK_POINT, column='val_bpb'):.2f} bits per byte against "
            f"{mean_at(finals, DEFAULT_POINT, column='val_bpb'):.2f} under `make demo`'s recipe. Its cost is "
            "cpu-small's (two of a block's six matrices leave Muon for AdamW, which is cheaper); not timed here, "
            "the machine being shared. Measured here for MHA and MQA; all six variants, 3 seeds each, are "
            "`headlab reproduce --preset cpu-small-adamw-qk` (docs/regime/headline.md; their query and key "
            "matrices go to AdamW as well, MLA's joint key/value latents stay with Muon). At the paper's depth "
            "and panels (cpu-deep, below) the same change gives Standard MHA "
            f"λ₁ = {cell(deep['lambda1'].to_numpy())} at L = 0 ({deep['seed'].nunique()} seed(s)).", ""]


def gap_sentence(finals: pd.DataFrame) -> str:
    """What training W_Q, W_K by AdamW instead of Muon (the rest alike) does to each view at L = 0."""
    parts = []
    for role in ROLES.values():
        views = {f: (mean_at(finals, f, role), mean_at(finals, f, role, column="lambda1_data"))
                 for f in (DEFAULT_POINT, ADAMW_QK_POINT)}
        (w0, d0), (w1, d1) = views[DEFAULT_POINT], views[ADAMW_QK_POINT]
        parts.append(f"{role}: weights {w0:.2f} → {w1:.2f}, data-aware {d0:.2f} → {d1:.2f}, gap {d0 - w0:.2f} → "
                     f"{d1 - w1:.2f}")
    return ("With the inputs' statistics held (Muon on everything but W_Q, W_K in both), moving W_Q, W_K from Muon to "
            "AdamW (L = 0, means over seeds): " + "; ".join(parts) + ". The data-aware view hardly moves: it is set "
            "by how anisotropic the inputs are (AdamW everywhere, whose embedding learns at 3e-3 rather than 0.2, "
            "gives lower data-aware values), while the weights view is set by the optimizer of W_Q, W_K; the gap "
            "closes where λ₁ grows, because the weights take up the inputs' shared direction.")


def averaged_updates_default(finals: pd.DataFrame) -> float:
    return float(finals[finals["point"] == DEFAULT_POINT]["averaged_updates"].iloc[0])


def mechanism(finals: pd.DataFrame, throughs: pd.DataFrame, root: Path) -> list[str]:
    """Does the gap between the weights view and the data-aware view close where λ₁ grows?"""
    early = finals[finals["layer"] == 0]
    gap = early["lambda1_data"] - early["lambda1"]
    rho = float(np.corrcoef(early["lambda1"].rank(), gap.rank())[0, 1])
    points = early.assign(gap=gap).groupby(["point", "role"]).agg(
        weights=("lambda1", "mean"), data_aware=("lambda1_data", "mean"), gap=("gap", "mean")).reset_index()
    rows = []
    for (folder, role), runs in throughs[throughs["layer"] == 0].groupby(["point", "role"]):
        by_step = runs.groupby("step")["lambda1"].mean()
        last = by_step.index.max()
        rows.append({"point": folder, "role": role, "steps": last, **{
            f"{fraction:.0%} of training": by_step.iloc[int(np.abs(by_step.index - fraction * last).argmin())]
            for fraction in THROUGH_TRAINING}})
    steps = pd.DataFrame(rows)
    muon_qk = early[(early["role"] == "MHA") & early["qk_by_muon"] & (early["n_layer"] == early["n_layer"].min())]
    pooled = fitted_trend("every point whose W_Q, W_K Muon trains", "tokens_averaged", muon_qk)
    averaged = muon_qk.groupby("point").agg(**{"averaged updates": ("averaged_updates", "first"),
                                               "tokens averaged": ("tokens_averaged", "first"),
                                               "λ₁ (MHA, L = 0)": ("lambda1", "mean")}).reset_index()
    averaged = averaged.sort_values("tokens averaged").assign(**{
        "averaged updates": lambda t: t["averaged updates"].map("{:,.0f}".format),
        "tokens averaged": lambda t: t["tokens averaged"].map("{:.2e}".format)})
    extension = "too few points for a fit"
    if pooled is not None:
        centre, half = pooled.predict(PAPER_TOKENS_AVERAGED)
        extension = (f"λ₁ = {pooled.intercept:.2f} + {pooled.slope:.3f}·log₂(tokens averaged), slope ± "
                     f"{pooled.slope_se:.3f} (se), {pooled.n} runs; " +
                     (f"at the paper's ≈{PAPER_TOKENS_AVERAGED:.1e} it predicts {centre:.2f} ± {half:.2f} (95% "
                      "prediction interval)" if pooled.clear else "the slope is under twice its standard error: "
                      "no trend to extend"))
    ours = averaged_updates_default(finals)
    return ["## Mechanism: the weights view against the data-aware view", "",
            gap_sentence(finals), "",
            "A hypothesis for why Muon keeps the forms apart and the paper's run would not (ours; the trend points "
            "below are its only test): W_Q and W_K at the end of training are a decayed sum of the updates, "
            "W = Σ c_t u_t. A direction that every update shares "
            "(the inputs' dominant direction, which the data-aware view shows) adds up as Σ c_t; gradient noise, "
            "which Muon writes in at full size, as √Σ c_t². So the shared part stands out of W as "
            "√(averaged updates x tokens per step), with averaged updates = (Σ c_t)² / Σ c_t². Ours: "
            f"{ours:.0f} updates of 1,024 tokens; the paper's (decay 0.1 at lr 0.02 over ≈190k steps of 524,288 "
            f"tokens): ≈{PAPER_AVERAGED_UPDATES:.0f} updates, ≈{PAPER_TOKENS_AVERAGED:.1e} tokens, "
            f"{PAPER_TOKENS_AVERAGED / 1024 / ours:.0f}x ours. Standard MHA's λ₁ at L = 0 against tokens averaged, "
            "every point whose W_Q, W_K Muon trains:", "",
            markdown_table(averaged, 2), "", f"Pooled fit: {extension}.", "",
            "At every point (L = 0, mean over seeds): λ₁ of the weights, λ₁ of the same forms on their inputs, "
            "and the gap between them. Spearman correlation over all runs between λ₁ (weights) and the gap: "
            f"{rho:+.2f} ({len(early)} runs; {correlation_words(rho, 'where')}).", "",
            markdown_table(points.sort_values("weights"), 2), "",
            "Through training: λ₁ of the weights view at L = 0 at the snapshot nearest each fraction of the run, "
            "mean over seeds (from the snapshots, which keep the attention weights only):", "",
            markdown_table(steps, 2), "", *probed_through_training(root)]


def probed_through_training(root: Path) -> list[str]:
    """Both views through training at L = 0, from the `through` runs' probes (the whole model at each
    snapshot step), per setting: means over seeds at fractions of the run, and whether the gap closes
    as λ₁ grows (Spearman over every probed step and seed)."""
    frames = [pd.read_csv(table).assign(setting=name) for folder, name in PROBED.items()
              for table in sorted((root / folder / "through").glob("*.csv"))]
    lines = ["Both views through training (MHA, L = 0): the same runs retrained with a probe that reads the whole "
             "model at each snapshot step:", "", *(f"    {c}" for c in PROBE_COMMANDS), ""]
    if not frames:
        return [*lines, "No probed runs yet.", ""]
    probed = pd.concat(frames, ignore_index=True)
    early = probed[probed["layer"] == 0].assign(gap=lambda t: t["lambda1_data"] - t["lambda1"])
    rows, sentences = [], []
    for setting, runs in early.groupby("setting", sort=False):
        means = runs.groupby("step")[["lambda1", "lambda1_data", "gap"]].mean()
        last = means.index.max()
        for fraction in THROUGH_TRAINING:
            step = means.index[int(np.abs(means.index - fraction * last).argmin())]
            rows.append({"setting": setting, "seeds": runs["seed"].nunique(), "step": step,
                         "weights λ₁": means.loc[step, "lambda1"], "data-aware λ₁": means.loc[step, "lambda1_data"],
                         "gap": means.loc[step, "gap"]})
        rho = float(np.corrcoef(runs["lambda1"].rank(), runs["gap"].rank())[0, 1])
        sentences.append(f"{setting}: {rho:+.2f} ({correlation_words(rho, 'as')}) over {len(runs)} probed steps, "
                         f"the gap {means['gap'].iloc[0]:.2f} at step 0 and {means['gap'].iloc[-1]:.2f} at the end")
    return [*lines, markdown_table(pd.DataFrame(rows), 2), "",
            "Spearman correlation between the weights view's λ₁ and the gap, over every probed step and seed: "
            f"{'; '.join(sentences)}. Within a run the gap opens while λ₁ "
            "grows when it is positive: the inputs' shared direction (the data-aware view) grows faster than the "
            "weights take it up; across settings at the same step, the larger λ₁ goes with the smaller gap.", ""]
