"""The section of science/real_checkpoints.md on our own six methods at the paper's layout: cpu-deep (12
layers x 6 heads), 3 seeds, under the paper's recipe and with AdamW on W_Q, W_K, from the rows that
`science/fig11_measures.py measure` wrote (science/tables/fig11_cpu-deep*) and the training logs' times
(science/tables/deep_timing.csv, `science/real_checkpoints.py timing`)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from real_figures import PANELS, ROLE_LABELS, paper_layout

from headlab.analysis.measures import spearman
from headlab.io import atomic_write_text
from headlab.report.paper_tables import markdown_table
from headlab.study.paper import PAPER, PAPER_PANELS, SEED_SPECTRA
from headlab.study.seed_distance import resampled
from headlab.study.stats import paired_difference, spread

TABLES = Path(__file__).resolve().parent / "tables"
RECIPES = {"cpu-deep": "Muon (the paper's recipe)", "cpu-deep-adamw-qk": "AdamW on W_Q, W_K"}
COMMANDS = {"cpu-deep": "headlab reproduce --preset cpu-deep --seeds 3 --jobs 2 --out runs/cpu-deep",
            "cpu-deep-adamw-qk": "headlab reproduce --preset cpu-deep --set muon_qk=false --seeds 3 --jobs 2 "
                                 "--out runs/cpu-deep-adamw-qk"}
TIMING = TABLES / "deep_timing.csv"


def loaded() -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    out = {}
    for name in RECIPES:
        layers, spectra = (TABLES / f"fig11_{name}_{t}.csv.gz" for t in ("layers", "spectra"))
        if layers.exists():
            weights = lambda t: t[t["measure"] == "weights"]  # noqa: E731
            out[name] = weights(pd.read_csv(layers)), weights(pd.read_csv(spectra))
    return out


def cell(values) -> str:
    return f"{spread(list(values)).format(2)} ({len(values)})" if len(values) else "–"


def first_eigenvalue_table(studies: dict) -> pd.DataFrame:
    rows = []
    for role, label in ROLE_LABELS.items():
        for panel in PANELS:
            seed = SEED_SPECTRA[role][panel]
            row = {"method (paper's)": label, "panel": f"{panel} (L={PAPER_PANELS[panel]})",
                   "seed figure λ₁: read (sum 6)": f"{seed.first:.1f} ({resampled(seed.eigenvalues())[0]:.2f})"}
            for name, (_, spectra) in studies.items():
                here = spectra[(spectra["role"] == role) & (spectra["panel"] == panel)]
                row[f"{RECIPES[name]}: λ₁ (seeds)"] = cell(here[here["state"] == "trained"]["l1"])
                row[f"{RECIPES[name]}: at init"] = spread(list(here[here["state"] == "init"]["l1"])).format(2)
            rows.append(row)
    return pd.DataFrame(rows)


def orderings(studies: dict) -> list[str]:
    """Per recipe: Spearman of our six λ₁ (mean over seeds) with the seed's six as read, per panel; and how
    many of the 18 mean curves drop sharply after index 1 (λ₁ − λ₂ > λ₂ − λ₆)."""
    lines = []
    for name, (_, spectra) in studies.items():
        trained = spectra[spectra["state"] == "trained"]
        means = trained.groupby(["role", "panel"])[[f"l{i}" for i in range(1, 7)]].mean()
        rhos = []
        for panel in PANELS:
            at = means.xs(panel, level="panel")
            rhos.append(spearman(at["l1"], pd.Series({r: SEED_SPECTRA[r][panel].first for r in at.index})))
        drops = sum(row["l1"] - row["l2"] > row["l2"] - row["l6"] for _, row in means.iterrows())
        lines.append(f"{RECIPES[name]}: Spearman of our six λ₁ with the seed's, L = 0 / 6 / 11: "
                     f"{' / '.join(f'{r:+.2f}' for r in rhos)}; a sharp drop after index 1 (λ₁ − λ₂ > λ₂ − λ₆) in "
                     f"{drops} of {len(means)} mean curves (the seed figure: 18 of 18).")
    return lines


def rank_table(studies: dict) -> pd.DataFrame:
    """Per method: layer-mean effective rank (% of H), both kinds, and the gap to MHA paired by seed (95%
    interval), beside Table 3's values and gaps."""
    rows = []
    for role, label in ROLE_LABELS.items():
        row = {"method (paper's)": label, "Table 3 u / c": f"{PAPER[role].uncentered} / {PAPER[role].centered}"}
        if role != "mha":
            row["Table 3 gap to MHA u / c"] = (f"{PAPER[role].uncentered - PAPER['mha'].uncentered:+.1f} / "
                                               f"{PAPER[role].centered - PAPER['mha'].centered:+.1f}")
        for name, (layers, _) in studies.items():
            trained = layers[layers["state"] == "trained"]
            per_seed = trained.groupby(["role", "kind", "seed"])["er_pct"].mean()
            for kind, short in (("uncentered", "u"), ("centered", "c")):
                ours = per_seed.xs((role, kind), level=("role", "kind")) if (role, kind) in per_seed else pd.Series()
                row[f"{RECIPES[name]}: ER {short}"] = spread(list(ours)).format(1) if len(ours) else "–"
                if role != "mha" and len(ours):
                    mha = per_seed.xs(("mha", kind), level=("role", "kind"))
                    both = pd.concat([ours, mha], axis=1, keys=["v", "m"]).dropna()
                    gap = paired_difference(both["v"], both["m"]) if len(both) > 1 else None
                    row[f"{RECIPES[name]}: gap {short}"] = gap.format(1) if gap else "–"
        rows.append(row)
    return pd.DataFrame(rows)


def loss_line(studies: dict) -> str:
    parts = []
    for name, (layers, _) in studies.items():
        loss = layers.drop_duplicates(["role", "seed"]).groupby("role")["val_loss"]
        parts.append(f"{RECIPES[name]}: " + ", ".join(
            f"{ROLE_LABELS[r]} {spread(list(v)).format(3)}" for r, v in loss if r in ROLE_LABELS))
    return "Validation loss (nats/byte, mean ± sd over seeds): " + "; ".join(parts) + "."


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
    paper_layout({f"cpu-deep, {RECIPES[n]}": s for n, (_, s) in studies.items()}, figure)
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
