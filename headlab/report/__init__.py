"""The report layer: figures, the widget explorer and report.md, drawn from a study's tables only."""

from headlab.report.writer import write_report

__all__ = ["write_report"]
