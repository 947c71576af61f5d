"""A notebook run as `make notebooks-full` runs it (scripts/execute_notebooks.py full) beside a
`make demo` under way, which the fresh-clone test (notebook 02) and the installed-package test
(notebook 03) both check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from execute_notebooks import execute as execute_in_mode  # noqa: E402, F401  (the fresh-clone tests run it too)

STAND_IN = "is not finished (no tables yet): showing instead the cpu-small tables shipped with headlab"


def printed(notebook: Path) -> str:
    """Everything the saved `notebook`'s code cells printed."""
    return "".join(output.get("text", "") for cell in nbformat.read(notebook, as_version=4).cells
                   if cell.cell_type == "code" for output in cell.outputs)


def full_mode_beside_a_begun_demo(project: Path, notebook: Path) -> str:
    """`notebook`, saved under `project` (the folder whose runs/reproduce `make demo` writes), executed
    in full mode while that study has begun (its runs/, no tables yet). It must say so and show the
    cpu-small tables shipped with headlab instead, train no run, and leave the study's folder as it
    was. Returns what it printed."""
    begun = project / "runs" / "reproduce"
    (begun / "runs").mkdir(parents=True)
    execute_in_mode(notebook, "full")
    text = printed(notebook)
    assert f"the study in {os.path.relpath(begun, notebook.parent)} {STAND_IN}" in text
    assert not list(project.rglob("config.json"))  # no run trained, begun or loaded into a folder
    assert [p.name for p in begun.iterdir()] == ["runs"]  # the study's folder untouched
    return text
