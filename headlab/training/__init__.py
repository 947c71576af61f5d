"""The training layer: training settings, the trainer, run folders, analysis snapshots and the plan."""

from headlab.training.config import TRAIN_PRESETS, TrainConfig, train_preset
from headlab.training.runs import Run, load_run
from headlab.training.trainer import TrainingDiverged, train

__all__ = ["Run", "TRAIN_PRESETS", "TrainConfig", "TrainingDiverged", "load_run", "train", "train_preset"]
