"""Every markdown table of the report writes an undefined value (NaN: a Spearman correlation of
fewer than three points, a layer without a circuit) as 'undefined', never as 'nan' (round 7 of
hostile inputs found 'nan' in every tiny study's measure-agreement table)."""

import pandas as pd

from headlab.report.paper_tables import markdown_table


def test_an_undefined_cell_is_written_undefined():
    frame = pd.DataFrame({"pair": ["frobenius vs data", "data vs behaviour"], "n_points": [2, 5],
                          "spearman": [float("nan"), 0.5], "rank vs MHA": [float("nan"), -1.25]})
    text = markdown_table(frame, 2)
    assert "nan" not in text.lower()
    assert "| frobenius vs data | 2 | undefined | undefined |" in text
    assert "| data vs behaviour | 5 | 0.50 | -1.25 |" in text
