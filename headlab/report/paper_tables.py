"""The study's tables as the report prints them: markdown (`markdown_table`), the KV cache against
the paper's (`cache_table`) and the recipe in words (`recipe_text`). The tables of the study's
conclusions (effective rank and loss beside the paper's, the distance to the seed figure) are the
study's own (`headlab.study.conclusions`)."""

from __future__ import annotations

import pandas as pd

from headlab.study.cells import cell_text
from headlab.study.paper import PAPER


def cache_table(cache: pd.DataFrame) -> pd.DataFrame:
    """The paper's Tables 7 and 8 form: KV values per token and layer, % of MHA, the paper's %."""
    return pd.DataFrame([{"role": row.role, "ours": row.model, "KV values/token/layer": row.kv_values_per_token,
                          "% of MHA": row.kv_cache_pct, "paper (128M)": PAPER[row.role].label,
                          "paper % of MHA": PAPER[row.role].kv_cache_pct} for row in cache.itertuples()])


def markdown_table(frame: pd.DataFrame, decimals: int) -> str:
    """A markdown table; floats to `decimals` places, differences ('vs' columns) signed."""
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(cell_text(c, v, decimals) for c, v in zip(frame.columns, row)) + " |"
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
