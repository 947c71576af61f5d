"""The model layer: configs and presets, elementwise ops, the five attention families, the GPT and its
decode caches. Imports no other layer of headlab."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.model.config": ("PRESETS", "ModelConfig", "preset"),
    "headlab.model.gpt": ("GPT", "count_parameters"),
})
