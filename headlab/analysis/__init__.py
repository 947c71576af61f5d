"""The analysis layer: per-head forms of headlab runs and pretrained checkpoints, the spectrum math
on them, and the tidy tables that every later layer reads."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.analysis.attention_maps": ("attention_similarity",),
    "headlab.analysis.qk_norm": ("norm_scale_effect",),
    "headlab.analysis.measures": ("measure_agreement",),
    "headlab.analysis.similarity": ("Analysis", "analyze", "concat"),
})
