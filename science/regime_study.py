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
import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headlab.analysis.inputs import input_moments
from headlab.analysis.similarity import analyze
from headlab.analysis.snapshots import analyze_snapshots
from headlab.cli.arguments import sweep_values
from headlab.data.corpus import load_corpus
from headlab.io import atomic_write_bytes, atomic_write_text, make_folder
from headlab.model.gpt import count_parameters
from headlab.report.paper_tables import markdown_table
from headlab.study.stats import paired_difference, spread
from headlab.study.study import Study
from headlab.study.sweep import grid
from headlab.study.tables import MOMENT_WINDOWS, validation_windows
from headlab.training.runs import load_run
from headlab.training.trainer import learning_rate_factor, train

PRESET = "cpu-small"
THROUGH_TRAINING = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)  # fractions of a run shown in the through-training table
DEFAULT_POINT = "optimizer/x1-optimizermuon"
# The seed figure (the paper's Fig. 11, 128M, uncentred), λ₁ at L = 0 / 6 / 11, read off the plot
SEED_FIGURE = {"MHA": (5.0, 2.5, 3.0), "MQA": (4.0, 2.0, 3.5)}
SEED_MHA_EARLY = SEED_FIGURE["MHA"][0]
ROLES = {"standard-mha": "MHA", "mqa": "MQA"}
# The paper's 128M setting on each numeric axis (research/paper.md §3): nanochat's 524,288 tokens a
# step, 100B tokens over ~128M parameters, d_h 128, d_model 768, context 2048.
# Tokens the paper's final W_Q, W_K average (`averaged_updates`): decay 0.1 at lr 0.02 keeps ≈ 2/(lr·wd) = 1,000
# equally weighted updates of 524,288 tokens (if nanochat's Muon decays; without decay, ~190k steps: more)
PAPER_AVERAGED_UPDATES = 2 / (0.02 * 0.1)
PAPER_TOKENS_AVERAGED = PAPER_AVERAGED_UPDATES * 524_288
# The paper's depth and panels (cpu-deep: 12 layers of 6 heads, d_h 16) with AdamW on W_Q, W_K
DEEP_POINT = "deep_muon_qk/x1-muon_qkFalse"
DEEP_COMMAND = ("nice -n 19 python -m headlab sweep --preset cpu-deep --only mha mqa --jobs 2 --seeds 3 "
                "--out ROOT/deep_muon_qk --set muon_qk=false")
ADAMW_POINT, ADAMW_QK_POINT = "optimizer/x1-optimizeradamw", "muon_qk/x1-muon_qkFalse-snapshot_every100"
PAPER = {"tokens_per_step": 524_288, "tokens_per_parameter": 100e9 / 128e6, "head_dim": 128, "d_model": 768,
         "seq_len": 2048}


@dataclass(frozen=True)
class Axis:
    """One difference from the paper: its points (folder under ROOT -> shown value; None: the
    default point), the quantity it is plotted against and the commands that trained it."""

    name: str
    x: str | None  # a column of the run table; None: categorical
    points: dict[str, str]
    commands: tuple[str, ...]
    note: str = ""
    default_value: str = field(default="")


SWEEP = "nice -n 19 python -m headlab sweep --preset cpu-small --only mha mqa --jobs 2 --seeds 3"
TRAIN = "nice -n 19 python science/regime_study.py train --only mha --jobs 2"
AXES = [
    Axis("optimizer", None, {"optimizer/x1-optimizeradamw": "AdamW everywhere", DEFAULT_POINT: "Muon split"},
         (f"{SWEEP} --out ROOT/optimizer --set optimizer=adamw,muon",)),
    Axis("W_Q, W_K trained by", None, {DEFAULT_POINT: "Muon (default)",
                                       "muon_qk/x1-muon_qkFalse-snapshot_every100": "AdamW (Muon elsewhere)"},
         (f"{SWEEP} --out ROOT/muon_qk --set muon_qk=false --set snapshot_every=100",),
         "Muon everywhere else (V, O, MLP); W_Q and W_K by AdamW at lr 3e-3 with weight decay 0.1"),
    Axis("batch at equal steps", "tokens_per_step", {"batch_equal_steps/x1-batch_size4": "4 x 64",
                                                     DEFAULT_POINT: "16 x 64",
                                                     "batch_equal_steps/x1-batch_size64": "64 x 64"},
         (f"{TRAIN} --seeds 3 --out ROOT/batch_equal_steps --set batch_size=4",
          f"{TRAIN} --seeds 2 --out ROOT/batch_equal_steps --set batch_size=64")),
    Axis("batch at equal tokens", "tokens_per_step", {"batch_equal_tokens/x4-batch_size4": "4 x 64, 3600 steps",
                                                      DEFAULT_POINT: "16 x 64, 900 steps",
                                                      "batch_equal_tokens/x0.25-batch_size64": "64 x 64, 225 steps"},
         (f"{TRAIN} --seeds 3 --out ROOT/batch_equal_tokens --lengths 0.25 --set batch_size=64",
          f"{TRAIN} --seeds 2 --out ROOT/batch_equal_tokens --lengths 4 --set batch_size=4")),
    Axis("training length", "tokens_per_parameter", {"length/x0.25": "225 steps", DEFAULT_POINT: "900 steps",
                                                     "length/x4": "3600 steps"},
         (f"{TRAIN} --seeds 3 --out ROOT/length --lengths 0.25", f"{TRAIN} --seeds 2 --out ROOT/length --lengths 4"),
         "Sized down: the 3,600-step point (x4) has 2 seeds, trained last once the machine was quiet"),
    Axis("weight decay", "decay_timescale", {"weight_decay/x1-weight_decay0": "0", DEFAULT_POINT: "0.1",
                                             "weight_decay/x1-weight_decay1": "1"},
         (f"{TRAIN} --seeds 3 --out ROOT/weight_decay --set weight_decay=0",
          f"{TRAIN} --seeds 3 --out ROOT/weight_decay --set weight_decay=1"),
         "decay timescale = weight decay x the sum over steps of Muon's lr: the e-folds by which decay alone "
         "would shrink a matrix over the run"),
    Axis("head width d_h", "head_dim", {"head_dim/x1-head_dim16": "16", DEFAULT_POINT: "32",
                                        "head_dim/x1-head_dim64": "64"},
         (f"{TRAIN} --seeds 3 --out ROOT/head_dim --set head_dim=16",
          f"{TRAIN} --seeds 3 --out ROOT/head_dim --set head_dim=64")),
    Axis("width d_model", "d_model", {DEFAULT_POINT: "128", "d_model/x1-d_model192": "192 = H x d_h"},
         (f"{TRAIN} --seeds 3 --out ROOT/d_model --set d_model=192",)),
    Axis("context", "seq_len", {"seq_len/x1-seq_len32": "32", DEFAULT_POINT: "64", "seq_len/x1-seq_len128": "128"},
         (f"{TRAIN} --seeds 3 --out ROOT/seq_len --set seq_len=32",
          f"{TRAIN} --seeds 3 --out ROOT/seq_len --set seq_len=128")),
    Axis("vocabulary", None, {DEFAULT_POINT: "bytes (256)", "vocab/x1-bpe512": "BPE 512 (headlab's trainer)"},
         (f"{TRAIN} --seeds 3 --out ROOT/vocab --tokenizer bpe:512",)),
    Axis("architecture", None, {DEFAULT_POINT: "headlab", "arch/x1-archnanochat": "nanochat"},
         (f"{TRAIN} --seeds 3 --out ROOT/arch --set arch=nanochat",),
         "ModelConfig.arch: nanochat's parameter-free RMSNorms (one after the embedding too), its initialisation, "
         "output projections and head starting at zero"),
]


# ---- measuring one run ------------------------------------------------------------------------

def first_eigenvalues(analysis) -> pd.DataFrame:
    """Per layer (and step, where the analysis has one): λ₁ and the effective rank (% of H) of
    the uncentred QK similarity."""
    spectra = analysis.spectra
    first = spectra[(spectra["kind"] == "uncentered") & (spectra["index"] == 1)]
    summary = analysis.summary[analysis.summary["kind"] == "uncentered"]
    keys = [c for c in ("step", "layer") if c in first.columns]
    return (first[[*keys, "eigenvalue"]].rename(columns={"eigenvalue": "lambda1"})
            .merge(summary[[*keys, "effective_rank_pct_of_heads"]].rename(
                columns={"effective_rank_pct_of_heads": "er_pct"}), on=keys))


def both_views(model, windows: torch.Tensor) -> pd.DataFrame:
    """Per layer: λ₁ and effective rank of the weights view, and λ₁ of the data-aware view of the
    same forms on `windows` (`lambda1_data`)."""
    weights = first_eigenvalues(analyze(model))
    data = first_eigenvalues(analyze(model, measure="data", inputs=input_moments(model, windows)))
    return weights.merge(data[["layer", "lambda1"]].rename(columns={"lambda1": "lambda1_data"}), on="layer")


def decay_timescale(train) -> float:
    """weight decay · Σ_t Muon's lr at step t (AdamW's lr for the AdamW recipe): the e-folds by
    which decoupled decay alone would shrink a matrix over the run."""
    lr = train.matrix_lr if train.optimizer == "muon" else train.lr
    return train.weight_decay * lr * sum(learning_rate_factor(step, train) for step in range(train.steps))


def qk_rate(train) -> float:
    """The peak learning rate that W_Q and W_K are trained at."""
    return train.matrix_lr if train.optimizer == "muon" and train.muon_qk else train.lr


def averaged_updates(train) -> float:
    """How many updates the final W_Q, W_K average: with decoupled decay, W_T = Σ_t c_t·u_t (plus the
    decayed initial draw), c_t = lr_t·Π_{s>t}(1 − lr_s·wd); the effective number of equally weighted
    updates is (Σ c_t)² / Σ c_t². A direction every update shares adds up as Σ c_t, update noise as
    √Σ c_t², so the signal-to-noise ratio of W grows as √(this x tokens per step)."""
    rates = np.array([qk_rate(train) * learning_rate_factor(step, train) for step in range(train.steps)])
    kept = np.append(np.cumprod((1 - rates * train.weight_decay)[::-1])[::-1][1:], 1.0)  # Π_{s>t}
    weights = rates * kept
    return float(weights.sum() ** 2 / (weights ** 2).sum())


def run_tables(run_dir: Path, corpora: dict) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(per-layer rows of the final weights, per-step rows of the snapshots) of a finished run;
    None while it trains."""
    try:
        run = load_run(run_dir)
    except (ValueError, OSError):
        return None
    if run.step != run.train_config.steps:
        return None
    model_config, train = run.model_config, run.train_config
    tokenizer = {256: "byte"}.get(model_config.vocab_size, f"bpe:{model_config.vocab_size}")
    if tokenizer not in corpora:
        corpora[tokenizer] = load_corpus("shakespeare", tokenizer)
    windows = validation_windows(corpora[tokenizer], MOMENT_WINDOWS, model_config.seq_len)
    final = both_views(run.model, windows)
    through = first_eigenvalues(analyze_snapshots(run_dir))
    init = through[through["step"] == 0].drop(columns="step")
    evals = run.val_losses()[-1]
    name, seed = run_dir.name.rsplit("-seed", 1)
    params = count_parameters(model_config)["total"]
    tokens_per_step = train.batch_size * model_config.seq_len
    final = (final.merge(init, on="layer", suffixes=("", "_init"))
             .assign(role=ROLES[name], seed=int(seed), n_layer=model_config.n_layer, val_bpb=evals["val_bpb"],
                     tokens_per_step=tokens_per_step, steps=train.steps, tokens=tokens_per_step * train.steps,
                     tokens_per_parameter=tokens_per_step * train.steps / params,
                     qk_by_muon=train.optimizer == "muon" and train.muon_qk,
                     decay_timescale=decay_timescale(train), averaged_updates=averaged_updates(train),
                     tokens_averaged=averaged_updates(train) * tokens_per_step, head_dim=model_config.head_dim,
                     d_model=model_config.d_model, seq_len=model_config.seq_len))
    return final, through.assign(role=ROLES[name], seed=int(seed))


def point_tables(root: Path, corpora: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every finished run of every point folder of AXES under `root`."""
    finals, throughs = [], []
    for folder in dict.fromkeys([*(f for axis in AXES for f in axis.points), DEEP_POINT]):
        for run_dir in sorted((root / folder / "runs").glob("*-seed*")):
            if run_dir.name.rsplit("-seed", 1)[0] not in ROLES or (tables := run_tables(run_dir, corpora)) is None:
                continue
            finals.append(tables[0].assign(point=folder))
            throughs.append(tables[1].assign(point=folder))
            print(f"  {folder}/{run_dir.name}", file=sys.stderr)
    return pd.concat(finals, ignore_index=True), pd.concat(throughs, ignore_index=True)


# ---- the page ---------------------------------------------------------------------------------

def panels(n_layer: int) -> dict[str, int]:
    """The figure's early / middle / late layers (the paper's 0, 6, 11 of 12)."""
    return {"early": 0, "middle": n_layer // 2, "late": n_layer - 1}


def cell(values) -> str:
    return spread(values).format(2) if len(values) else "–"


def axis_rows(axis: Axis, finals: pd.DataFrame) -> list[dict]:
    rows = []
    for folder, value in axis.points.items():
        for role in ROLES.values():
            runs = finals[(finals["point"] == folder) & (finals["role"] == role)]
            if runs.empty:
                continue
            n_layer = int(runs["n_layer"].iloc[0])
            at = {name: runs[runs["layer"] == layer] for name, layer in panels(n_layer).items()}
            per_seed = runs.groupby("seed")
            rows.append({
                "setting": value, **({axis.x.replace("_", " "): f"{runs[axis.x].iloc[0]:,.4g}"} if axis.x else {}),
                "variant": role, "seeds": runs["seed"].nunique(),
                **{f"λ₁ {name} (L={layer})": cell(at[name]["lambda1"].to_numpy())
                   for name, layer in panels(n_layer).items()},
                "λ₁ early at init": cell(at["early"]["lambda1_init"].to_numpy()),
                "ER % of H": cell(per_seed["er_pct"].mean().to_numpy()),
                "ER % at init": cell(per_seed["er_pct_init"].mean().to_numpy()),
                "data-aware λ₁ early": cell(at["early"]["lambda1_data"].to_numpy()),
                "val bpb": cell(per_seed["val_bpb"].first().to_numpy()),
            })
    return rows


def separation(finals: pd.DataFrame, folder: str, layer: int) -> str:
    """MQA − MHA λ₁ at `layer`, paired by seed (the seeds both have), with its 95% interval."""
    at = finals[(finals["point"] == folder) & (finals["layer"] == layer)].pivot(
        index="seed", columns="role", values="lambda1").dropna()
    if not {"MHA", "MQA"} <= set(at.columns) or len(at) < 2:
        return "–"
    d = paired_difference(at["MQA"], at["MHA"])
    return d.format(2) + ("" if d.decided else " (noise)")


@dataclass(frozen=True)
class Trend:
    """λ₁ = a + b·log₂(x) fitted to the MHA early-layer values of one axis's seeds."""

    axis: str
    x: str
    slope: float
    slope_se: float
    intercept: float
    residual_sd: float
    n: int
    x_mean: float
    sxx: float

    @property
    def clear(self) -> bool:
        """Whether the slope is at least twice its standard error: a trend worth extending."""
        return self.n > 3 and abs(self.slope) > 2 * self.slope_se

    def predict(self, x: float) -> tuple[float, float]:
        """The fitted value at x and the half-width of its 95% prediction interval (Student t)."""
        from scipy.special import stdtrit

        u = math.log2(x)
        se = self.residual_sd * math.sqrt(1 + 1 / self.n + (u - self.x_mean) ** 2 / self.sxx)
        return self.intercept + self.slope * u, float(stdtrit(self.n - 2, 0.975) * se)


def trend(axis: Axis, finals: pd.DataFrame) -> Trend | None:
    runs = finals[finals["point"].isin(axis.points) & (finals["role"] == "MHA") & (finals["layer"] == 0)]
    return None if axis.x is None else fitted_trend(axis.name, axis.x, runs)


def fitted_trend(name: str, x: str, runs: pd.DataFrame) -> Trend | None:
    """The log-linear fit of `runs`' λ₁ on column x (None with under four runs, three settings or x spanning
    under 2x). λ₁ ≥ 1 always (the eigenvalues of a 6 x 6 cosine matrix average 1), so a fit is read as a
    trend only, never as a value below 1."""
    runs = runs[runs[x] > 0]  # a log-scale trend has no place for a setting of 0 (no weight decay)
    if len(runs) < 4 or runs[x].nunique() < 3 or runs[x].max() < 2 * runs[x].min():
        return None  # two settings, or less than a doubling, say nothing about the shape of a trend
    u, y = np.log2(runs[x].to_numpy(dtype=float)), runs["lambda1"].to_numpy()
    sxx = float(((u - u.mean()) ** 2).sum())
    slope = float(((u - u.mean()) * (y - y.mean())).sum() / sxx)
    intercept = float(y.mean() - slope * u.mean())
    residual_sd = float(np.sqrt(((y - intercept - slope * u) ** 2).sum() / (len(y) - 2)))
    return Trend(name, x, slope, residual_sd / math.sqrt(sxx), intercept, residual_sd, len(y),
                 float(u.mean()), sxx)


def largest_move(finals: pd.DataFrame, axes: list[Axis] = AXES) -> tuple[Axis, float]:
    """The axis whose points move MHA's early-layer λ₁ (mean over seeds) the most, and by how much."""
    moves = []
    for axis in axes:
        means = [finals[(finals["point"] == f) & (finals["role"] == "MHA") & (finals["layer"] == 0)]["lambda1"].mean()
                 for f in axis.points]
        means = [m for m in means if not math.isnan(m)]
        moves.append((axis, max(means) - min(means) if len(means) > 1 else 0.0))
    return max(moves, key=lambda item: item[1])


def draw_figure(finals: pd.DataFrame, path: Path) -> str:
    """MHA's early-layer λ₁ against the numeric axis that moves it most (left) and every axis's
    points side by side (right), the seed figure's 5.0 marked; returns the sentence on the trend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = [a for a in AXES if a.x is not None]
    trends = {a.name: t for a in numeric if (t := trend(a, finals)) is not None}
    best = largest_move(finals, numeric)[0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.3]})
    mha = finals[(finals["role"] == "MHA") & (finals["layer"] == 0)]
    runs = mha[mha["point"].isin(best.points)]
    left.scatter(runs[best.x], runs["lambda1"], color="tab:blue", label="Standard MHA, one seed each", zorder=3)
    means = runs.groupby(best.x)["lambda1"].mean()
    left.plot(means.index, means.to_numpy(), color="tab:blue")
    left.axhline(SEED_MHA_EARLY, color="black", ls="--", label="seed figure (paper, 128M): 5.0")
    left.axhline(1.0, color="grey", ls=":", label="no shared direction (λ₁ = 1)")
    init = float(mha["lambda1_init"].mean())
    left.axhline(init, color="tab:green", ls="-.", lw=0.8, label=f"random initialisation: {init:.2f}")
    sentence = (f"the numeric setting that moves λ₁ most, {best.name}, has {runs[runs[best.x] > 0][best.x].nunique()} "
                "values above 0 and a log-scale trend needs three, so it is not extended to the paper's scale")
    t = trends.get(best.name)
    if t is not None and best.x in PAPER:
        grid_x = np.geomspace(runs[best.x].min(), PAPER[best.x], 60)
        fit = [t.predict(x) for x in grid_x]
        if t.clear:
            centre, half = t.predict(PAPER[best.x])
            doublings = math.log2(PAPER[best.x] / runs[best.x].max())
            left.plot(grid_x, [f[0] for f in fit], color="tab:red", ls="-.", label="log-linear fit, extended")
            left.fill_between(grid_x, [f[0] - f[1] for f in fit], [f[0] + f[1] for f in fit], color="tab:red",
                              alpha=0.15, label="95% prediction interval")
            left.axvline(PAPER[best.x], color="tab:red", lw=0.8)
            sentence = (f"{best.name}: λ₁ = {t.intercept:.2f} + {t.slope:.3f}·log₂({best.x}) (slope ± {t.slope_se:.3f} "
                        f"se, {t.n} runs); at the paper's {best.x} = {PAPER[best.x]:,.0f} it predicts "
                        f"{centre:.2f} ± {half:.2f} (95% prediction interval), a {doublings:.0f}-doubling "
                        "extrapolation")
        else:
            sentence = (f"{best.name}: slope {t.slope:.3f} ± {t.slope_se:.3f} (se) per doubling over {t.n} runs, "
                        "under twice its standard error: no trend to extend to the paper's setting")
    if runs[best.x].min() > 0:
        left.set_xscale("log", base=2)
    else:  # a setting of 0 (no weight decay) sits at 0, linear up to the smallest other setting
        left.set_xscale("symlog", base=2, linthresh=runs[runs[best.x] > 0][best.x].min())
    left.set_xlabel(best.x.replace("_", " ") + " (log scale" + (")" if runs[best.x].min() > 0 else ", 0 at 0)"))
    left.set_ylabel("first eigenvalue λ₁, uncentred, L = 0")
    left.set_title(f"The numeric setting that moves λ₁ most:\n{best.name}", fontsize=10)
    left.legend(fontsize=7, loc="center right")
    labels, values, colours = ["default (make demo's recipe)"], [mha[mha["point"] == DEFAULT_POINT]["lambda1"]], \
        ["tab:orange"]
    for axis in AXES:
        for folder, value in axis.points.items():
            point = mha[mha["point"] == folder]["lambda1"]
            if len(point) and folder != DEFAULT_POINT:
                labels.append(f"{axis.name}: {value}")
                values.append(point.to_numpy())
                colours.append("tab:blue")
    for i, (v, c) in enumerate(zip(values, colours)):
        right.scatter(v, [i] * len(v), color=c, s=14)
        right.plot([v.mean()] * 2, [i - 0.2, i + 0.2], color=c)
    right.axvline(SEED_MHA_EARLY, color="black", ls="--")
    right.axvline(1.0, color="grey", ls=":")
    right.axvline(init, color="tab:green", ls="-.", lw=0.8)
    right.set_yticks(range(len(labels)), labels, fontsize=7)
    right.invert_yaxis()
    right.text(SEED_MHA_EARLY, len(labels) - 0.55, "seed figure ", fontsize=7, ha="right")
    right.text(init, len(labels) - 0.55, " random init", fontsize=7, color="tab:green")
    right.set_xlabel("λ₁ of Standard MHA, L = 0 (dots: seeds, bar: mean)")
    right.set_title("Every point, each differing from the default in one setting")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    make_folder(path.parent)
    atomic_write_bytes(path, buffer.getvalue())
    return sentence


def mean_at(finals: pd.DataFrame, folder: str, role: str = "MHA", layer: int = 0, column: str = "lambda1") -> float:
    return float(finals[(finals["point"] == folder) & (finals["role"] == role) & (finals["layer"] == layer)][column]
                 .mean())


def first_screen(finals: pd.DataFrame, sentence: str) -> str:
    """The two sentences proposed for the README's first screen, every number from the tables."""
    default, init = mean_at(finals, DEFAULT_POINT), mean_at(finals, DEFAULT_POINT, column="lambda1_init")
    adamw_qk, adamw = mean_at(finals, ADAMW_QK_POINT), mean_at(finals, ADAMW_POINT)
    bpb = {f: mean_at(finals, f, column="val_bpb") for f in (DEFAULT_POINT, ADAMW_POINT, ADAMW_QK_POINT)}
    muon_points = set(finals[finals["qk_by_muon"]]["point"])
    under_muon = {f: mean_at(finals, f) for axis in AXES for f in axis.points if f in muon_points}
    under_muon = {f: v for f, v in under_muon.items() if not math.isnan(v)}
    top = max(under_muon, key=under_muon.get)
    top_axis = next(a for a in AXES if top in a.points)
    tried = ", ".join(a.name for a in AXES if any(f in under_muon and f != DEFAULT_POINT for f in a.points))
    muon_clause = (f"under Muon none of the other settings we could train on two cores ({tried}) took it above "
                   f"{under_muon[top]:.2f} (the highest: {top_axis.name}, {top_axis.points[top]})" if tried else
                   "no other setting could be trained on two cores in time")
    return (f"Our weights-view spectra are not the paper's Fig. 11: trained as `make demo` trains them, Standard "
            f"MHA's first eigenvalue at L = 0 is {default:.2f} ({init:.2f} at random initialisation; the seed figure "
            f"shows {SEED_MHA_EARLY:.1f}), so the heads' QK forms share almost no direction. The cause we found is "
            f"Muon on W_Q and W_K at our scale: with AdamW on those two matrices only (Muon elsewhere) it is "
            f"{adamw_qk:.2f} and with AdamW everywhere {adamw:.2f} (validation {bpb[ADAMW_QK_POINT]:.2f} and "
            f"{bpb[ADAMW_POINT]:.2f} bits per byte against Muon's {bpb[DEFAULT_POINT]:.2f}), while {muon_clause}; "
            f"{sentence}.{extended_trends(finals)}")


def extended_trends(finals: pd.DataFrame) -> str:
    """A sentence on every numeric axis whose trend is clear of its noise, extended to the paper's setting."""
    clear = [(axis, t) for axis in AXES if axis.x in PAPER and (t := trend(axis, finals)) is not None and t.clear]
    if not clear:
        return ""
    said = [f"{axis.name} ({axis.x} = {PAPER[axis.x]:,.0f}): {centre:.2f} ± {half:.2f}"
            for axis, t in clear for centre, half in [t.predict(PAPER[axis.x])]]
    return (" The trends clear of their noise, extended under Muon to the paper's setting (95% prediction "
            f"intervals): {'; '.join(said)}, against the seed figure's {SEED_MHA_EARLY:.1f}.")


def page(finals: pd.DataFrame, throughs: pd.DataFrame, figure: Path, out: Path, root: Path) -> str:
    best, move = largest_move(finals)
    sentence = draw_figure(finals, figure)
    lines = ["# Regime study: when does the weights view get a dominant first eigenvalue? (issue 36)", "",
             "## README first screen (proposed)", "", first_screen(finals, sentence), "",
             f"The axis that moves Standard MHA's λ₁ at L = 0 most, by {move:.2f} between its points: "
             f"“{best.name.removesuffix(' by')}”.", "", *preset_check(finals),
             f"![first eigenvalue against the axis that moves it most]({figure.relative_to(out.parent)})", "",
             "## How these numbers were made", "",
             f"Every point is a `cpu-small` study (4 layers of 6 heads, d_h 32, d_model 128, bytes of Shakespeare) "
             f"that differs from the default point (`{DEFAULT_POINT}`: Muon + AdamW split, 16 x 64 tokens a step, "
             "900 steps, weight decay 0.1) in one setting. ROOT is the folder the sweeps were written to "
             f"(here `{root}`). The optimizer axis (and with it the default point) ran from main at 91a3e0b; the "
             "W_Q, W_K and batch axes and cpu-deep from 7cb5876, which adds TrainConfig.muon_qk; weight decay, "
             "length 0.25 and d_h 16 from f6d60f2, the other d_h, context, d_model, vocabulary and probed runs "
             "from 90e152d, the architecture from the branch that adds ModelConfig.arch (each `git archive`d, "
             "run with PYTHONPATH on the copy; none changes a default). The default point and the optimizer axis:", "",
             f"    {SWEEP} --out ROOT/optimizer --set optimizer=adamw,muon", "",
             "This page (it trains nothing, reads every finished run):", "",
             f"    python science/regime_study.py page --root ROOT --out {out}", "",
             "λ₁: the first eigenvalue of the uncentred cosine similarity of the heads' QK forms A_h = W^Q_h W^K_hᵀ "
             "(the paper's Eq. 11; H = 6, so λ₁ runs from 1, no shared direction, to 6, one form for all heads). "
             "Each cell is mean ± sd over seeds. 'at init' is the run's step-0 snapshot (its initial draw). ER: "
             "the entropy effective rank of the same spectrum, % of H, mean over layers. 'data-aware': λ₁ of the "
             "same forms weighed by the second moments of each layer's inputs on 32 validation windows. val bpb: "
             "validation bits per byte (comparable across tokenizers).", ""]
    for axis in AXES:
        lines += [f"## {axis.name}", "", *(f"    {c}" for c in axis.commands), ""]
        if axis.note:
            lines += [axis.note + ".", ""]
        rows = axis_rows(axis, finals)
        if not set(finals["point"]) & (set(axis.points) - {DEFAULT_POINT}):
            lines += ["Not trained in time: the shared CPU ran a Muon run in 300–1,000 s, so this axis has only the "
                      "default point (in the optimizer table).", ""]
            continue
        lines += [markdown_table(pd.DataFrame(rows), 2), "", *trend_lines(axis, finals)]
        separations = [{"setting": value, **{f"MQA − MHA, λ₁ {name} (L={layer})": separation(finals, folder, layer)
                                             for name, layer in panels(int(finals["n_layer"].iloc[0])).items()}}
                       for folder, value in axis.points.items() if separation(finals, folder, 0) != "–"]
        if separations:
            lines += ["Separation of the methods in the weights view: MQA − MHA, paired by seed, 95% interval "
                      "('(noise)' where it includes 0):", "", markdown_table(pd.DataFrame(separations), 2), ""]
    lines += deep_panels(finals)
    lines += mechanism(finals, throughs, root)
    return "\n".join(lines)


def trend_lines(axis: Axis, finals: pd.DataFrame) -> list[str]:
    """The log-linear trend of MHA's λ₁ at L = 0 along a numeric axis, extended to the paper's setting
    with a 95% prediction interval where the slope is clear of its noise; nothing where no trend is fitted."""
    t = trend(axis, finals)
    if t is None:
        return []
    line = (f"Trend (MHA, L = 0, every seed): λ₁ = {t.intercept:.2f} + {t.slope:.3f}·log₂({axis.x}), slope ± "
            f"{t.slope_se:.3f} (se), {t.n} runs")
    if not t.clear:
        return [line + "; the slope is under twice its standard error: no trend to extend.", ""]
    if axis.x not in PAPER:
        return [line + ".", ""]
    centre, half = t.predict(PAPER[axis.x])
    return [line + f"; at the paper's {axis.x} = {PAPER[axis.x]:,.0f} it predicts {centre:.2f} ± {half:.2f} (95% "
            "prediction interval; λ₁ cannot fall below 1).", ""]


def deep_panels(finals: pd.DataFrame) -> list[str]:
    """The paper's panels L = 0 / 6 / 11 on cpu-deep with AdamW on W_Q, W_K, beside the seed figure."""
    runs = finals[finals["point"] == DEEP_POINT]
    lines = ["## The paper's panels: cpu-deep (12 layers) with AdamW on W_Q, W_K", "", f"    {DEEP_COMMAND}", ""]
    if runs.empty:
        return [*lines, "No finished runs yet.", ""]
    rows = []
    for role, seed_values in SEED_FIGURE.items():
        at = runs[runs["role"] == role]
        if at.empty:
            continue
        for name, layer in panels(int(at["n_layer"].iloc[0])).items():
            here = at[at["layer"] == layer]
            rows.append({"variant": role, "panel": f"{name} (L={layer})", "seeds": len(here),
                         "λ₁": cell(here["lambda1"].to_numpy()), "λ₁ at init": cell(here["lambda1_init"].to_numpy()),
                         "seed figure λ₁": f"{seed_values[list(panels(12)).index(name)]:.1f}",
                         "val bpb": cell(here["val_bpb"].to_numpy())})
    return [*lines, "The default recipe (Muon on W_Q, W_K too) at this depth is drawn in "
            "science/figures/cpu_deep_muon_spectra_uncentered.png (science/scale_study.md).",
            "", markdown_table(pd.DataFrame(rows), 2), ""]


def preset_check(finals: pd.DataFrame) -> list[str]:
    """Issue 36's test of a regime for a preset, on the AdamW-on-W_Q, W_K point (preset cpu-small-adamw-qk)."""
    mha = finals[(finals["point"] == ADAMW_QK_POINT) & (finals["role"] == "MHA") & (finals["layer"] == 0)]
    if mha.empty:
        return []
    n_layer = int(mha["n_layer"].iloc[0])
    deep = finals[(finals["point"] == DEEP_POINT) & (finals["role"] == "MHA") & (finals["layer"] == 0)]
    separations = ", ".join(f"L = {layer}: {separation(finals, ADAMW_QK_POINT, layer)}"
                            for layer in panels(n_layer).values())
    return ["## The preset: cpu-small-adamw-qk", "",
            "Issue 36 asks of a regime for a preset: Standard MHA's λ₁ at L = 0 ≥ 2, the methods separated beyond "
            "seed noise in the weights view, 3 seeds of the six variants in 30 minutes on two cores. cpu-small with "
            f"AdamW on W_Q, W_K (everything else as `make demo`): λ₁ = {cell(mha['lambda1'].to_numpy())} "
            f"({mha['seed'].nunique()} seeds); MQA − MHA, paired by seed: {separations}; validation "
            f"{mean_at(finals, ADAMW_QK_POINT, column='val_bpb'):.2f} bits per byte against "
            f"{mean_at(finals, DEFAULT_POINT, column='val_bpb'):.2f} under `make demo`'s recipe. Its cost is "
            "cpu-small's (two of a block's six matrices leave Muon for AdamW, which is cheaper); not timed here, "
            "the machine being shared. Measured here for MHA and MQA only: LRKV, MLA and GQA have not been trained "
            "under it (their query and key matrices go to AdamW as well; MLA's joint key/value latents stay with "
            f"Muon). At the paper's depth and panels (cpu-deep, below) the same change gives Standard MHA "
            f"λ₁ = {cell(deep['lambda1'].to_numpy())} at L = 0 ({deep['seed'].nunique()} seed(s)).", ""]


def gap_sentence(finals: pd.DataFrame) -> str:
    """What training W_Q, W_K by AdamW instead of Muon (the rest alike) does to each view at L = 0."""
    parts = []
    for role in ROLES.values():
        views = {f: (mean_at(finals, f, role), mean_at(finals, f, role, column="lambda1_data"))
                 for f in (DEFAULT_POINT, ADAMW_QK_POINT)}
        (w0, d0), (w1, d1) = views[DEFAULT_POINT], views[ADAMW_QK_POINT]
        parts.append(f"{role}: weights {w0:.2f} → {w1:.2f}, data-aware {d0:.2f} → {d1:.2f}, gap {d0 - w0:.2f} → "
                     f"{d1 - w1:.2f}")
    return ("With the inputs' statistics held (Muon on everything but W_Q, W_K in both), moving W_Q, W_K from Muon to "
            "AdamW (L = 0, means over seeds): " + "; ".join(parts) + ". The data-aware view hardly moves: it is set "
            "by how anisotropic the inputs are (AdamW everywhere, whose embedding learns at 3e-3 rather than 0.2, "
            "gives lower data-aware values), while the weights view is set by the optimizer of W_Q, W_K; the gap "
            "closes where λ₁ grows, because the weights take up the inputs' shared direction.")


def averaged_updates_default(finals: pd.DataFrame) -> float:
    return float(finals[finals["point"] == DEFAULT_POINT]["averaged_updates"].iloc[0])


def mechanism(finals: pd.DataFrame, throughs: pd.DataFrame, root: Path) -> list[str]:
    """Does the gap between the weights view and the data-aware view close where λ₁ grows?"""
    early = finals[finals["layer"] == 0]
    gap = early["lambda1_data"] - early["lambda1"]
    rho = float(np.corrcoef(early["lambda1"].rank(), gap.rank())[0, 1])
    points = early.assign(gap=gap).groupby(["point", "role"]).agg(
        weights=("lambda1", "mean"), data_aware=("lambda1_data", "mean"), gap=("gap", "mean")).reset_index()
    rows = []
    for (folder, role), runs in throughs[throughs["layer"] == 0].groupby(["point", "role"]):
        by_step = runs.groupby("step")["lambda1"].mean()
        last = by_step.index.max()
        rows.append({"point": folder, "role": role, "steps": last, **{
            f"{fraction:.0%} of training": by_step.iloc[int(np.abs(by_step.index - fraction * last).argmin())]
            for fraction in THROUGH_TRAINING}})
    steps = pd.DataFrame(rows)
    muon_qk = early[(early["role"] == "MHA") & early["qk_by_muon"] & (early["n_layer"] == early["n_layer"].min())]
    pooled = fitted_trend("every point whose W_Q, W_K Muon trains", "tokens_averaged", muon_qk)
    averaged = muon_qk.groupby("point").agg(**{"averaged updates": ("averaged_updates", "first"),
                                               "tokens averaged": ("tokens_averaged", "first"),
                                               "λ₁ (MHA, L = 0)": ("lambda1", "mean")}).reset_index()
    averaged = averaged.sort_values("tokens averaged").assign(**{
        "averaged updates": lambda t: t["averaged updates"].map("{:,.0f}".format),
        "tokens averaged": lambda t: t["tokens averaged"].map("{:.2e}".format)})
    extension = "too few points for a fit"
    if pooled is not None:
        centre, half = pooled.predict(PAPER_TOKENS_AVERAGED)
        extension = (f"λ₁ = {pooled.intercept:.2f} + {pooled.slope:.3f}·log₂(tokens averaged), slope ± "
                     f"{pooled.slope_se:.3f} (se), {pooled.n} runs; " +
                     (f"at the paper's ≈{PAPER_TOKENS_AVERAGED:.1e} it predicts {centre:.2f} ± {half:.2f} (95% "
                      "prediction interval)" if pooled.clear else "the slope is under twice its standard error: "
                      "no trend to extend"))
    ours = averaged_updates_default(finals)
    return ["## Mechanism: the weights view against the data-aware view", "",
            gap_sentence(finals), "",
            "A hypothesis for why Muon keeps the forms apart and the paper's run would not (ours; the trend points "
            "below are its only test): W_Q and W_K at the end of training are a decayed sum of the updates, "
            "W = Σ c_t u_t. A direction that every update shares "
            "(the inputs' dominant direction, which the data-aware view shows) adds up as Σ c_t; gradient noise, "
            "which Muon writes in at full size, as √Σ c_t². So the shared part stands out of W as "
            "√(averaged updates x tokens per step), with averaged updates = (Σ c_t)² / Σ c_t². Ours: "
            f"{ours:.0f} updates of 1,024 tokens; the paper's (decay 0.1 at lr 0.02 over ≈190k steps of 524,288 "
            f"tokens): ≈{PAPER_AVERAGED_UPDATES:.0f} updates, ≈{PAPER_TOKENS_AVERAGED:.1e} tokens, "
            f"{PAPER_TOKENS_AVERAGED / 1024 / ours:.0f}x ours. Standard MHA's λ₁ at L = 0 against tokens averaged, "
            "every point whose W_Q, W_K Muon trains:", "",
            markdown_table(averaged, 2), "", f"Pooled fit: {extension}.", "",
            "At every point (L = 0, mean over seeds): λ₁ of the weights, λ₁ of the same forms on their inputs, "
            "and the gap between them. Spearman correlation over all runs between λ₁ (weights) and the gap: "
            f"{rho:+.2f} ({len(early)} runs; negative: the gap closes where λ₁ grows).", "",
            markdown_table(points.sort_values("weights"), 2), "",
            "Through training: λ₁ of the weights view at L = 0 at the snapshot nearest each fraction of the run, "
            "mean over seeds (from the snapshots, which keep the attention weights only):", "",
            markdown_table(steps, 2), "", *probed_through_training(root)]


PROBED = {"through_default/x1-optimizermuon": "Muon (default)", "through_muon_qk/x1-muon_qkFalse": "AdamW on W_Q, W_K"}
PROBE = "nice -n 19 python science/regime_study.py through --only mha --seeds 3"
PROBE_COMMANDS = (f"{PROBE} --out ROOT/through_default --set optimizer=muon",
                  f"{PROBE} --out ROOT/through_muon_qk --set muon_qk=false")


def probed_through_training(root: Path) -> list[str]:
    """Both views through training at L = 0, from the `through` runs' probes (the whole model at each
    snapshot step), per setting: means over seeds at fractions of the run, and whether the gap closes
    as λ₁ grows (Spearman over every probed step and seed)."""
    frames = [pd.read_csv(table).assign(setting=name) for folder, name in PROBED.items()
              for table in sorted((root / folder / "through").glob("*.csv"))]
    lines = ["Both views through training (MHA, L = 0): the same runs retrained with a probe that reads the whole "
             "model at each snapshot step:", "", *(f"    {c}" for c in PROBE_COMMANDS), ""]
    if not frames:
        return [*lines, "No probed runs yet.", ""]
    probed = pd.concat(frames, ignore_index=True)
    early = probed[probed["layer"] == 0].assign(gap=lambda t: t["lambda1_data"] - t["lambda1"])
    rows, sentences = [], []
    for setting, runs in early.groupby("setting", sort=False):
        means = runs.groupby("step")[["lambda1", "lambda1_data", "gap"]].mean()
        last = means.index.max()
        for fraction in THROUGH_TRAINING:
            step = means.index[int(np.abs(means.index - fraction * last).argmin())]
            rows.append({"setting": setting, "seeds": runs["seed"].nunique(), "step": step,
                         "weights λ₁": means.loc[step, "lambda1"], "data-aware λ₁": means.loc[step, "lambda1_data"],
                         "gap": means.loc[step, "gap"]})
        rho = float(np.corrcoef(runs["lambda1"].rank(), runs["gap"].rank())[0, 1])
        sentences.append(f"{setting}: {rho:+.2f} over {len(runs)} probed steps, the gap "
                         f"{means['gap'].iloc[0]:.2f} at step 0 and {means['gap'].iloc[-1]:.2f} at the end")
    return [*lines, markdown_table(pd.DataFrame(rows), 2), "",
            "Spearman correlation between the weights view's λ₁ and the gap, over every probed step and seed "
            f"(negative: the gap closes as λ₁ grows): {'; '.join(sentences)}. Within a run the gap opens while λ₁ "
            "grows when it is positive: the inputs' shared direction (the data-aware view) grows faster than the "
            "weights take it up; across settings at the same step, the larger λ₁ goes with the smaller gap.", ""]


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
