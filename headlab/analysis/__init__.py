"""The analysis layer: per-head forms of headlab runs and pretrained checkpoints, the spectrum math
on them, and the tidy tables that every later layer reads."""

from headlab.analysis.similarity import Analysis, analyze, concat, measure_agreement

__all__ = ["Analysis", "analyze", "concat", "measure_agreement"]
