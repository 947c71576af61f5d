"""What a sweep's table says across its grid (`headlab.study.sweep`), by the rule of
`headlab.study.stats` (the paired 95% interval against each metric's margin δ, the table's
`verdict`): which comparisons with Standard MHA stay within ±δ, hold, change sign, shrink toward
zero or appear. Read from the table alone, so the sweep's page loads neither the trainer nor torch.

    sweep_sentences(table)      # one paragraph's sentences: what holds, flips, shrinks
"""

from __future__ import annotations

import pandas as pd


def grid_axes(table: pd.DataFrame) -> list[str]:
    """The grid's columns that vary across the sweep, training length first: the columns a row
    carries before its comparison (length, n_layer, then any swept ModelConfig or TrainConfig field)."""
    columns = list(table.columns[:table.columns.get_loc("role")])
    return [c for c in columns if c not in ("point", "steps") and table[c].nunique() > 1]


def verdict(rows: pd.DataFrame, axis: str = "length") -> str:
    """What one comparison does across the grid, from each point's verdict (an ordering, "higher"
    or "lower", only beyond the margin): 'within the margin everywhere', 'holds everywhere' (one
    ordering at every point), 'changes sign' (ordered both ways), 'shrinks toward zero' (ordered at
    the smallest `axis` value, not at the largest, and smaller in size there), 'appears' (the
    reverse), else 'ordered at k of n points'."""
    ordered = rows["verdict"].isin(("higher", "lower"))
    kinds = set(rows.loc[ordered, "verdict"])
    if (rows["verdict"] == "within").all():
        return "within the margin everywhere"
    if ordered.all() and len(kinds) == 1:
        return "holds everywhere"
    if len(kinds) > 1:
        return "changes sign"
    along = rows.assign(ordered=ordered).sort_values(axis)
    first, last = along.iloc[0], along.iloc[-1]
    if first["ordered"] and not last["ordered"] and abs(last["mean"]) < abs(first["mean"]):
        return "shrinks toward zero"
    if last["ordered"] and not first["ordered"]:
        return "appears"
    return f"ordered at {int(ordered.sum())} of {len(rows)} points"


def sweep_sentences(table: pd.DataFrame) -> list[str]:
    """One paragraph's sentences: for each verdict, the comparisons that get it (with the sign of
    those that hold), along the grid's main axis (training length when it varies)."""
    if table["seeds"].max() < 2:
        return ["One seed per point: no orderings claimed."]
    axis = (grid_axes(table) or ["length"])[0]
    groups: dict[str, list[str]] = {}
    for (comparison, metric), rows in table.groupby(["comparison", "metric"], sort=False):
        what = verdict(rows, axis)
        if what == "holds everywhere":
            what += f" ({rows['verdict'].iloc[0]} than Standard MHA)"
        elif what == "within the margin everywhere":
            what = f"within ±{rows['margin'].iloc[0]:g} {rows['unit'].iloc[0]} everywhere"
        groups.setdefault(what, []).append(f"{comparison}: {metric}")
    points = table["point"].nunique()
    sentences = [f"Across the {points} grid points (along {axis}), by the paired 95% rule with each metric's "
                 "margin δ (within ±δ, an ordering only beyond it):"]
    sentences += [f"{what}: {'; '.join(items)}." for what, items in groups.items()]
    return sentences
