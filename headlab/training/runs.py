"""A trained run in memory: the `Run` that `train` returns and `load_run` reads back from a run
folder (the folder itself, how it is written and read: `headlab.runs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT
from headlab.runs.divergence import Divergence, run_divergence
from headlab.runs.folder import load_weights
from headlab.runs.layout import METRICS, saved_train_config
from headlab.runs.metrics import read_metrics
from headlab.training.config import TrainConfig


@dataclass
class Run:
    """A trained model with its configs and metrics (and its folder, if it has one)."""

    model: GPT | None  # None on the ranks other than 0 after FSDP training (rank 0 holds it whole)
    model_config: ModelConfig
    train_config: TrainConfig
    step: int  # optimizer steps behind `model`'s weights
    metrics: list[dict] = field(default_factory=list)  # may run past `step` if a run was cut short
    path: Path | None = None
    diverged: Divergence | None = None  # set when the run ended worse than a uniform guess

    def val_losses(self) -> list[dict]:
        return [r for r in self.metrics if "val_loss" in r]

    @property
    def final_val_loss(self) -> float | None:
        evals = self.val_losses()
        return evals[-1]["val_loss"] if evals else None

    def metrics_frame(self):
        return pd.DataFrame(self.metrics)


def load_run(path: str | Path, device: str = "cpu") -> Run:
    """The model, configs and metrics of a run folder (its current checkpoint, read whole even
    while a trainer writes the next one). Refuses, naming the file, anything truncated, corrupt,
    changed since it was written, or not written by headlab."""
    run_dir = Path(path)
    weights = load_weights(run_dir)
    return Run(model=weights.model(device), model_config=weights.model_config,
               train_config=saved_train_config(run_dir, weights.config, TrainConfig), step=weights.step,
               metrics=read_metrics(run_dir / METRICS), path=run_dir, diverged=run_divergence(run_dir))
