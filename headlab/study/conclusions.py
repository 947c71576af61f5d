"""What a study concludes from its tables, computed once and kept beside them: the claims by the
rule, the distance to the seed figure, the random-init baselines and every mean ± sd the report
quotes. The report (`headlab.report.writer`), the README's tests and the notebooks render these
tables and compute nothing of their own.

    metrics           per role, model, mla_rope and seed: final validation loss and layer-mean QK
                      effective rank per kind (`claims.per_seed_metrics`): what every comparison pairs
    final_losses      the last validation record of every run (`claims.final_losses`)
    step_metrics      the same per snapshot step (`claims.per_step_metrics`, the flagship mla_rope)
    claims            every statement of the report, by section: comparison (with its data: role,
                      model, mla_rope, metric, difference, half_width, seeds, margin, verdict, change),
                      training, measures, and the rule and margins they follow; `sentence` as printed
    seed_distance     per role, panel, state (trained, init) and seed: λ₁ and d₁ to the seed figure
    quantities        single numbers the prose quotes (name, text, value), e.g. MLA's RoPE-to-latent ratio
    loss_table, rank_table, distance_table, factor_table, rank_bound_table, measure_table
                      the report's tables as it prints them (every cell text): mean ± sd over seeds,
                      paired differences ± 95% half-widths with their verdicts, the random-init
                      baseline beside every rank, the paper's numbers by role

`analyze_study` writes them with the other tables; `read_study_tables` computes them, the same way,
for tables written before studies kept them (shipped tables get theirs written by
`scripts/ship_tables.py --conclusions NAME`)."""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd

from headlab.schema import KINDS, VIEWS
from headlab.study.cells import text_table
from headlab.study.claims import (
    BYTE_LOSS_UNIT,
    MARGINS,
    comparison_claims,
    difference_to_mha,
    final_losses,
    halfway,
    margins_text,
    measure_claims,
    per_seed_metrics,
    per_seed_ranks,
    per_step_metrics,
    rule_text,
    training_claims,
    values,
    variant_name,
    variant_rows,
)
from headlab.study.paper import PAPER, layer_roles
from headlab.study.seed_distance import STATES, seed_distance
from headlab.study.stats import HIGHER, LOWER, WITHIN, paired_difference, spread

# The display tables and the decimals of their cells; every conclusion table's name.
DISPLAY = {"loss_table": 3, "rank_table": 1, "distance_table": 2, "factor_table": 3, "rank_bound_table": 1,
           "measure_table": 1}
CONCLUSIONS = ("metrics", "final_losses", "step_metrics", "claims", "seed_distance", "quantities", *DISPLAY)


def conclusions(tables: dict[str, pd.DataFrame], meta: dict) -> dict[str, pd.DataFrame]:
    """The conclusion tables of a study's `tables` and `meta` (those its tables allow: no distance
    without the random-init spectra, no factor tables without LRKV)."""
    flagship = meta["flagship_mla_rope"]
    metrics = per_seed_metrics(tables["summary"], tables["training"])
    init_summary, init_spectra = tables.get("init_summary"), tables.get("init_spectra")
    found = {"metrics": metrics, "final_losses": final_losses(tables["training"]),
             "claims": claim_table(tables, metrics, flagship),
             "loss_table": loss_table(metrics, flagship),
             "rank_table": rank_table(tables["summary"], metrics, init_summary)}
    if "snapshot_summary" in tables:
        found["step_metrics"] = per_step_metrics(tables["snapshot_summary"], flagship)
    if init_spectra is not None:
        found["seed_distance"] = seed_distance(tables["spectra"], init_spectra, layer_roles(tables["spectra"]["layer"]),
                                               flagship)
        found["distance_table"] = distance_table(found["seed_distance"])
    quantities = []
    if len(tables.get("rope_ratio", [])):
        ratio = spread(tables["rope_ratio"]["rope_to_latent"].to_numpy())
        quantities.append({"name": "rope_to_latent", "text": ratio.format(2), "value": ratio.mean})
    mha = metrics[(metrics["mla_rope"] == flagship) & (metrics["role"] == "mha")]
    if len(mha):
        quantities.append({"name": "mha_uncentered", "text": spread(mha["uncentered"].to_numpy()).format(1),
                           "value": float(mha["uncentered"].mean())})
    found["quantities"] = pd.DataFrame(quantities, columns=["name", "text", "value"])
    if "lrkv_factors" in tables and len(tables["lrkv_factors"]):
        found["factor_table"] = factor_table(tables)
        if len(tables["rank_bound"]):
            found["rank_bound_table"] = rank_bound_table(tables, metrics, flagship)
    if "measures" in tables:
        found["measure_table"] = measure_table(tables["measures"])
    return {name: text_table(table, DISPLAY[name]) if name in DISPLAY else table for name, table in found.items()}


def claim_table(tables: dict[str, pd.DataFrame], metrics: pd.DataFrame, flagship: str) -> pd.DataFrame:
    """Every statement by section, the comparison's with their data (`comparison_claims`)."""
    rows = []
    if metrics["seed"].nunique() < 2:
        rows.append({"section": "comparison", "sentence": "One seed: no orderings claimed."})
    else:
        half = halfway(tables["snapshot_summary"], tables["training"]) if "snapshot_summary" in tables else None
        rows += [{"section": "comparison", **asdict(claim)} for claim in comparison_claims(metrics, half)]
    n_comparisons = len(rows)
    rows += [{"section": "rule", "sentence": rule_text(metrics["seed"].nunique(), n_comparisons)},
             {"section": "margins", "sentence": margins_text(metrics)}]
    if "snapshot_summary" in tables:
        rows += [{"section": "training", "sentence": s}
                 for s in training_claims(per_step_metrics(tables["snapshot_summary"], flagship))]
    if "measures" in tables:
        rows += [{"section": "measures", "sentence": s} for s in measure_claims(per_seed_ranks(tables["measures"]))]
    columns = ["section", "role", "model", "mla_rope", "metric", "difference", "half_width", "seeds", "margin",
               "verdict", "change", "sentence"]
    return pd.DataFrame(rows, columns=columns)


# ---- the report's tables ------------------------------------------------------------------------

def qk_rows(summary: pd.DataFrame, model: str, mla_rope: str, kind: str) -> pd.DataFrame:
    """One model's QK summary rows at one `mla_rope` setting and kind."""
    return summary[(summary["circuit"] == "qk") & (summary["model"] == model) & (summary["mla_rope"] == mla_rope)
                   & (summary["kind"] == kind)]


def layer_range(summary: pd.DataFrame, model: str, mla_rope: str, kind: str) -> str:
    """'[low–high]': min and max over layers of the seed-mean effective rank (% of H) of one model,
    naming the layers it leaves out or holds over fewer seeds: undefined (no circuit) in every seed,
    or in some; '[undefined]' where every layer is."""
    ranks = qk_rows(summary, model, mla_rope, kind).pivot_table(index="layer", columns="seed", dropna=False,
                                                                values="effective_rank_pct_of_heads")
    by_layer, defined = ranks.mean(axis=1), ranks.notna().sum(axis=1)
    if not defined.any():
        return "[undefined]"
    notes = [f"no circuit at layer {', '.join(map(str, defined.index[defined == 0]))}"] if (defined == 0).any() else []
    notes += [f"layer {layer} in {n} of {ranks.shape[1]} seeds" for layer, n in defined.items()
              if 0 < n < ranks.shape[1]]
    return f"[{by_layer.min():.1f}–{by_layer.max():.1f}{''.join(f'; {note}' for note in notes)}]"


def rank_table(summary: pd.DataFrame, metrics: pd.DataFrame, init_summary: pd.DataFrame | None = None
               ) -> pd.DataFrame:
    """The paper's Table 3 form: mean ± sd over seeds of the layer-mean effective rank (% of H),
    with the range over layers of the seed means, beside the paper's value for the same role.
    With `init_summary` (a study's init_summary), the same mean ± sd of the runs' step-0 weights
    follows each kind: the random-initialisation baseline."""
    rows = []
    for role, model, mla_rope in variant_rows(metrics):
        row = {"role": role, "ours": variant_name(role, model, mla_rope)}
        for kind in KINDS:
            row[f"{kind} % of H"] = (f"{spread(values(metrics, role, mla_rope, kind)).format(1)} "
                                     f"{layer_range(summary, model, mla_rope, kind)}")
            if init_summary is not None:
                at_init = qk_rows(init_summary, model, mla_rope, kind).groupby("seed")["effective_rank_pct_of_heads"]
                row[f"random init, {kind}"] = spread(at_init.mean().to_numpy()).format(1)
        paper = PAPER[role]
        rows.append({**row, "paper (128M)": paper.label, "paper uncentered": paper.uncentered,
                     "paper centered": paper.centered})
    return pd.DataFrame(rows)


def distance_table(distances: pd.DataFrame) -> pd.DataFrame:
    """The distance to the seed figure as a table: per method and panel, λ₁ and d₁ to the seed's
    curve (`headlab.study.seed_distance`), mean ± sd over seeds, trained and at random init, beside
    the seed's λ₁."""
    rows = []
    for (role, model, panel), group in distances.groupby(["role", "model", "panel"], sort=False):
        state = {name: group[group["state"] == name] for name in STATES}
        row = {"role": role, "ours": model, "paper (128M)": PAPER[role].label,
               "panel": f"{panel} (L={group['layer'].iloc[0]}) ↔ paper L={group['paper_layer'].iloc[0]}",
               "paper λ₁": group["seed_first_eigenvalue"].iloc[0]}
        for symbol, column in (("λ₁", "first_eigenvalue"), ("d₁", "l1_to_seed")):
            for name, label in zip(STATES, ("ours", "random init")):
                if len(state[name]):
                    row[f"{symbol} {label}"] = spread(state[name][column].to_numpy()).format(2)
        rows.append(row)
    return pd.DataFrame(rows)


def loss_table(metrics: pd.DataFrame, flagship_mla_rope: str) -> pd.DataFrame:
    """The paper's Tables 1 and 8 form: final validation loss mean ± sd over seeds, the paired
    difference to MHA ± the 95% t half-width, beside the paper's cross-entropy and its difference.
    Unless the loss is per byte already, bits per byte follow it."""
    unit = metrics["loss_unit"].iloc[0]
    rows = []
    for role, model, mla_rope in variant_rows(metrics):
        if mla_rope != flagship_mla_rope:
            continue  # the loss does not depend on the analysis
        losses = values(metrics, role, mla_rope, "val_loss")
        paper = PAPER[role]
        bits = {} if unit == BYTE_LOSS_UNIT else {
            "val bits/byte": spread(values(metrics, role, mla_rope, "val_bpb")).format(3)}
        rows.append({"role": role, "ours": model, f"val loss ({unit})": spread(losses).format(3), **bits,
                     "vs MHA (paired)": "—" if role == "mha" else
                     difference_to_mha(metrics, role, mla_rope, "val_loss").format(3),
                     "seeds": len(losses), "paper (128M)": paper.label, "paper CE": paper.loss,
                     "paper vs MHA": paper.loss - PAPER["mha"].loss})
    return pd.DataFrame(rows)


def factor_table(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per LRKV variant and projection: the final norm ratio and mean principal angle (mean ± sd
    over seeds of the layer and head mean), the random-subspace reference, and for keys the norm
    ratio at the snapshot step nearest half-way."""
    factors, through = tables["lrkv_factors"], tables["factor_training"]
    halfway_step = min(through["step"].unique(), key=lambda step: abs(step - through["step"].max() / 2))
    at_halfway = through[through["step"] == halfway_step].groupby(["model", "seed"])["norm_ratio"].mean()
    rows = []
    for (model, projection), group in factors.groupby(["model", "projection"], sort=False):
        per_seed = group.groupby("seed")[["norm_ratio", "angle_mean"]].mean()
        rows.append({"variant": model, "projection": projection,
                     f"norm ratio at step {halfway_step}": spread(at_halfway[model].to_numpy()).format(3)
                     if projection == "key" else "",
                     "norm ratio, final": spread(per_seed["norm_ratio"].to_numpy()).format(3),
                     "mean principal angle (°)": spread(per_seed["angle_mean"].to_numpy()).format(1),
                     "random subspace (°)": f"{group['angle_random'].iloc[0]:.1f}"})
    return pd.DataFrame(rows)


def rank_bound_table(tables: dict[str, pd.DataFrame], metrics: pd.DataFrame, flagship: str) -> pd.DataFrame:
    """Per LRKV rank r: the key deviation energy of MHA that a rank-r residual keeps, MHA rebuilt
    from it (both kinds), and the trained LRKV of that rank against the rebuilt MHA (paired by seed)."""
    factors, bound = tables["lrkv_factors"], tables["rank_bound"]
    at_flagship = metrics[metrics["mla_rope"] == flagship]
    lrkv_by_rank = dict(zip(factors["rank"], factors["role"]))
    rows = []
    for rank, group in bound.groupby("rank"):
        per_seed = group.groupby(["seed", "kind"])[["key_energy_kept", "effective_rank_pct_of_heads"]].mean()
        rebuilt = per_seed["effective_rank_pct_of_heads"].unstack("kind")
        kept = per_seed["key_energy_kept"].unstack("kind")["uncentered"]
        row = {"rank r": rank,
               "key deviation energy a rank-r residual keeps (%)": spread(100 * kept.to_numpy()).format(1)}
        for kind in KINDS:
            row[f"MHA rebuilt, {kind} (% of H)"] = spread(rebuilt[kind].to_numpy()).format(1)
        role = lrkv_by_rank.get(rank)
        if role is not None:
            trained = at_flagship[at_flagship["role"] == role].set_index("seed").loc[rebuilt.index, "uncentered"]
            d = paired_difference(trained.to_numpy(), rebuilt["uncentered"].to_numpy())
            margin = MARGINS["uncentered"]
            verdict = d.verdict(margin)
            row["trained LRKV − MHA rebuilt, uncentered"] = (
                d.format(1) if verdict in (HIGHER, LOWER) else
                f"{f'within ±{margin:g}' if verdict == WITHIN else verdict}, {d.format(1)}")
        rows.append(row)
    return pd.DataFrame(rows)


def measure_table(measures: pd.DataFrame) -> pd.DataFrame:
    """Per variant and kind, the layer-mean QK effective rank (% of H) under each view, mean ± sd over seeds."""
    ranks = per_seed_ranks(measures)
    return (ranks.groupby(["model", "measure", "kind"], sort=False)["rank"]
            .apply(lambda v: spread(v.to_numpy()).format(1)).unstack("measure").reset_index()
            .rename(columns=VIEWS))


def without_conclusions(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """`tables` less the conclusion tables: what a study's conclusions are computed from."""
    return {name: table for name, table in tables.items() if name not in CONCLUSIONS}


def with_conclusions(tables: dict[str, pd.DataFrame], meta: dict) -> dict[str, pd.DataFrame]:
    """`tables` and the conclusion tables they lack (tables written before studies kept them)."""
    if all(name in tables for name in ("metrics", "claims", "quantities")):
        return tables
    return {**tables, **{name: table for name, table in conclusions(tables, meta).items() if name not in tables}}

