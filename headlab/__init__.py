"""headlab: train small GPTs with MHA / MQA / GQA / MLA / LRKV attention and study their heads."""

__version__ = "0.1.0"

from .analysis import Analysis, analyze  # noqa: E402
from .config import ATTENTION_FAMILIES, PRESETS, ModelConfig, comparison_roles, comparison_variants, preset  # noqa: E402
from .data import Corpus, load_corpus  # noqa: E402
from .model import GPT  # noqa: E402
from .runs import Run, load_run  # noqa: E402
from .train import TrainConfig, TrainingDiverged, train, train_preset  # noqa: E402

__all__ = [
    "ATTENTION_FAMILIES", "Analysis", "Corpus", "GPT", "ModelConfig", "PRESETS", "Run", "TrainConfig", "TrainingDiverged",
    "analyze", "comparison_roles", "comparison_variants", "load_corpus", "load_run", "preset", "train", "train_preset",
]
