"""Measuring one finished run of the regime study (`science/regime_study.py`): both views of its final
weights, its step-0 snapshot and its recipe's averaged updates, as per-layer rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from regime_axes import AXES, DEEP_POINT, ROLES

from headlab.analysis.inputs import input_moments
from headlab.analysis.similarity import analyze
from headlab.analysis.snapshots import analyze_snapshots
from headlab.data.corpus import load_corpus
from headlab.model.gpt import count_parameters
from headlab.study.tables import MOMENT_WINDOWS, validation_windows
from headlab.training.runs import load_run
from headlab.training.trainer import learning_rate_factor


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


def finished_run(run_dir: Path):
    """The Run of a run folder whose training has finished; None while it trains (or before its
    first checkpoint can be read)."""
    try:
        run = load_run(run_dir)
    except (ValueError, OSError):
        return None
    return run if run.step == run.train_config.steps else None


def run_tables(run_dir: Path, corpora: dict) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(per-layer rows of the final weights, per-step rows of the snapshots) of a finished run;
    None while it trains."""
    run = finished_run(run_dir)
    if run is None:
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
