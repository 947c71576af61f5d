"""What a sweep's table says across its grid (`headlab.study.sweep`), by the paired 95% rule of
`headlab.study.stats`: which comparisons with Standard MHA hold, change sign, shrink toward zero
or appear. Read from the table alone, so the sweep's page loads neither the trainer nor torch.

    sweep_sentences(table)      # one paragraph's sentences: what holds, flips, shrinks
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def grid_axes(table: pd.DataFrame) -> list[str]:
    """The grid's columns that vary across the sweep, training length first: the columns a row
    carries before its comparison (length, n_layer, then any swept ModelConfig or TrainConfig field)."""
    columns = list(table.columns[:table.columns.get_loc("role")])
    return [c for c in columns if c not in ("point", "steps") and table[c].nunique() > 1]


def verdict(rows: pd.DataFrame, axis: str = "length") -> str:
    """What one comparison does across the grid, by the rule (an ordering only where decided):
    'holds everywhere' (decided, one sign, at every point), 'changes sign' (decided both ways),
    'shrinks toward zero' (decided at the smallest `axis` value, within noise at the largest, and
    smaller in size there), 'appears' (the reverse), else 'decided at k of n points'."""
    decided = rows[rows["decided"]]
    signs = set(np.sign(decided["mean"]))
    if len(decided) == len(rows) and len(signs) == 1:
        return "holds everywhere"
    if len(signs) > 1:
        return "changes sign"
    ordered = rows.sort_values(axis)
    first, last = ordered.iloc[0], ordered.iloc[-1]
    if first["decided"] and not last["decided"] and abs(last["mean"]) < abs(first["mean"]):
        return "shrinks toward zero"
    if last["decided"] and not first["decided"]:
        return "appears"
    return f"decided at {len(decided)} of {len(rows)} points"


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
            what += f" ({'higher' if rows['mean'].iloc[0] > 0 else 'lower'} than Standard MHA)"
        groups.setdefault(what, []).append(f"{comparison}: {metric}")
    points = table["point"].nunique()
    sentences = [f"Across the {points} grid points (along {axis}), by the paired 95% rule:"]
    sentences += [f"{what}: {'; '.join(items)}." for what, items in groups.items()]
    return sentences
