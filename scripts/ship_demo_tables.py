"""Ship a finished study's tables (not its runs) inside the package, as headlab/study/demo_tables/
(`headlab.study.table_files.SHIPPED`), so notebooks installed without the repository (Colab) show
that study's results without training (`headlab.study.tables.shipped_tables`).

    python scripts/ship_demo_tables.py runs/reproduce     # make ship-demo: after make demo

The tables are read back verified against the study's study.json and written with their own
study.json, whose meta gains `shipped`: the settings key of the runs as their config.json files
record them (checked against this checkout's, since tables of other settings would never be
used), the commits and headlab version that trained them, and a one-line note the notebooks print."""

import argparse
import json
import sys
from datetime import date
from pathlib import Path

from headlab.io import read_regular
from headlab.study.study import Study, settings_digest, settings_key
from headlab.study.table_files import SHIPPED, StudyTables, read_study_tables, write_study_tables

LIMIT_BYTES = 3 << 20  # the package stays small: a wheel with the tables, not a data set


def ship(study_folder: Path, destination: Path) -> StudyTables:
    """Write the tables of `study_folder` into `destination` (the package's: `SHIPPED`); returns them as read back."""
    tables = read_study_tables(study_folder)
    meta = tables.meta
    study = Study(meta["preset"], meta["steps"], study_folder)
    configs = [json.loads(read_regular(study.run_folder(config, seed) / "config.json"))
               for seed in meta["seeds"] for config in study.variants]
    recorded = settings_digest([[c["model"], c["train"]] for c in configs[:len(study.variants)]])
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
    write_study_tables(StudyTables(tables.tables, {**meta, "shipped": shipped}), destination)
    return read_study_tables(destination)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a finished study folder (headlab reproduce --out)")
    args = parser.parse_args()
    try:
        shipped = ship(args.study, SHIPPED)
    except (ValueError, OSError) as error:
        print(f"ship_demo_tables: error: {error}", file=sys.stderr)
        sys.exit(2)
    size = sum(p.stat().st_size for p in SHIPPED.iterdir())
    print(f"shipped {len(shipped.tables)} tables ({size / 2**20:.2f} MB) to {SHIPPED}: "
          f"{shipped.meta['shipped']['note']}")
