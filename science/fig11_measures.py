"""What can Fig. 11 be? (issue 43) Every candidate head similarity of `headlab.analysis.candidates`, on
our models under both recipes and on the real checkpoints, scored against the seed figure and against
Table 3 (`science/fig11_scores.py` has the scores' definitions).

    python science/fig11_measures.py measure --study cpu-small=runs/cpu-small:cpu-small \\
        --study cpu-small-adamw-qk=runs/qk:cpu-small --study cpu-deep=runs/cpu-deep:cpu-deep \\
        --study cpu-deep-adamw-qk=runs/cpu-deep-adamw-qk:cpu-deep
    python science/fig11_measures.py page

`measure` reads every finished run of each study folder (NAME=FOLDER:PRESET; never writes there) and
writes its rows to science/tables/fig11_<NAME>_{layers,spectra}.csv.gz (`science/fig11_runs.py`);
`page` reads those and the real checkpoints' tables (headlab/study/real_tables) and writes
science/fig11_measures.md.
"""

from __future__ import annotations

import argparse
import gzip
import textwrap
from pathlib import Path

import pandas as pd
import torch
from fig11_methods import first_eigenvalue_table, loss_line, orderings, rank_table, study_tables
from fig11_runs import study_rows
from fig11_scores import FIG11_MARGINS, TABLE3_MARGIN, fig11_scores, real_scores, reproduces, table3_scores

from headlab.analysis.candidates import INPUT_CANDIDATES, WEIGHT_CANDIDATES
from headlab.io import atomic_write_bytes, atomic_write_text
from headlab.report.paper_tables import markdown_table
from headlab.study.real_tables import MANIFEST, REAL_TABLES, read_real_tables

TABLES = Path(__file__).resolve().parent / "tables"
MEASURES = ("weights", "data-aware", "attention maps", "OV circuit", "W_Q only", "W_K only", "raw weights",
            "unnormalised")
assert set(MEASURES) == set(WEIGHT_CANDIDATES + INPUT_CANDIDATES)
TRAININGS = {"cpu-small": "cpu-small, Muon (the paper's recipe)",
             "cpu-small-adamw-qk": "cpu-small, AdamW on W_Q, W_K",
             "cpu-deep": "cpu-deep, Muon (the paper's recipe)",
             "cpu-deep-adamw-qk": "cpu-deep, AdamW on W_Q, W_K"}


def measure(args) -> None:
    for spec in args.study:
        name, rest = spec.split("=", 1)
        folder, preset = rest.rsplit(":", 1)
        layers, spectra = study_rows(name, Path(folder), preset)
        for table, rows in (("layers", layers), ("spectra", spectra)):
            atomic_write_bytes(TABLES / f"fig11_{name}_{table}.csv.gz", gzip_csv(rows))
        print(f"{name}: {layers['seed'].nunique()} seed(s), {len(layers)} layer rows")


def gzip_csv(frame: pd.DataFrame) -> bytes:
    """The table as gzip'ed CSV bytes, numbers to 7 decimals (eigenvalues are O(1)), reproducible (no time
    stamp in the gzip header)."""
    return gzip.compress(frame.round(7).to_csv(index=False).encode(), mtime=0)


def our_rows() -> list[dict]:
    rows = []
    for name, title in TRAININGS.items():
        path = TABLES / f"fig11_{name}_layers.csv.gz"
        if not path.exists():
            continue
        layers = pd.read_csv(path)
        spectra = pd.read_csv(TABLES / f"fig11_{name}_spectra.csv.gz")
        seeds = layers.groupby("role")["seed"].nunique()
        for state in ("trained", "init"):
            for measure in MEASURES:
                here = layers[(layers["state"] == state) & (layers["measure"] == measure)]
                curves = spectra[(spectra["state"] == state) & (spectra["measure"] == measure)]
                if here.empty:
                    continue
                scores = {**fig11_scores(curves), **table3_scores(here)}
                rows.append({"measure": measure, "training": title + (", random init" if state == "init" else ""),
                             "seeds": f"{seeds.min()}–{seeds.max()}" if seeds.min() != seeds.max() else seeds.min(),
                             **scores, "state": state})
    return rows


def real_rows() -> list[dict]:
    if not (REAL_TABLES / MANIFEST).exists():
        return []
    tables = read_real_tables()
    rows = []
    for state in ("trained", "gaussian"):
        for measure in MEASURES:
            summary = tables["summary"][(tables["summary"]["state"] == state)
                                        & (tables["summary"]["measure"] == measure)]
            if summary.empty:
                continue
            spectra = tables["spectra"][(tables["spectra"]["state"] == state)
                                        & (tables["spectra"]["measure"] == measure)]
            rows.append({"measure": measure, "training": "real checkpoints" + (
                ", random Gaussian weights" if state == "gaussian" else ""), "seeds": "–",
                **real_scores(summary, spectra, tables["models"]), "ρ": float("nan"), "MQA − MHA": float("nan"),
                "state": state})
    return rows


def verdict(rows: pd.DataFrame) -> str:
    """The page's conclusion, every number from the table."""
    trained = rows[rows["state"] == "trained"]
    ours = trained[~trained["training"].str.startswith("real")]
    both = [r for _, r in trained.iterrows() if all(reproduces(r))]
    figure_only = [r for _, r in trained.iterrows() if reproduces(r)[0]]
    table_only = [r for _, r in trained.iterrows() if reproduces(r)[1]]
    shape = ours.sort_values("d₁").iloc[0]
    first = ours.sort_values("Δλ₁").iloc[0]
    table = ours.assign(t=ours["ΔER_u"] + ours["ΔER_c"]).sort_values("t").iloc[0]
    say = lambda r: f"{r['measure']} on {r['training']}"  # noqa: E731

    def at_init(r) -> str:
        init = rows[(rows["measure"] == r["measure"]) & (rows["training"] == r["training"] + ", random init")]
        return "" if init.empty else (f"; the same runs at random initialisation: d₁ {init['d₁'].iloc[0]:.2f}, Δλ₁ "
                                      f"{init['Δλ₁'].iloc[0]:.2f}, drops {init['drops'].iloc[0]}")

    answer = ("Yes: " + "; ".join(say(r) for r in both) + " meets both margins." if both else
              "No single (measure, training) reproduces both.")
    return (f"{answer} Within Fig. 11's margins (Δλ₁ ≤ {FIG11_MARGINS['Δλ₁']}, d₁ ≤ {FIG11_MARGINS['d₁']}, ρ ≥ "
            f"{FIG11_MARGINS['ρ']}): {', '.join(say(r) for r in figure_only) or 'none'}. Within Table 3's "
            f"(≤ {TABLE3_MARGIN:g} points uncentred and centred): {', '.join(say(r) for r in table_only) or 'none'}. "
            f"Closest to Fig. 11's shape: {say(shape)} (d₁ {shape['d₁']:.2f}, Δλ₁ {shape['Δλ₁']:.2f}, drops "
            f"{shape['drops']}{at_init(shape)}); closest in λ₁: {say(first)} (Δλ₁ {first['Δλ₁']:.2f}"
            f"{at_init(first) if say(first) != say(shape) else ''}); closest to Table 3: {say(table)} (ΔER_u "
            f"{table['ΔER_u']:.1f}, ΔER_c {table['ΔER_c']:.1f}, MQA − MHA {table['MQA − MHA']:+.1f} against the "
            f"paper's −22.8; Fig. 11: Δλ₁ {table['Δλ₁']:.2f}, d₁ {table['d₁']:.2f}, drops {table['drops']}). Every "
            "candidate's eigenvalues sum to H (a cosine matrix's trace); the seed's, read off a figure, sum to "
            "4.9–7.5, so each seed curve is scaled to sum 6 before λ₁ is compared, and d₁ compares both spectra "
            "divided by their sums.")


def page(args) -> None:
    rows = pd.DataFrame(our_rows() + real_rows())
    shown = rows.drop(columns="state").fillna("–")
    lines = ["# What can Fig. 11 be? (issue 43)", "", verdict(rows), "", "## The scores", "",
             open_note(), "", markdown_table(shown, 2), "", *method_sections(), "## Commands", "",
             *(f"    {line}" for line in textwrap.dedent(__doc__.split("\n\n")[1]).strip().splitlines()), ""]
    atomic_write_text(args.out, "\n".join(lines))
    print(f"page: {args.out}")


def method_sections() -> list[str]:
    """Per study, the paper's measure (weights view) method by method: λ₁ beside the seed's, the ordering,
    the drop after index 1, the effective-rank gaps to MHA beside Table 3's."""
    lines = []
    for name, title in TRAININGS.items():
        tables = study_tables(name, "weights")
        if tables is None:
            continue
        studies = {title: tables}
        lines += [f"## {title}: the weights view method by method", "",
                  markdown_table(first_eigenvalue_table(studies), 2), "", *orderings(studies), "",
                  markdown_table(rank_table(studies), 1), "", loss_line(studies), ""]
    return lines


def open_note() -> str:
    return ("Every candidate's matrix has trace H (a cosine matrix's diagonal is 1; the unnormalised Gram is "
            "scaled to it), so its eigenvalues sum to H = 6 for our models. The seed's curves were read off a "
            "figure and sum to 4.9–7.5: each is divided by its sum and multiplied by 6 before λ₁ is compared "
            "(MHA at L = 0: 5.0 of 7.5 becomes 4.0); d₁ compares shapes after both are divided by their sums. "
            "Rows 'random init' are the same runs' step-0 weights (the data-aware view there under the trained "
            "model's input moments); real checkpoints are set beside their attention family's seed curve and "
            "Table 3 row (MiniLM: MHA, SmolLM2: GQA, whose 128M row the paper estimated, Gemma 3: MQA), λ₁ at six "
            "heads, and beside random Gaussian weights of the same shapes. Effective ranks are layer means, % of H; "
            "MQA − MHA: our uncentred gap (the paper's: −22.8 points). 'drops': curves with λ₁ − λ₂ > λ₂ − λ_H.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="measure every finished run of the studies")
    run.add_argument("--study", action="append", required=True, metavar="NAME=FOLDER:PRESET")
    write = commands.add_parser("page", help="write the page from the measured tables")
    write.add_argument("--out", type=Path, default=Path("science/fig11_measures.md"))
    args = parser.parse_args()
    (measure if args.command == "measure" else page)(args)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
