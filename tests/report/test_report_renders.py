"""The report renders a study's tables and computes nothing: following write_report (and the
README's headline) through every call it makes reaches no function of the study layer but the ones
that read its tables (`table_files`), quote the paper (`paper`) and write a cell (`cells`). The
claims, seed distances, baselines and spreads it prints are the study's (`headlab.study.conclusions`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import headlab.report.writer
from headlab.report.writer import headline_lines, write_report
from headlab.study.table_files import SHIPPED, read_study_tables

ALLOWED = {"table_files.py", "paper.py", "cells.py"}  # reading tables, the paper's numbers, a cell as text


class NoFigures:
    """The plots package without drawing (figures are the plots' tests'): what the report asks of it,
    given back as an empty path; its table helpers and the names of the files a figure is saved as,
    as they are."""

    def __init__(self, plots):
        self.plots = plots

    def __getattr__(self, name):
        if name in ("table_palette", "layer_roles", "figure_files"):
            return getattr(self.plots, name)
        return lambda *args, **kwargs: Path(f"figures/{name}.png")


def study_calls(run) -> set[tuple[str, str]]:
    """(file, function) of every call into headlab/study/ while `run()` runs."""
    calls = set()

    def profile(frame, event, arg):
        if event == "call" and f"{Path('headlab', 'study')}" in frame.f_code.co_filename:
            calls.add((Path(frame.f_code.co_filename).name, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("what", ["report", "headline"])
def test_the_report_renders_the_studys_tables_and_computes_nothing(what, tmp_path, monkeypatch):
    tables = read_study_tables(SHIPPED)  # with the conclusions the study computed, as it wrote them
    monkeypatch.setattr(headlab.report.writer, "plots", NoFigures(headlab.report.writer.plots))
    run = (lambda: write_report(tables, tmp_path)) if what == "report" else (lambda: headline_lines(tables))
    calls = study_calls(run)
    assert {call for call in calls if call[0] not in ALLOWED} == set()
    assert ("table_files.py", "__getitem__") in calls  # the tracer saw the study's tables being read
