"""Why does MLA trail MHA on `cpu-small`? A small ablation over seeds.

Trains every config of the grid below with `headlab.train` on Shakespeare bytes, one run
folder per (config, seed) under --out (finished runs are reused, interrupted ones resumed),
then prints a markdown table: validation loss mean ± sd over seeds per config, and the paired
per-seed difference to a reference config (default MHA; config − reference at the same seed)
with its 95 % t-interval. A difference whose interval contains 0 is within seed noise.

    python science/mla_ablation.py --seeds 0 1 2 [--configs mha mla-qk-norm] [--out DIR] [--jobs 2]

Every MLA config keeps the paper's cache fraction: d_c = 32 = 8.3 % of MHA's 2·H·d_h values.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from headlab.data.corpus import load_corpus
from headlab.model.config import PRESETS, preset
from headlab.training.config import train_preset
from headlab.training.trainer import train

PRESET = "cpu-small"

# name -> (attention family, ModelConfig overrides, TrainConfig overrides of the preset's)
GRID: dict[str, tuple[str, dict, dict]] = {
    "mha": ("mha", {"qk_norm": True}, {}),
    "mha-no-qk-norm": ("mha", {"qk_norm": False}, {}),  # how much QK-norm alone is worth
    "mla-deepseek": ("mla", {"qk_norm": False}, {}),  # DeepSeek's layout: only the latent is normalised
    "mla-qk-norm": ("mla", {"qk_norm": True}, {}),  # + RMSNorm of the queries and the shared RoPE key
    "mla-d_R-8": ("mla", {"qk_norm": False, "rope_head_dim": 8}, {}),  # d_R = d_h/4 (the preset: d_h/2)
    "mla-d_R-32": ("mla", {"qk_norm": False, "rope_head_dim": 32}, {}),  # d_R = d_h
    "mla-q-latent-96": ("mla", {"qk_norm": False, "q_latent_dim": 96}, {}),  # queries through a normalised latent
    "mla-d_c-64": ("mla", {"qk_norm": False, "kv_latent_dim": 64}, {}),  # twice the paper's cache fraction (MQA's)
    "mla-lr-2e-3": ("mla", {"qk_norm": False}, {"lr": 2e-3}),  # the preset's AdamW lr is 3e-3
    "mla-lr-5e-3": ("mla", {"qk_norm": False}, {"lr": 5e-3}),
}


def train_one(name: str, seed: int, out: Path, steps: int | None, threads: int | None) -> float:
    """Final validation loss (nats/byte) of one (config, seed), training it if it is missing."""
    if threads:
        torch.set_num_threads(threads)
    attention, model_overrides, train_overrides = GRID[name]
    train_config = train_preset(PRESET, seed=seed, **train_overrides, **({"steps": steps} if steps else {}))
    run = train(preset(PRESET, attention, **model_overrides), train_config, load_corpus("shakespeare"),
                out=out / f"{name}-seed{seed}", resume=True, progress=False)
    print(f"  {name:<24} seed {seed}: {run.final_val_loss:.4f}", flush=True)
    return run.final_val_loss


def train_grid(names: list[str], seeds: list[int], out: Path, steps: int | None, jobs: int,
               threads: int | None) -> dict[tuple[str, int], float]:
    """Every (config, seed), seed by seed, in `jobs` worker processes (independent runs, so
    two single-threaded trainings use two cores better than one two-threaded one)."""
    tasks = [(name, seed) for seed in seeds for name in names]
    if jobs == 1:
        return {task: train_one(*task, out, steps, threads) for task in tasks}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {task: pool.submit(train_one, *task, out, steps, threads or 1) for task in tasks}
        return {task: future.result() for task, future in futures.items()}


def summary_table(losses: dict[tuple[str, int], float], names: list[str], seeds: list[int],
                  reference: str = "mha") -> str:
    """Markdown: per config mean ± sd over seeds, and config − reference paired by seed (mean ±
    sd, 95 % t-interval). Sample standard deviations (ddof = 1)."""
    lines = [f"| config | seeds | val loss (nats/byte) | Δ vs {reference}, paired | 95 % interval of Δ |",
             "|---|---|---|---|---|"]
    reference_losses = np.array([losses[reference, s] for s in seeds])
    for name in names:
        values = np.array([losses[name, s] for s in seeds])
        row = f"| {name} | {len(seeds)} | {values.mean():.3f} ± {values.std(ddof=1):.3f} |"
        if name == reference:
            lines.append(row + " — | — |")
            continue
        delta = values - reference_losses
        half = stats.t.ppf(0.975, len(seeds) - 1) * delta.std(ddof=1) / math.sqrt(len(seeds))
        lines.append(row + f" {delta.mean():+.3f} ± {delta.std(ddof=1):.3f} | "
                           f"[{delta.mean() - half:+.3f}, {delta.mean() + half:+.3f}] |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", default=list(GRID), choices=list(GRID))
    parser.add_argument("--steps", type=int, default=None, help="replaces the preset's step count")
    parser.add_argument("--out", type=Path, default=Path("runs/mla_ablation"))
    parser.add_argument("--reference", default="mha", choices=list(GRID), help="the config Δ is paired against")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once, in worker processes")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per run (default: torch's with --jobs 1, else 1)")
    args = parser.parse_args()
    if len(args.seeds) < 2:
        parser.error(f"--seeds {args.seeds} is invalid: a standard deviation needs at least 2 seeds")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs} is invalid: must be a positive integer")
    names = [args.reference] + [n for n in args.configs if n != args.reference]
    losses = train_grid(names, args.seeds, args.out, args.steps, args.jobs, args.threads)
    train_config = train_preset(PRESET, **({"steps": args.steps} if args.steps else {}))
    print(f"\n{PRESET}: {train_config.steps} steps × {train_config.batch_size} sequences of "
          f"{PRESETS[PRESET].seq_len} bytes, seeds {args.seeds}\n")
    print(summary_table(losses, names, args.seeds, args.reference))


if __name__ == "__main__":
    main()
