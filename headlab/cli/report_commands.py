"""The commands that redraw from a study's tables, `report` and `docs`: apart from the others so
that they load no torch (they train and analyse nothing), which takes about 2 s off each here."""

from __future__ import annotations

from headlab.report.writer import write_docs, write_report
from headlab.study.table_files import read_study_tables


def cmd_report(args) -> int:
    """Redraw report.md and every figure of a study folder from its tables (no torch work)."""
    report = write_report(read_study_tables(args.folder), args.folder, svg=args.svg)
    print(f"report written: {report}")
    return 0


def cmd_docs(args) -> int:
    """The README's figures and headline table from a study's tables (no torch work)."""
    headline = write_docs(read_study_tables(args.folder), args.out, svg=args.svg)
    print(f"headline table and figures written: {headline.parent}")
    return 0
