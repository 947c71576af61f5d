"""The study layer: the comparison variants by role x seeds as run folders, the statistics every
claim follows, and the study's tables on disk."""

from headlab.study.roles import comparison_roles, comparison_variants
from headlab.study.study import NotebookStudy, Study, StudyRun

__all__ = ["NotebookStudy", "Study", "StudyRun", "comparison_roles", "comparison_variants"]
