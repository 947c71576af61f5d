"""headlab: train small GPTs with MHA / MQA / GQA / MLA / LRKV attention and study their heads."""

from .config import ATTENTION_FAMILIES, PRESETS, ModelConfig, comparison_variants, preset
from .model import GPT

__version__ = "0.1.0"

__all__ = ["ATTENTION_FAMILIES", "GPT", "ModelConfig", "PRESETS", "comparison_variants", "preset"]
