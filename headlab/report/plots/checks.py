"""A figure's table, checked before drawing: columns, circuit and kind, one row per run, one loss unit."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from headlab.schema import KINDS


def checked_rows(table: pd.DataFrame, name: str, columns: Sequence[str], circuit: str | None = None,
                 kind: str | None = None) -> pd.DataFrame:
    """The rows of `table` for `circuit` and `kind` (when given), after checking its columns and
    those values; `name` is the table's name in error messages."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"the {name} table must be a pandas DataFrame, not {type(table).__name__}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"the {name} table is missing column(s) {', '.join(missing)}: "
                         f"it needs {', '.join(columns)}")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind = {kind!r} is invalid: allowed values are {', '.join(KINDS)}")
    rows = table
    if circuit is not None:
        circuits = list(dict.fromkeys(table["circuit"]))
        if circuit not in circuits:
            raise ValueError(f"circuit = {circuit!r} is not in the {name} table: allowed values are "
                             f"{', '.join(map(str, circuits)) or 'none (the table is empty)'}")
        rows = rows[rows["circuit"] == circuit]
    if kind is not None:
        rows = rows[rows["kind"] == kind]
    if rows.empty:
        raise ValueError(f"the {name} table has no rows" + (f" for circuit {circuit!r}" if circuit else "")
                         + (f" and kind {kind!r}" if kind else ""))
    return rows


def seed_count(data: pd.DataFrame, name: str, keys: Sequence[str]) -> int:
    """How many seeds `data` holds, after checking that it has one row per `keys` and seed
    (two runs under one label and no seed column would otherwise be averaged silently)."""
    if "mla_rope" in data.columns and data["mla_rope"].nunique() > 1:
        raise ValueError(f"the {name} table holds several mla_rope settings "
                         f"({', '.join(map(str, dict.fromkeys(data['mla_rope'])))}): pass one setting's rows")
    keys = [*keys, "seed"] if "seed" in data.columns else list(keys)
    duplicated = data[data.duplicated(keys, keep=False)]
    if not duplicated.empty:
        example = duplicated.iloc[0]
        raise ValueError(f"the {name} table has several rows for "
                         + ", ".join(f"{k} = {example[k]!r}" for k in keys)
                         + ": give each run its own `seed` (or model label)")
    return data["seed"].nunique() if "seed" in data.columns else 1


def table_loss_unit(data: pd.DataFrame, name: str) -> str:
    """The unit of a table's losses: its `loss_unit` column (one value), else nats/token."""
    if "loss_unit" not in data.columns:
        return "nats/token"
    units = list(dict.fromkeys(data["loss_unit"]))
    if len(units) != 1:
        raise ValueError(f"the {name} table mixes loss units {', '.join(map(str, units))}: pass one unit's rows")
    return str(units[0])
