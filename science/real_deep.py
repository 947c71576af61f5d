"""The section of science/real_checkpoints.md on our own six methods at the paper's layout: cpu-deep (12
layers x 6 heads), 3 seeds, under the paper's recipe and with AdamW on W_Q, W_K, from the rows that
`science/fig11_measures.py measure` wrote (science/tables/fig11_cpu-deep*) and the training logs' times
(science/tables/deep_timing.csv, `science/real_checkpoints.py timing`)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from fig11_methods import first_eigenvalue_table, loss_line, orderings, rank_table, study_tables
from real_figures import paper_layout

from headlab.io import atomic_write_text
from headlab.report.paper_tables import markdown_table

TABLES = Path(__file__).resolve().parent / "tables"
RECIPES = {"cpu-deep": "Muon (the paper's recipe)", "cpu-deep-adamw-qk": "AdamW on W_Q, W_K"}
COMMANDS = {"cpu-deep": "headlab reproduce --preset cpu-deep --seeds 3 --jobs 2 --out runs/cpu-deep",
            "cpu-deep-adamw-qk": "headlab reproduce --preset cpu-deep --set muon_qk=false --seeds 3 --jobs 2 "
                                 "--out runs/cpu-deep-adamw-qk"}
TIMING = TABLES / "deep_timing.csv"


def loaded() -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Recipe -> the weights view's (layer rows, panel spectra) of the cpu-deep studies measured so far."""
    return {RECIPES[name]: tables for name in RECIPES if (tables := study_tables(name, "weights")) is not None}


def timing_lines() -> list[str]:
    if not TIMING.exists():
        return ["Per-run times: not recorded yet."]
    timing = pd.read_csv(TIMING)
    lines = []
    for _, t in timing.iterrows():
        per_run = t["cpu_seconds"] / t["runs"]
        lines.append(f"{RECIPES.get(t['study'], t['study'])}: {t['runs']} runs, {t['run_wall_median']:.0f} s wall "
                     f"each at the median two at a time on the shared machine; {t['cpu_seconds']:,.0f} CPU-s in all "
                     f"(`/usr/bin/time`, training and analysis), {per_run:.0f} CPU-s a run, so on two free cores "
                     f"(two runs at a time, one thread each) about {t['cpu_seconds'] / 2 / 60:.0f} min.")
    return lines


def deep_section(args, out: Path) -> list[str]:
    studies = loaded()
    lines = ["## Our six methods at the paper's layout (cpu-deep, both recipes)", "",
             *(f"    {c}" for c in COMMANDS.values()), ""]
    if not studies:
        return [*lines, "No measured runs yet.", ""]
    figure = out.parent / "figures" / "cpu_deep_paper_layout.png"
    paper_layout({f"cpu-deep, {recipe}": spectra for recipe, (_, spectra) in studies.items()}, figure)
    return [*lines, "cpu-deep: 12 layers of 6 heads (d_h 16, d_model 96), 1,000 steps of 16 x 64 bytes of "
            "Shakespeare, the paper's panels L = 0 / 6 / 11. The weights view (uncentred, the paper's Eq. 11, MLA's "
            "RoPE part included); each cell mean ± sd over seeds (the number of seeds in brackets).", "",
            f"![the seed figure and ours at its layout](figures/{figure.name})", "",
            markdown_table(first_eigenvalue_table(studies), 2), "", *orderings(studies), "",
            "Effective ranks (layer mean, % of H, mean ± sd over seeds) and each method's gap to Standard MHA, "
            "paired by seed (± the 95% t half-width), beside Table 3's:", "",
            markdown_table(rank_table(studies), 1), "", loss_line(studies), "", *timing_lines(), ""]


def record_timing(logs: list[str]) -> None:
    """Parse `headlab reproduce`'s log (run lines '(1130 s)') and `/usr/bin/time -v`'s summary into TIMING."""
    rows = []
    for spec in logs:
        name, path = spec.split("=", 1)
        text = Path(path).read_text(errors="replace")
        walls = [float(s) for s in re.findall(r"seed \d+: validation loss [\d.]+ \S+ \((\d+) s\)", text)]
        user = re.search(r"User time \(seconds\): ([\d.]+)", text)
        system = re.search(r"System time \(seconds\): ([\d.]+)", text)
        if not walls or user is None:
            print(f"{name}: {path} has {len(walls)} finished runs and no /usr/bin/time summary yet")
            continue
        rows.append({"study": name, "runs": len(walls), "run_wall_median": float(pd.Series(walls).median()),
                     "run_wall_min": min(walls), "run_wall_max": max(walls),
                     "cpu_seconds": float(user.group(1)) + float(system.group(1))})
    if rows:
        atomic_write_text(TIMING, pd.DataFrame(rows).to_csv(index=False))
