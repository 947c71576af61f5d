"""The study's tables as the report prints them: markdown (`markdown_table`), the KV cache against
the paper's (`cache_table`) and the recipe in words (`recipe_text`). The tables of the study's
conclusions (effective rank and loss beside the paper's, the distance to the seed figure) are the
study's own (`headlab.study.conclusions`)."""

from __future__ import annotations

import pandas as pd

from headlab.study.cells import cell_text
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA


def cache_table(cache: pd.DataFrame) -> pd.DataFrame:
    """The paper's Tables 7 and 8 form: KV values per token and layer, % of MHA, the paper's %."""
    return pd.DataFrame([{"role": row.role, "ours": row.model, "KV values/token/layer": row.kv_values_per_token,
                          "% of MHA": row.kv_cache_pct, "paper (128M)": PAPER[row.role].label,
                          "paper % of MHA": PAPER[row.role].kv_cache_pct} for row in cache.itertuples()])


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


def markdown_table(frame: pd.DataFrame, decimals: int) -> str:
    """A markdown table; floats to `decimals` places, differences ('vs' columns) signed."""
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell_text(c, v, decimals) for c, v in zip(frame.columns, row)) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def recipe_text(meta: dict) -> str:
    """The study's training recipe in one sentence, every setting it changed from its preset, and
    any it set that bears on none of its runs."""
    train = meta.get("train")
    if train is None:  # tables written before the recipe was recorded
        return "The training recipe is not recorded in these tables."
    if meta.get("optimizers"):  # the plan the runs were trained by: `optimizer_lines` shows it whole
        split = ("the paper's split of Muon and AdamW" if train.get("muon_qk", True) else
                 "Muon and AdamW, the matrices that form only queries or keys left to AdamW (not the paper's recipe)")
        text = ("Trained with " + ("AdamW" if train["optimizer"] == "adamw" else split)
                + "; which optimizer trains which tensor of each variant, at which learning rate and weight decay, is "
                  "the optimizer plan the runs were trained by (the report's table 'Which optimizer trains which "
                  "tensor')")
    else:  # tables written before the plan was recorded: the recipe in words
        text = recipe_in_words(train)
    text += f"; {train['warmup_steps']} warmup steps, cosine decay to {train['min_lr_ratio']:g} of the peak, " \
            f"{train['batch_size']} sequences per step."
    if meta.get("learning_checked") is False:
        text += (" Whether each run learned was not checked (learning_checked False, a smoke test): a comparison "
                 "below may be of runs that learned nothing, their initialisations'.")
    changed, unread = meta.get("changed") or {}, meta.get("unread") or {}
    settings = lambda values: ", ".join(f"`{name} = {value}`" for name, value in values.items())
    text += f" Changed from the preset `{meta['preset']}`: {settings(changed)}." if changed else ""
    return text + (f" Set, but read by none of these runs (nothing trained differs for it): {settings(unread)}."
                   if unread else "")


def recipe_in_words(train: dict) -> str:
    """The optimizers of a recipe in words, for tables written before the plan was recorded."""
    factors = "" if train["lrkv_factor_decay"] else "; no weight decay on LRKV's factors U_h, B_h"
    if train["optimizer"] == "adamw":
        return (f"Trained with AdamW (lr {train['lr']:g}, weight decay {train['weight_decay']:g} on every matrix"
                f"{', LRKV' + chr(39) + 's factors U_h, B_h included' if train['lrkv_factor_decay'] else ''}){factors}")
    b = ("B_h by per-head Muon" if train["lrkv_b_optimizer"] == "muon"
         else "LRKV's 3-D B_h and the norms by AdamW at lr " + f"{train['lr']:g}" + " without decay")
    # muon_qk is absent from tables written before it was an option: Muon trained W_Q, W_K then
    blocks = ("the blocks' matrices" if train.get("muon_qk", True) else
              f"the blocks' matrices but those that form only queries or keys (AdamW there, lr {train['lr']:g}, weight "
              f"decay {train['weight_decay']:g}: not the paper's recipe; MLA's joint key/value latents stay on Muon)")
    return (f"Trained with the paper's split: Muon on {blocks} (lr {train['matrix_lr']:g}, weight "
            f"decay {train['weight_decay']:g}), AdamW on the embedding (lr {train['embedding_lr']:g}) and the "
            f"head (lr {train['unembedding_lr']:g}), {b}{factors}")


def optimizer_frame(rows: list[dict]) -> pd.DataFrame:
    """The optimizer plan of a study (meta["optimizers"]) as a table: one row per group of tensors,
    the variants whose plan holds the same group merged into one row."""
    merged: dict[tuple, list[str]] = {}
    for row in rows:
        key = (row["optimizer"], f"{row['lr']:g} ({row['lr_setting']})",
               f"{row['weight_decay']:g} ({row['decay_setting']})" if row["decay_setting"] else "none",
               ", ".join(row["tensors"]))
        merged.setdefault(key, []).append(row["model"])
    return pd.DataFrame([{"variants": ", ".join(models), "optimizer": optimizer, "learning rate": lr,
                          "weight decay": decay, "tensors (each block's named once)": tensors}
                         for (optimizer, lr, decay, tensors), models in merged.items()])


def optimizer_lines(meta: dict) -> list[str]:
    """'Which optimizer trains which tensor': the plan the runs' optimizers were made from
    (`headlab.training.optimizers.optimizer_plan`), or nothing for tables written before it was recorded."""
    if not meta.get("optimizers"):
        return []
    return ["### Which optimizer trains which tensor", "",
            "The optimizer plan the runs' optimizers were made from (`headlab.training.optimizers`), read from the "
            "code that trained them, not written beside it: each tensor named as in every block (attn.c_q: each "
            "block's query matrix; wte, lm_head: the embedding and the output head), with the setting each rate "
            "and decay comes from.", "", markdown_table(optimizer_frame(meta["optimizers"]), 3), ""]
