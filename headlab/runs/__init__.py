"""The run-folder layer: one training run on disk (config.json, metrics, atomic checkpoints and
analysis snapshots, all behind one manifest), written through `RunFolder` and read by
`load_weights`. It sits below training, so analysis reads runs without loading the trainer."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.runs.folder": ("RunFolder", "Weights", "load_weights"),
    "headlab.runs.checkpoints": ("CheckpointWriteFailed", "has_checkpoint"),
    "headlab.runs.metrics": ("read_metrics",),
})
