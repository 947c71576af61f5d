"""headlab: train small GPTs with MHA / MQA / GQA / MLA / LRKV attention and study their heads.

The package is layered, and data flows one way (a lower layer never imports a higher one):

    model      configs, ops, the five attention families, GPT, decoding caches
    data       tokenizers, text sources, token shards, corpora
    training   trainer, run folders, snapshot writer, plan
    analysis   heads -> spectrum math -> tidy tables (headlab runs and pretrained checkpoints)
    study      variants by role x seeds, statistics, claims, the study's tables on disk
    report     plots, widgets and report.md, drawn from tables only
    cli        `headlab info | train | analyze | reproduce | report`
"""

from importlib import import_module

# Loaded on first use (PEP 562), so `headlab` (and its command line's Ctrl-C guard) starts without
# importing torch first.
EXPORTS = {
    "headlab.analysis": ("Analysis", "analyze"),
    "headlab.data": ("Corpus", "load_corpus"),
    "headlab.model": ("ATTENTION_FAMILIES", "GPT", "PRESETS", "ModelConfig", "preset"),
    "headlab.study": ("comparison_roles", "comparison_variants"),
    "headlab.training": ("Run", "TrainConfig", "TrainingDiverged", "load_run", "train", "train_preset"),
}
MODULE_OF = {name: module for module, names in EXPORTS.items() for name in names}
__all__ = sorted(MODULE_OF)


def __getattr__(name: str):
    if name == "__version__":
        return import_module("headlab.training.runs").installed_version()
    if name in MODULE_OF:
        return getattr(import_module(MODULE_OF[name]), name)
    raise AttributeError(f"module 'headlab' has no attribute {name!r}")
