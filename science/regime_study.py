"""Issue 36's regime study: which differences between the paper's training and ours give the weights
view (the uncentred head-similarity spectrum of the QK forms A_h) a dominant first eigenvalue.

    python science/regime_study.py train --out ROOT/length --lengths 4 --only mha --seeds 3
    python science/regime_study.py page --root ROOT --out science/regime_study.md

`train` trains one axis's grid points as `headlab sweep` does (each point an ordinary study folder
<out>/<point key>, finished runs reused), but takes `--only mha` alone: on a shared CPU a trend axis
that only the figure reads need not pay for MQA. `page` never trains: it reads every finished run of
the axes below under ROOT and writes the page (and its figure beside it, in figures/). Every point
of an axis differs from one shared default point (cpu-small as `make demo` trains it: Muon with
AdamW split, 16 x 64 tokens a step, 900 steps) in that axis's setting alone.

Per run and layer it measures, on the final weights:
  weights view   first eigenvalue λ₁ and entropy effective rank of the uncentred cosine similarity
                 of the A_h (`headlab.analysis.similarity.analyze`, the paper's Eq. 11);
  random init    the same of the run's step-0 snapshot (its initial draw);
  data-aware     λ₁ of the same forms under the layer's input second moments (measure "data",
                 32 validation windows): how alike the heads are on the inputs they are given;
and per run the validation loss in bits per byte. Through training, λ₁ of the weights view at
every snapshot step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
from regime_axes import PRESET, ROLES
from regime_page import page
from regime_runs import both_views, point_tables

from headlab.cli.arguments import sweep_values
from headlab.io import atomic_write_text, make_folder
from headlab.study.study import Study
from headlab.study.sweep import grid
from headlab.study.tables import MOMENT_WINDOWS, validation_windows
from headlab.training.trainer import train


def train_points(args) -> None:
    """Train every grid point of one axis (as `headlab sweep`, but any roles, MHA alone included)."""
    points = grid(PRESET, lengths=args.lengths, fields=dict(args.set or []))
    for point in points:
        key = point.key + (f"-{args.tokenizer.replace(':', '')}" if args.tokenizer != "byte" else "")
        study = Study(PRESET, point.steps, args.out / key, tokenizer=args.tokenizer,
                      model_overrides=point.model_overrides, train_overrides=point.train_overrides,
                      only=tuple(args.only))
        print(f"{key}: {study.train_config().steps} steps, {args.seeds} seed(s), {', '.join(args.only)}")
        study.train(args.seeds, progress=False, jobs=args.jobs)


def through_training(args) -> None:
    """Train one point's runs again with a probe (`train(observe=...)`) that measures, at each snapshot
    step, λ₁ of the weights view and of the data-aware view on the whole model of that step; one
    CSV per run under <out>/<point key>/through/ (the runs themselves are ordinary run folders)."""
    point, = grid(PRESET, lengths=[args.length], fields=dict(args.set or []))
    study = Study(PRESET, point.steps, args.out / point.key, model_overrides=point.model_overrides,
                  train_overrides=point.train_overrides, only=tuple(args.only))
    corpus = study.load_corpus()
    make_folder(args.out / point.key / "through")
    for seed in range(args.seeds):
        for config in study.variants:
            run_dir = study.run_folder(config, seed)
            table = args.out / point.key / "through" / f"{run_dir.name}.csv"
            if table.exists():
                continue
            windows = validation_windows(corpus, MOMENT_WINDOWS, config.seq_len)
            rows = []

            def probe(model, step):
                rows.append(both_views(model, windows)[["layer", "lambda1", "lambda1_data"]].assign(step=step))

            run = train(config, study.train_config(seed), corpus, out=run_dir, resume=True, progress=False,
                        observe=probe)
            probe(run.model, run.step)
            frame = pd.concat(rows, ignore_index=True).assign(role=ROLES[run_dir.name.rsplit("-seed", 1)[0]],
                                                               seed=seed, steps=point.steps)
            atomic_write_text(table, frame.to_csv(index=False))
            print(f"  {point.key}/{run_dir.name}: {len(rows)} steps probed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train one axis's points")
    train.add_argument("--out", type=Path, required=True)
    train.add_argument("--lengths", type=float, nargs="+", default=[1.0])
    train.add_argument("--set", type=sweep_values, action="append", metavar="FIELD=V1,V2")
    train.add_argument("--only", nargs="+", default=["mha", "mqa"])
    train.add_argument("--seeds", type=int, default=3)
    train.add_argument("--jobs", type=int, default=2)
    train.add_argument("--tokenizer", default="byte", help="byte or bpe:<vocab size> (headlab's BPE on the corpus)")
    probe = commands.add_parser("through", help="train one point's runs again, probing both views at each snapshot")
    probe.add_argument("--out", type=Path, required=True)
    probe.add_argument("--set", type=sweep_values, action="append", metavar="FIELD=V1")
    probe.add_argument("--length", type=float, default=1.0, help="the run's length, a multiple of the preset's")
    probe.add_argument("--only", nargs="+", default=["mha", "mqa"])
    probe.add_argument("--seeds", type=int, default=3)
    write = commands.add_parser("page", help="write the page from the finished runs")
    write.add_argument("--root", type=Path, required=True, help="the folder the sweeps were written to")
    write.add_argument("--out", type=Path, default=Path("science/regime_study.md"))
    args = parser.parse_args()
    if args.command in ("train", "through"):
        make_folder(args.out)
        (train_points if args.command == "train" else through_training)(args)
        return
    finals, throughs = point_tables(args.root, {})
    figure = args.out.parent / "figures" / "regime_first_eigenvalue.png"
    atomic_write_text(args.out, page(finals, throughs, figure, args.out, args.root))
    print(f"regime page: {args.out}, figure {figure}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
