"""The model layer: configs and presets, elementwise ops, the five attention families, the GPT and its
decode caches. Imports nothing else of headlab."""

from headlab.model.config import ATTENTION_FAMILIES, PRESETS, ModelConfig, preset
from headlab.model.gpt import GPT, count_parameters

__all__ = ["ATTENTION_FAMILIES", "GPT", "ModelConfig", "PRESETS", "count_parameters", "preset"]
