"""A sweep's page: sweep.md and figures/sweep.png (and with `svg` figures/sweep.svg) from a sweep's table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headlab.io import Manifest, writing
from headlab.report import plots
from headlab.report.paper_tables import markdown_table
from headlab.report.writer import FIGURES_FOLDER
from headlab.study.sweep_claims import grid_axes, sweep_sentences
from headlab.study.table_files import SWEEP, SWEEP_MANIFEST


def write_sweep_report(table: pd.DataFrame, out: str | Path, svg: bool = False) -> Path:
    """sweep.md and figures/sweep.png (with `svg` also figures/sweep.svg) in `out` from a sweep's
    table: the paired difference to Standard MHA ± its 95% half-width at each grid point, and the
    paragraph of `sweep_sentences`."""
    with writing(out, SWEEP_MANIFEST, SWEEP, "sweep writer") as manifest:
        manifest.write_bytes("sweep.md", "\n".join(sweep_lines(table, manifest, svg)).encode())
    return Path(out) / "sweep.md"


def sweep_lines(table: pd.DataFrame, manifest: Manifest, svg: bool = False) -> list[str]:
    figure = plots.save_figure(plots.sweep_figure(table, axes=grid_axes(table)),
                               manifest, f"{FIGURES_FOLDER}/sweep", svg=svg)
    shown = table.assign(difference=[f"{m:+.3f} ± {h:.3f}" if s > 1 else f"{m:+.3f}"
                                     for m, h, s in zip(table["mean"], table["half_width"], table["seeds"])])
    wide = shown.pivot_table(index=["comparison", "metric"], columns="point", values="difference", aggfunc="first",
                             sort=False).reset_index()
    wide = wide[["comparison", "metric", *dict.fromkeys(table["point"])]]
    axes = ", ".join(grid_axes(table)) or "one point"
    lines = [
        "# Scale sweep: the comparison with Standard MHA across a grid",
        "",
        f"Grid over {axes}; {int(table['seeds'].max())} seed(s) per variant and point, each variant paired with "
        "Standard MHA's run of the same seed. Cells: paired difference (variant − MHA) ± the 95% t half-width; "
        "the sentences below set each interval against its metric's margin δ (the table's `margin`): within ±δ "
        "when it lies inside, an ordering only when it excludes zero and the difference exceeds δ.",
        "",
        f"![sweep](figures/{figure.name})",
        "",
        markdown_table(wide, 3),
        "",
        *[f"- {s}" for s in sweep_sentences(table)],
        "",
    ]
    return lines
