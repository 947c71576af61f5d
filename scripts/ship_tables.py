"""Ship a finished study's tables (not its runs) inside the package, as headlab/study/shipped/<preset>/
(`headlab.study.table_files.shipped_folder`), so notebooks installed without the repository (Colab)
show that study's results without training (`headlab.study.tables.shipped_tables`).

    python scripts/ship_tables.py runs/reproduce          # make ship-demo: after make demo (cpu-small)
    python scripts/ship_tables.py runs/qk                 # headlab reproduce --preset cpu-small-adamw-qk --out runs/qk
    python scripts/ship_tables.py --analysis DIR --name NAME   # an analysis of one model (a pretrained checkpoint)

The tables are read back verified against the study's study.json and written with their own
study.json, whose meta gains `shipped`: the settings key of the runs as their config.json files
record them (checked against this checkout's, since tables of other settings would never be
used), the commits and headlab version that trained them, and a one-line note the notebooks print.

    python scripts/ship_tables.py --add-init cpu-small    # shipped tables older than init_spectra, init_summary
    python scripts/ship_tables.py --rekey cpu-small       # after TrainConfig gained fields that keep their defaults
    python scripts/ship_tables.py --conclusions cpu-small # shipped tables older than their conclusions, or their code

adds the random-initialisation baseline to shipped tables written before a study made it, without their
runs: each run's step-0 weights are its config's draw with its seed (`headlab.study.tables.initial_weights`),
checked against the step-0 rows of the shipped snapshot_summary (the runs' own step-0 snapshots);
--conclusions writes the conclusion tables (claims, seed distances, spreads: `headlab.study.conclusions`)
beside shipped tables older than them, which reading would compute each time, or again after their code changed.

An analysis folder (`headlab analyze --out DIR`, `Analysis.save`: the tables of one model, such as a
pretrained checkpoint, no seeds) ships verified as it is, under the name given.

    python scripts/ship_tables.py --through-training science/regime_study.md

ships the regime study's two views through training (MHA, L = 0, weights and data-aware λ₁ at six
steps of each recipe, means over seeds) as `regime-through-training`: the table of the page, which
`regime_study.py page` prints from its probed runs (their per-run CSVs stay under its ROOT)."""

import argparse
import itertools
import json
import sys
from dataclasses import asdict, fields
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

from headlab.analysis.similarity import Analysis
from headlab.analysis.tables import save_tables
from headlab.io import read_regular
from headlab.model.config import ModelConfig, preset
from headlab.runs.layout import EXECUTION_FIELDS
from headlab.study.conclusions import conclusions, without_conclusions
from headlab.study.study import Study, StudyRun, settings_digest, settings_key
from headlab.study.table_files import (
    SHIPPED_ROOT,
    StudyTables,
    read_shipped,
    read_study_tables,
    shipped_folder,
    write_study_tables,
)
from headlab.study.tables import init_tables
from headlab.training.config import TrainConfig

LIMIT_BYTES = 3 << 20  # the package stays small: a wheel with the tables, not a data set


def ship(study_folder: Path, destination: Path | None = None) -> StudyTables:
    """Write the tables of `study_folder` into `destination` (default: the package's folder of the
    study's preset, SHIPPED_ROOT/<preset>); returns them as read back."""
    tables = read_study_tables(study_folder)
    meta = tables.meta
    study = Study(meta["preset"], meta["steps"], study_folder)
    configs = [json.loads(read_regular(study.run_folder(config, seed) / "config.json"))
               for seed in meta["seeds"] for config in study.variants]
    # read as configs: config.json names a field added since the previous release only away from its default
    recorded = settings_digest([[ModelConfig.from_dict(c["model"]).to_dict(), asdict(TrainConfig.from_dict(c["train"]))]
                                for c in configs[:len(study.variants)]])
    if recorded != settings_key(study.preset, study.steps):
        raise ValueError(f"the runs in {study_folder} were trained with other settings than this checkout's "
                         f"{study.preset} ({recorded} != {settings_key(study.preset, study.steps)}): notebooks would "
                         "never read these tables; train the study again here")
    size = sum(len(table.to_csv(index=False).encode()) for table in tables.tables.values())
    if size > LIMIT_BYTES:
        raise ValueError(f"the tables take {size / 2**20:.1f} MB, more than the {LIMIT_BYTES >> 20} MB a package ships")
    commits = sorted({c["git_commit"] or "unknown" for c in configs})
    versions = sorted({c["headlab_version"] for c in configs})
    note = (f"{study.preset}, {len(meta['seeds'])} seeds x {len(study.variants)} variants, {meta['steps']:,} steps, "
            f"trained at commit {', '.join(c[:12] for c in commits)}, shipped {date.today().isoformat()}")
    shipped = {"settings_key": recorded, "commits": commits, "headlab_versions": versions, "note": note}
    destination = destination or SHIPPED_ROOT / study.preset
    write_study_tables(StudyTables(tables.tables, {**meta, "shipped": shipped}), destination)
    return read_study_tables(destination)


def ship_analysis(folder: Path, name: str, root: Path = SHIPPED_ROOT) -> Analysis:
    """Write the analysis in `folder` (verified on reading) into root/<name>; returns it as read back."""
    if not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"--name {name!r} is invalid: a folder name (letters, digits, '-', '.')")
    analysis = Analysis.load(folder)
    size = sum(len(getattr(analysis, table).to_csv(index=False).encode()) for table in ("similarity", "spectra",
                                                                                      "summary"))
    if size > LIMIT_BYTES:
        raise ValueError(f"the tables take {size / 2**20:.1f} MB, more than the {LIMIT_BYTES >> 20} MB a package ships")
    analysis.save(root / name)
    return Analysis.load(root / name)


THROUGH_TRAINING = "regime-through-training"  # the shipped name of the regime study's probe table
THROUGH_HEADING = "Both views through training (MHA, L = 0)"  # the line above it on the page
# the page's settings, as the recipes' names (`headlab.study.table_files.recipe_name`)
THROUGH_RECIPES = {"Muon (default)": "Muon split", "AdamW on W_Q, W_K": "AdamW on W_Q, W_K"}


def ship_through_training(page: Path, root: Path = SHIPPED_ROOT) -> StudyTables:
    """The table below `THROUGH_HEADING` on the regime study's page, as `through_training` (recipe,
    role, layer, n_heads, seeds, step, weights_lambda1, data_aware_lambda1, gap; the page's two decimals) in
    root/`THROUGH_TRAINING`, with the page's commands in its meta; returns it as read back."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith(THROUGH_HEADING)), None)
    if start is None:
        raise ValueError(f"{page} has no line starting {THROUGH_HEADING!r}: is it the regime study's page?")
    table = [line for line in itertools.takewhile(lambda line: line.startswith("|") or not line.strip() or
                                                  line.startswith("    "), lines[start + 1:]) if line.startswith("|")]
    header, rows = [c.strip() for c in table[0].strip("|").split("|")], table[2:]
    frame = pd.DataFrame([[c.strip() for c in row.strip("|").split("|")] for row in rows], columns=header)
    if header != ["setting", "seeds", "step", "weights λ₁", "data-aware λ₁", "gap"] or \
            not set(frame["setting"]) <= set(THROUGH_RECIPES):
        raise ValueError(f"the table below {THROUGH_HEADING!r} in {page} is not the one this script reads ({header})")
    shipped = pd.DataFrame({"recipe": frame["setting"].map(THROUGH_RECIPES), "role": "mha", "layer": 0,
                            "n_heads": preset("cpu-small").n_head,
                            "seeds": frame["seeds"].astype(int), "step": frame["step"].astype(int),
                            "weights_lambda1": frame["weights λ₁"].astype(float),
                            "data_aware_lambda1": frame["data-aware λ₁"].astype(float),
                            "gap": frame["gap"].astype(float)})
    commands = [line.strip() for line in lines[start + 1:start + 6] if line.startswith("    ")]
    meta = {"source": f"{page.name}: {THROUGH_HEADING}", "commands": commands, "preset": "cpu-small",
            "note": "means over seeds at the page's precision (two decimals); the probed runs' per-step CSVs are not "
                    f"shipped. Shipped {date.today().isoformat()}"}
    save_tables(root / THROUGH_TRAINING, {"through_training": shipped}, "tables.json", "a folder of tables", meta)
    return read_shipped(THROUGH_TRAINING, root)


def add_init(destination: Path) -> StudyTables:
    """Add init_spectra and init_summary to the shipped tables in `destination` (their meta unchanged),
    drawn from the study's configs and seeds, after checking that they reproduce the runs' step-0
    snapshots (the step-0 rows of snapshot_summary, to 1e-8); returns the tables as read back."""
    tables = read_study_tables(destination)
    meta = tables.meta
    study = Study(meta["preset"], meta["steps"], destination / "no-runs")  # no run folders: every draw is rebuilt
    runs = [StudyRun(role, config, seed, study.run_folder(config, seed))
            for seed in meta["seeds"] for role, config in study.roles.items()]
    init = init_tables(runs)
    snapshots = tables["snapshot_summary"]
    keys = ["model", "layer", "circuit", "measure", "mla_rope", "kind", "seed"]
    paired = init["init_summary"].merge(snapshots[snapshots["step"] == 0], on=keys, suffixes=("", "_snapshot"))
    if len(paired) != len(init["init_summary"]) or not np.allclose(
            paired["effective_rank"], paired["effective_rank_snapshot"], rtol=0, atol=1e-8):
        raise ValueError(f"the configs' draws are not the step-0 snapshots of the runs behind {destination}: "
                         "ship a study trained at this checkout instead (headlab reproduce, then ship_tables.py STUDY)")
    write_study_tables(StudyTables({**tables.tables, **init}, meta), destination)
    return read_study_tables(destination)


def write_conclusions(destination: Path) -> StudyTables:
    """Write into the shipped tables of `destination` the conclusion tables computed from their other
    tables (`headlab.study.conclusions`), their meta unchanged: for tables shipped before studies kept
    their conclusions, which reading would compute each time, and after the conclusions' code
    changed. Returns the tables as read back."""
    tables = read_study_tables(destination)
    kept = without_conclusions(tables.tables)
    write_study_tables(StudyTables({**kept, **conclusions(kept, tables.meta)}, tables.meta), destination)
    return read_study_tables(destination)


def rekey(destination: Path) -> StudyTables:
    """Record today's settings_key in the shipped tables of `destination` when their runs were trained
    with today's settings, the key's rule having changed since (fields added, how a run executes left
    out): the recipe the study recorded (meta["train"]) must be today's on every field it names, and every
    field it lacks must hold its default today (the runs trained as that default does). Returns the
    tables as read back."""
    tables = read_study_tables(destination)
    meta = tables.meta
    study = Study(meta["preset"], meta["steps"], destination / "no-runs")
    today = asdict(study.train_config(0))
    elsewhere = ("steps", "seed", *EXECUTION_FIELDS)  # the study's meta records these apart from its recipe
    changed = {name: (value, today[name]) for name, value in meta["train"].items() if today.get(name) != value}
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    added = [name for name in today if name not in meta["train"] and name not in elsewhere]
    changed |= {name: ("absent", today[name]) for name in added if today[name] != defaults[name]}
    if changed or int(meta["steps"]) != study.train_config(0).steps:
        raise ValueError(f"the shipped tables were trained with other settings ({changed or 'steps'}): train and "
                         "ship the study again (headlab reproduce, then scripts/ship_tables.py STUDY)")
    shipped = {**meta["shipped"], "settings_key": settings_key(study.preset, study.steps)}
    write_study_tables(StudyTables(tables.tables, {**meta, "shipped": shipped}), destination)
    return read_study_tables(destination)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, nargs="?", help="a finished study folder (headlab reproduce --out)")
    parser.add_argument("--rekey", metavar="NAME",
                        help="record today's settings key in the shipped tables NAME after the key's rule changed, "
                             "when their recipe is today's (checked), instead (no study)")
    parser.add_argument("--add-init", metavar="NAME",
                        help="add the random-initialisation baseline to the shipped tables NAME instead (no study)")
    parser.add_argument("--conclusions", metavar="NAME",
                        help="write the conclusion tables computed from the shipped tables NAME into them instead "
                             "(no study)")
    parser.add_argument("--analysis", type=Path, metavar="DIR", help="ship an analysis folder as --name instead")
    parser.add_argument("--name", help="the name an analysis ships under (with --analysis)")
    parser.add_argument("--through-training", type=Path, metavar="PAGE",
                        help="ship the regime study's page's table of both views through training instead")
    args = parser.parse_args()
    chosen = (args.add_init, args.conclusions, args.rekey, args.study, args.analysis, args.through_training)
    if sum(option is not None for option in chosen) != 1 or (args.analysis is None) != (args.name is None):
        parser.error("give one of: a study folder, --add-init NAME, --conclusions NAME, --rekey NAME, "
                     "--analysis DIR --name NAME, --through-training PAGE")
    try:
        if args.through_training:
            table = ship_through_training(args.through_training)["through_training"]
            print(f"shipped {len(table)} rows as {SHIPPED_ROOT / THROUGH_TRAINING}")
            sys.exit(0)
        if args.analysis:
            ship_analysis(args.analysis, args.name)
            print(f"shipped the analysis in {args.analysis} as {SHIPPED_ROOT / args.name}")
            sys.exit(0)
        shipped = (add_init(shipped_folder(args.add_init)) if args.add_init else
                   write_conclusions(shipped_folder(args.conclusions)) if args.conclusions else
                   rekey(shipped_folder(args.rekey)) if args.rekey else ship(args.study))
    except (ValueError, OSError) as error:
        print(f"ship_tables: error: {error}", file=sys.stderr)
        sys.exit(2)
    folder = SHIPPED_ROOT / shipped.meta["preset"]
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"shipped {len(shipped.tables)} tables ({size / 2**20:.2f} MB) to {folder}: "
          f"{shipped.meta['shipped']['note']}")
