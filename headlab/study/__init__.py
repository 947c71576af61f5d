"""The study layer: the comparison variants by role x seeds as run folders, the statistics every
claim follows, and the study's tables on disk."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.study.roles": ("comparison_roles", "comparison_variants"),
    "headlab.study.notebook": ("NotebookStudy",),
    "headlab.study.study": ("Study", "StudyRun"),
})
