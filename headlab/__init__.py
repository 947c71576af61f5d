"""headlab: train small GPTs with MHA / MQA / GQA / MLA / LRKV attention and study their heads.

The package is layered, and data flows one way (a lower layer never imports a higher one):

    schema     the tables' vocabulary (column names, kinds, circuits, measures, roles), stdlib only
    model      configs, ops, the five attention families, GPT, decoding caches
    data       tokenizers, text sources, token shards, corpora
    runs       run folders: config, metrics, atomic checkpoints, snapshots; written and read
    training   trainer, processes under torchrun, FLOPs / memory / hardware models, plan
    analysis   heads -> spectrum math -> tidy tables (headlab runs and pretrained checkpoints)
    study      variants by role x seeds, statistics, claims, the study's tables on disk
    report     plots, widgets and report.md, drawn from tables only
    cli        `headlab info | train | analyze | reproduce | sweep | report | docs`
"""

from headlab.package import installed_version, lazy_exports

# Loaded on first use (PEP 562), so `headlab` (and its command line's Ctrl-C guard) starts without
# importing torch first; so do the packages below it, so that a module loads only what it imports.
exported, listed, __all__ = lazy_exports(__name__, {
    "headlab.analysis.similarity": ("Analysis", "analyze"),
    "headlab.data.corpus": ("load_corpus",),
    "headlab.data.shards": ("Corpus",),
    "headlab.model.config": ("PRESETS", "ModelConfig", "preset"),
    "headlab.model.gpt": ("GPT",),
    "headlab.schema": ("FAMILIES",),
    "headlab.study.roles": ("comparison_roles", "comparison_variants"),
    "headlab.training.config": ("TrainConfig", "train_preset"),
    "headlab.training.runs": ("Run", "load_run"),
    "headlab.training.trainer": ("TrainingDiverged", "train"),
})


def __getattr__(name: str):
    return installed_version() if name == "__version__" else exported(name)


def __dir__() -> list[str]:
    return sorted({*listed(), "__version__"})
