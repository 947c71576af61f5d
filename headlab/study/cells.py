"""How a table's cells are written as text: one rule for the study's display tables
(`headlab.study.conclusions`) and every markdown table of the report. A float goes to the table's
decimals, signed in a column of differences (one whose name says 'vs'), an undefined one (NaN) as
'undefined'; anything else as it is."""

from __future__ import annotations

import math

import pandas as pd

UNDEFINED = "undefined"  # a value with no meaning here (NaN): never printed as 'nan'


def cell_text(column: str, value, decimals: int) -> str:
    if not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return UNDEFINED
    return f"{value:{'+' if 'vs' in column else ''}.{decimals}f}"


def text_table(frame: pd.DataFrame, decimals: int) -> pd.DataFrame:
    """`frame` with every cell as `cell_text` writes it."""
    return pd.DataFrame({column: [cell_text(column, value, decimals) for value in frame[column]]
                         for column in frame.columns}, columns=frame.columns)
