"""The training layer: training settings, the trainer and the `Run` it returns, processes under torchrun, the plan."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.training.config": ("TRAIN_PRESETS", "TrainConfig", "train_preset"),
    "headlab.training.runs": ("Run", "load_run"),
    "headlab.training.trainer": ("TrainingDiverged", "train"),
})
