"""The scale study of science/scale_study.md: finished `headlab reproduce` study folders
of one preset at several training lengths, tabulated, reported (each with its settled / still
moving marks) and compared across lengths as a sweep.

    python science/scale_study.py runs/scale/cpu-small-s450 runs/scale/cpu-small-s1800 ... --out runs/scale/sweep

Each folder is read as it is (its runs are loaded, never retrained), so studies trained by an
earlier headlab can be analysed with this one; the grid point of a folder is its training length
as a multiple of the preset's steps.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from headlab.analysis.tables import save_tables
from headlab.data.corpus import load_corpus
from headlab.report.sweep_page import write_sweep_report
from headlab.report.writer import write_report
from headlab.study.claims import per_seed_metrics
from headlab.study.roles import comparison_roles
from headlab.study.study import StudyRun
from headlab.study.sweep import GridPoint, point_rows
from headlab.study.tables import tabulate_study
from headlab.training.config import train_preset
from headlab.training.runs import load_run


def study_runs(folder: Path, preset: str) -> list[StudyRun]:
    """Every finished run of a study folder as StudyRun records, by role and seed."""
    runs = []
    for role, config in comparison_roles(preset).items():
        for run_folder in sorted((folder / "runs").glob(f"{config.run_name}-seed*")):
            run = load_run(run_folder)
            runs.append(StudyRun(role, run.model_config, int(run_folder.name.rsplit("seed", 1)[1]), run_folder, run))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("folders", nargs="+", type=Path, help="finished study folders of one preset")
    parser.add_argument("--preset", default="cpu-small")
    parser.add_argument("--out", type=Path, required=True, help="where the cross-length sweep page goes")
    args = parser.parse_args()
    corpus = load_corpus("shakespeare")
    rows = []
    for folder in args.folders:
        start = time.perf_counter()
        runs = study_runs(folder, args.preset)
        steps = max(r.run.step for r in runs)
        tables = tabulate_study(runs, corpus, args.preset, folder)
        report = write_report(tables, folder)
        point = GridPoint(args.preset, steps / train_preset(args.preset).steps)
        rows += point_rows(point, per_seed_metrics(tables["summary"], tables["training"]))
        print(f"{folder}: {len(runs)} runs of {steps} steps, report {report} ({time.perf_counter() - start:.0f} s)")
    table = pd.DataFrame(rows)
    save_tables(args.out, {"sweep": table}, "sweep.json", "a sweep folder")
    print(f"sweep page: {write_sweep_report(table, args.out)}")


if __name__ == "__main__":
    main()
