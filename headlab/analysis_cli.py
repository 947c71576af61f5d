"""`headlab analyze SOURCE... --out DIR [--circuit qk|ov|both]`: analyse headlab run folders and
Hugging Face checkpoints, save the tidy tables, print each model's per-layer effective rank."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_analyze_command(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="head similarity, eigen-spectra and effective rank per layer (paper §4.3)",
        description=__doc__)
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="a headlab run folder, or a Hugging Face checkpoint folder / .safetensors file")
    p.add_argument("--out", required=True, type=Path,
                   help="folder for similarity.csv, spectra.csv, summary.csv, norms.csv, lrkv_cosine.csv")
    p.add_argument("--circuit", default="qk", choices=("qk", "ov", "both"),
                   help="qk: W_Q W_Kᵀ (the paper's); ov: W_V W_O; both (default: qk)")
    p.add_argument("--label", action="append", metavar="NAME",
                   help="display name of each SOURCE, in order (default: from its config)")
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    from .analysis import analyze, concat
    from .heads import load_heads

    if args.label is not None and len(args.label) != len(args.sources):
        raise ValueError(f"--label was given {len(args.label)} times for {len(args.sources)} sources")
    given = args.label or [None] * len(args.sources)
    sources = [load_heads(source, label) for source, label in zip(args.sources, given)]
    labels = [heads.label for heads in sources]
    if args.label is None:  # two runs of one variant share a default label: add the folder name
        labels = [f"{label} [{Path(src).name}]" if labels.count(label) > 1 else label
                  for label, src in zip(labels, args.sources)]
    result = concat(analyze(heads, label, args.circuit) for heads, label in zip(sources, labels))
    folder = result.save(args.out)
    print(format_effective_ranks(result.summary))
    print(f"wrote similarity.csv, spectra.csv, summary.csv, norms.csv, lrkv_cosine.csv to {folder}")
    return 0


def format_effective_ranks(summary) -> str:
    """Per model and circuit, one line per layer: entropy effective rank uncentred (% of H) and
    centred (% of H, % of the H − 1 ceiling), then their means over layers."""
    blocks = []
    for (model, circuit), rows in summary.groupby(["model", "circuit"], sort=False):
        n = int(rows["n_heads"].iloc[0])
        wide = rows.pivot(index="layer", columns="kind",
                          values=["effective_rank", "effective_rank_pct_of_heads", "effective_rank_pct_of_ceiling"])
        wide.loc["mean"] = wide.mean()
        lines = [f"{model} · {circuit} · {n} heads — effective rank (% of H; centred also % of ceiling {n - 1})",
                 f"{'layer':>5}  {'uncentered':<16}centered"]
        for layer, row in wide.iterrows():
            unc = f"{row['effective_rank', 'uncentered']:.2f} ({row['effective_rank_pct_of_heads', 'uncentered']:.1f}%)"
            cen = (f"{row['effective_rank', 'centered']:.2f} ({row['effective_rank_pct_of_heads', 'centered']:.1f}%, "
                   f"{row['effective_rank_pct_of_ceiling', 'centered']:.1f}%)")
            lines.append(f"{layer:>5}  {unc:<16}{cen}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
