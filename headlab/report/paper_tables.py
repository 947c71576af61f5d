"""The study's numbers as the paper's tables: effective rank per variant (mean ± sd over seeds,
beside the paper's), KV cache against MHA, final loss with paired differences, as DataFrames and
as markdown."""

from __future__ import annotations

import pandas as pd

from headlab.schema import KINDS
from headlab.study.claims import difference_to_mha, values, variant_name, variant_rows
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA
from headlab.study.seed_distance import STATES
from headlab.study.stats import spread
from headlab.study.table_files import loss_unit


def qk_rows(summary: pd.DataFrame, model: str, mla_rope: str, kind: str) -> pd.DataFrame:
    """One model's QK summary rows at one `mla_rope` setting and kind."""
    return summary[(summary["circuit"] == "qk") & (summary["model"] == model) & (summary["mla_rope"] == mla_rope)
                   & (summary["kind"] == kind)]


def layer_range(summary: pd.DataFrame, model: str, mla_rope: str, kind: str) -> tuple[float, float]:
    """Min and max over layers of the seed-mean effective rank (% of H) of one model."""
    by_layer = qk_rows(summary, model, mla_rope, kind).groupby("layer")["effective_rank_pct_of_heads"].mean()
    return float(by_layer.min()), float(by_layer.max())


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
            low, high = layer_range(summary, model, mla_rope, kind)
            row[f"{kind} % of H"] = f"{spread(values(metrics, role, mla_rope, kind)).format(1)} [{low:.1f}–{high:.1f}]"
            if init_summary is not None:
                at_init = qk_rows(init_summary, model, mla_rope, kind).groupby("seed")["effective_rank_pct_of_heads"]
                row[f"random init, {kind}"] = spread(at_init.mean().to_numpy()).format(1)
        paper = PAPER[role]
        rows.append({**row, "paper (128M)": paper.label, "paper uncentered": paper.uncentered,
                     "paper centered": paper.centered})
    return pd.DataFrame(rows)


def seed_figure_spectra() -> pd.DataFrame:
    """The seed figure (the paper's Fig. 11 at 128M, `SEED_SPECTRA`, read off by eye) as a spectra
    table, so `plots.spectra_figure` draws it as it draws ours: model (the paper's label), role,
    layer (0, 6, 11), circuit "qk", measure "frobenius", kind "uncentered", index, eigenvalue, and
    recipe "paper 128M (Fig. 11, read off)"."""
    rows = [{"model": PAPER[role].label, "role": role, "layer": PAPER_PANELS[panel], "circuit": "qk",
             "measure": "frobenius", "kind": "uncentered", "index": index, "eigenvalue": value,
             "recipe": "paper 128M (Fig. 11, read off)"}
            for role, curves in SEED_SPECTRA.items() for panel, curve in curves.items()
            for index, value in enumerate(curve.eigenvalues(), start=1)]
    return pd.DataFrame(rows)


def seed_distance_rows(distances: pd.DataFrame) -> pd.DataFrame:
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


def cache_table(cache: pd.DataFrame) -> pd.DataFrame:
    """The paper's Tables 7 and 8 form: KV values per token and layer, % of MHA, the paper's %."""
    return pd.DataFrame([{"role": row.role, "ours": row.model, "KV values/token/layer": row.kv_values_per_token,
                          "% of MHA": row.kv_cache_pct, "paper (128M)": PAPER[row.role].label,
                          "paper % of MHA": PAPER[row.role].kv_cache_pct} for row in cache.itertuples()])


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
        bits = {} if unit == loss_unit("byte") else {
            "val bits/byte": spread(values(metrics, role, mla_rope, "val_bpb")).format(3)}
        rows.append({"role": role, "ours": model, f"val loss ({unit})": spread(losses).format(3), **bits,
                     "vs MHA (paired)": "—" if role == "mha" else
                     difference_to_mha(metrics, role, mla_rope, "val_loss").format(3),
                     "seeds": len(losses), "paper (128M)": paper.label, "paper CE": paper.loss,
                     "paper vs MHA": paper.loss - PAPER["mha"].loss})
    return pd.DataFrame(rows)


def markdown_table(frame: pd.DataFrame, decimals: int) -> str:
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


def recipe_text(meta: dict) -> str:
    """The study's training recipe in one sentence, and every setting it changed from its preset."""
    train = meta.get("train")
    if train is None:  # tables written before the recipe was recorded
        return "The training recipe is not recorded in these tables."
    factors = "" if train["lrkv_factor_decay"] else "; no weight decay on LRKV's factors U_h, B_h"
    if train["optimizer"] == "adamw":
        text = (f"Trained with AdamW (lr {train['lr']:g}, weight decay {train['weight_decay']:g} on every matrix"
                f"{', LRKV' + chr(39) + 's factors U_h, B_h included' if train['lrkv_factor_decay'] else ''}){factors}")
    else:
        b = ("B_h by per-head Muon" if train["lrkv_b_optimizer"] == "muon"
             else "LRKV's 3-D B_h and the norms by AdamW at lr " + f"{train['lr']:g}" + " without decay")
        # muon_qk is absent from tables written before it was an option: Muon trained W_Q, W_K then
        blocks = ("the blocks' matrices" if train.get("muon_qk", True) else
                  f"the blocks' matrices but W_Q, W_K (AdamW there, lr {train['lr']:g}, weight decay "
                  f"{train['weight_decay']:g}: not the paper's recipe)")
        text = (f"Trained with the paper's split: Muon on {blocks} (lr {train['matrix_lr']:g}, weight "
                f"decay {train['weight_decay']:g}), AdamW on the embedding (lr {train['embedding_lr']:g}) and the "
                f"head (lr {train['unembedding_lr']:g}), {b}{factors}")
    text += f"; {train['warmup_steps']} warmup steps, cosine decay to {train['min_lr_ratio']:g} of the peak, " \
            f"{train['batch_size']} sequences per step."
    changed = meta.get("changed") or {}
    settings = ", ".join(f"`{name} = {value}`" for name, value in changed.items())
    return text + (f" Changed from the preset `{meta['preset']}`: {settings}." if changed else "")
