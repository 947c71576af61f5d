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
    timing = pd.read_csv(TIMING).set_index("study")
    lines = []
    for study, t in timing.iterrows():
        head = (f"{RECIPES.get(study, study)}: {int(t['runs'])} runs, {t['run_wall_median']:.0f} s wall each at the "
                f"median ({t['run_wall_min']:.0f}–{t['run_wall_max']:.0f}) two at a time on the shared machine")
        if pd.notna(t["cpu_seconds"]):
            lines.append(f"{head}; {t['cpu_seconds']:,.0f} CPU-s in all (`/usr/bin/time`, training and analysis), "
                         f"{t['cpu_seconds'] / t['runs']:.0f} CPU-s a run, so on two free cores (two runs at a time, "
                         f"one thread each) about {t['cpu_seconds'] / 2 / 60:.0f} min.")
            continue
        lines.append(f"{head}; its `/usr/bin/time` summary was lost (the job stopped after its last run, before its "
                     f"report), and the resume that analysed the runs and wrote the report took "
                     f"{t['analysis_cpu_seconds']:,.0f} CPU-s." + sampled(study, timing))
    return lines


def sampled(study: str, timing: pd.DataFrame) -> str:
    """The study's CPU time estimated from a sample of its runs timed beside the same sample of a study
    whose whole time is known: its CPU-s × (this sample's / that sample's)."""
    known = timing[timing["cpu_seconds"].notna() & timing["sample_cpu_seconds"].notna()]
    here = timing.loc[study]
    if known.empty or pd.isna(here["sample_cpu_seconds"]):
        return ""
    other = known.iloc[0]
    estimate = other["cpu_seconds"] * here["sample_cpu_seconds"] / other["sample_cpu_seconds"]
    return (f" Timed afterwards, together on the same machine, the same runs of both recipes ({here['sample']}, "
            f"their training by `headlab reproduce` under `/usr/bin/time`): {RECIPES.get(study, study)} "
            f"{here['sample_cpu_seconds']:,.0f} CPU-s, {RECIPES.get(other.name, other.name)} "
            f"{other['sample_cpu_seconds']:,.0f}; so this study took about {estimate:,.0f} CPU-s, about "
            f"{estimate / 2 / 60:.0f} min on two free cores.")


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
            markdown_table(rank_table(studies), 1), "", loss_line(studies), "",
            *(part for line in timing_lines() for part in (line, ""))]


def record_timing(logs: list[str], samples: list[str]) -> None:
    """Parse `headlab reproduce`'s logs into TIMING: per study (STUDY=LOG[+RESUME_LOG]) the run lines
    ('(1130 s)') and `/usr/bin/time -v`'s summary of the training job (missing: NaN) and of its resume;
    per study (STUDY=LOG, 'runs' named in the log) a sample of its runs timed afterwards."""
    rows = []
    sampled_runs = {name: parse(path) for name, path in (spec.split("=", 1) for spec in samples)}
    for spec in logs:
        name, paths = spec.split("=", 1)
        training, *resumes = (parse(path) for path in paths.split("+"))
        if not training["walls"]:
            print(f"{name}: {paths} has no finished run yet")
            continue
        sample = sampled_runs.get(name)
        rows.append({"study": name, "runs": len(training["walls"]),
                     "run_wall_median": float(pd.Series(training["walls"]).median()),
                     "run_wall_min": min(training["walls"]), "run_wall_max": max(training["walls"]),
                     "cpu_seconds": training["cpu"], "analysis_cpu_seconds": sum(r["cpu"] for r in resumes),
                     "sample": sample["names"] if sample else "", "sample_cpu_seconds": sample["cpu"] if sample
                     else float("nan")})
    if rows:
        atomic_write_text(TIMING, pd.DataFrame(rows).to_csv(index=False))


def parse(path: str) -> dict:
    """A `headlab reproduce` log under `/usr/bin/time -v`: its finished runs' names and wall seconds, and
    user + system CPU-s (NaN without the summary)."""
    text = Path(path).read_text(errors="replace")
    runs = re.findall(r"^\s*(.+?)\s+seed (\d+): validation loss [\d.]+ \S+ \((\d+) s\)", text, re.M)
    user = re.search(r"User time \(seconds\): ([\d.]+)", text)
    system = re.search(r"System time \(seconds\): ([\d.]+)", text)
    cpu = float(user.group(1)) + float(system.group(1)) if user and system else float("nan")
    return {"walls": [float(r[2]) for r in runs], "cpu": cpu,
            "names": ", ".join(f"{r[0]} seed {r[1]}" for r in runs)}
