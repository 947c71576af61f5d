"""The recipe question of science/scale_study.md: one comparison trained under several
training recipes (same preset, seeds, data order and initial weights), side by side.

    python science/recipe_study.py adamw=runs/recipe-small/x1-optimizeradamw \
        muon=runs/recipe-small/x1-optimizermuon --preset cpu-small --out runs/recipe-small/recipe.md

Each NAME=FOLDER is a finished study folder (a `headlab reproduce` or `headlab sweep` point): its
runs are loaded (never retrained), tabulated and reported in place (report.md, with its settled /
still moving marks), then the page at --out sets the recipes side by side:
  1. each comparison's paired difference to Standard MHA under each recipe (95% rule);
  2. what the recipe does to each variant: the later recipe minus the first, paired by seed (the
     same seed is the same initial draw and data order under every recipe);
  3. LRKV's factors (norm ratio, principal angles) and MHA's rank-r bound under each recipe.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
from scale_study import study_runs

from headlab.data.corpus import load_corpus
from headlab.io import atomic_write_text
from headlab.report.paper_tables import markdown_table
from headlab.report.writer import write_report
from headlab.study.claims import METRICS, difference_to_mha, per_seed_metrics, values, variant_name, variant_rows
from headlab.study.stats import paired_difference, spread
from headlab.study.tables import tabulate_study


def shown(difference) -> str:
    """A paired difference as the report shows it: an ordering only where the interval excludes zero."""
    return difference.format(3) if difference.decided else f"noise, {difference.format(3)}"


def recipe_page(studies: dict[str, tuple[pd.DataFrame, object]]) -> str:
    """The page's markdown from {recipe: (per-seed metrics, tables)}."""
    names = list(studies)
    first = studies[names[0]][0]
    differences, effects = [], []
    for role, model, mla_rope in variant_rows(first):
        name = variant_name(role, model, mla_rope)
        for column, (what, unit, _) in METRICS.items():
            if column == "val_loss" and mla_rope != "included":
                continue
            row = {"comparison": f"{name}: {what}"}
            effect = {"variant": name, "metric": what}
            for recipe in names:
                metrics = studies[recipe][0]
                if role != "mha":
                    row[recipe] = shown(difference_to_mha(metrics, role, mla_rope, column))
                effect[recipe] = spread(values(metrics, role, mla_rope, column)).format(3)
            for recipe in names[1:]:
                effect[f"{recipe} − {names[0]}"] = shown(paired_difference(
                    values(studies[recipe][0], role, mla_rope, column), values(first, role, mla_rope, column)))
            if role != "mha":
                differences.append(row)
            effects.append(effect)
    factor_tables = [studies[recipe][1]["factor_table"].assign(recipe=recipe) for recipe in names]
    bound_tables = [studies[recipe][1]["rank_bound_table"].assign(recipe=recipe) for recipe in names]
    factor_table = pd.concat(factor_tables, ignore_index=True)
    bound_table = pd.concat(bound_tables, ignore_index=True)
    return "\n".join([
        "### Paired difference to Standard MHA under each recipe",
        "",
        markdown_table(pd.DataFrame(differences), 3),
        "",
        f"### What the recipe does to each variant (mean ± sd over seeds; {', '.join(names[1:])} − {names[0]} "
        "paired by seed)",
        "",
        markdown_table(pd.DataFrame(effects), 3),
        "",
        "### LRKV's factors under each recipe",
        "",
        markdown_table(factor_table[["recipe", *factor_tables[0].columns[:-1]]], 3),
        "",
        "### The best a rank-r residual could do for MHA, under each recipe",
        "",
        markdown_table(bound_table[["recipe", *bound_tables[0].columns[:-1]]], 1),
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("studies", nargs="+", metavar="NAME=FOLDER", help="finished study folders, one per recipe")
    parser.add_argument("--preset", default="cpu-small")
    parser.add_argument("--out", type=Path, required=True, help="the page (markdown) to write")
    args = parser.parse_args()
    corpus = load_corpus("shakespeare")
    studies = {}
    for item in args.studies:
        name, _, folder = item.partition("=")
        start = time.perf_counter()
        runs = study_runs(Path(folder), args.preset)
        tables = tabulate_study(runs, corpus, args.preset, folder)
        report = write_report(tables, folder)
        studies[name] = (per_seed_metrics(tables["summary"], tables["training"]), tables)
        print(f"{name}: {len(runs)} runs from {folder}, report {report} ({time.perf_counter() - start:.0f} s)")
    atomic_write_text(args.out, recipe_page(studies))
    print(f"recipe page: {args.out}")


if __name__ == "__main__":
    main()
