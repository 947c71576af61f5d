"""Heads and layers without a form, named. A head whose bilinear form is zero is dead, and a layer
whose heads are all dead has no circuit (the rule and its tolerance: `headlab.analysis.spectrum`).
Their numbers are undefined, NaN in an analysis's tables; this says which they are, from the
similarity table, whose diagonal is NaN exactly at the dead heads:

    zero_form_note(result.similarity)   # one line, or None when every head of every layer is live
"""

from __future__ import annotations

import pandas as pd

HEAD_COLUMNS = ("head_i", "head_j", "value")
NAMED_ALWAYS = ("model", "circuit")  # other columns are named only where the table holds several values
NEVER_NAMED = ("role",)  # a study's role column repeats its model's name


def dead_heads(similarity: pd.DataFrame) -> pd.DataFrame:
    """One row per layer of a similarity table: its columns but head_i, head_j and value, then
    n_heads and `dead`, the tuple of its dead heads."""
    keys = [c for c in similarity.columns if c not in HEAD_COLUMNS]
    diagonal = similarity[similarity["head_i"] == similarity["head_j"]]
    rows = [(*key, len(heads), tuple(int(h) for h in heads.loc[heads["value"].isna(), "head_i"]))
            for key, heads in diagonal.groupby(keys, sort=False, dropna=False)]
    return pd.DataFrame(rows, columns=[*keys, "n_heads", "dead"])


def zero_form_note(similarity: pd.DataFrame) -> str | None:
    """One line naming the layers without a circuit (with how many of their model's layers they are:
    means over layers leave them out) and the dead heads (left out of their layer's spectrum,
    still counted in H); None when there are none."""
    layers = dead_heads(similarity)
    layers["n_dead"] = layers["dead"].map(len)
    if not layers["n_dead"].any():
        return None
    keys = [c for c in layers.columns if c not in ("layer", "n_heads", "dead", "n_dead")]
    named = [c for c in keys if c in NAMED_ALWAYS or (c not in NEVER_NAMED and layers[c].nunique(dropna=False) > 1)]
    without, partly = [], []
    for key, group in layers.groupby(keys, sort=False, dropna=False):
        values = dict(zip(keys, key))
        name = " ".join(str(values[c]) if c in NAMED_ALWAYS else f"{c} {values[c]}" for c in named)
        empty = group[group["n_dead"] == group["n_heads"]]
        if len(empty):
            without.append(f"{name} layer {', '.join(map(str, empty['layer']))} ({len(empty)} of {len(group)} layers)")
        some = group[(group["n_dead"] > 0) & (group["n_dead"] < group["n_heads"])]
        partly += [f"{name} layer {row.layer} head{'s' * (len(row.dead) > 1)} {', '.join(map(str, row.dead))}"
                   for row in some.itertuples()]
    parts = []
    if without:
        parts.append("no circuit, as every head's form is zero (similarity and effective rank undefined: NaN, "
                     f"left out of the means over layers): {'; '.join(without)}")
    if partly:
        parts.append("dead heads, whose form is zero (similarity NaN; left out of their layer's spectrum, still "
                     f"counted in H): {'; '.join(partly)}")
    return "Undefined, " + "; and ".join(parts) + "."
