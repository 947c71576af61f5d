"""The report layer: figures, the widget explorer and report.md, drawn from a study's tables only."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.report.writer": ("write_report",),
})
