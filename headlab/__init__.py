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

from headlab.training.runs import installed_version

__version__ = installed_version()

from headlab.analysis import Analysis, analyze  # noqa: E402
from headlab.data import Corpus, load_corpus  # noqa: E402
from headlab.model import ATTENTION_FAMILIES, GPT, PRESETS, ModelConfig, preset  # noqa: E402
from headlab.study import comparison_roles, comparison_variants  # noqa: E402
from headlab.training import Run, TrainConfig, TrainingDiverged, load_run, train, train_preset  # noqa: E402

__all__ = [
    "ATTENTION_FAMILIES", "Analysis", "Corpus", "GPT", "ModelConfig", "PRESETS", "Run", "TrainConfig", "TrainingDiverged",
    "analyze", "comparison_roles", "comparison_variants", "load_corpus", "load_run", "preset", "train", "train_preset",
]
