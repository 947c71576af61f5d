"""A newcomer's first hour: every notebook that trains or reads a study (01-05) runs first,
alone, in a fresh clone, in small mode. A fresh clone is a new empty folder holding headlab's
pyproject.toml (so `headlab.study.paths.project_root` finds it, and the notebooks' runs and
outputs go under it, not into this checkout's runs/) and a copy of notebooks/. Each clone is its
own, so these tests share nothing with nbmake's notebooks or the browser test.

What nbmake already shows is not run again here: nbmake executes all six notebooks one after
another on one study, in CI's clone a fresh one, before the browser test writes there, in the
order 00, 03, 01, 02, 04, 05 (tests/conftest.py). 00 reads only the tables shipped inside headlab
and writes nothing, so in CI's clone nbmake runs 03 alone first: it trains the small study, and
01, 02 and 05 take it up (tests/conftest.py checks that each of nbmake's notebooks writes only
into runs/ and adds nothing to a finished study it finds). 04 reads no study, so where it runs
cannot change what it does. Here 01 and 05 run alone first: 01 trains a run with `headlab.train`
before `STUDY.train` takes it up, and 05 says it found no runs of 01. 02, alone, would train
through the calls that 01 (`STUDY.train`) and nbmake's 03 (`study_tables(train=True)`) already
run alone first, so it runs here only in full mode, beside a make demo under way."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from notebook_runs import execute_in_mode, full_mode_beside_a_begun_demo

ROOT = Path(__file__).resolve().parents[2]

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
STORY, *NOTEBOOKS = NOTEBOOKS  # 00_the_finding, then the five that share a study (01-05)

pytestmark = pytest.mark.slow


def fresh_clone(folder: Path) -> Path:
    """`folder` made into a clone with no runs: pyproject.toml and notebooks/ only."""
    (folder / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", folder)
    for notebook in [STORY, *NOTEBOOKS]:
        shutil.copy(notebook, folder / "notebooks")
    return folder


def execute(clone: Path, name: str) -> None:
    """Run every cell of the clone's notebook `name` in small mode (its default) as `make notebooks`
    does (scripts/execute_notebooks.py: from notebooks/, as Jupyter runs it, saved in place with
    its outputs); a failing cell raises `CellExecutionError` naming it. Then check what that
    script promises: the committed notebook's cells, the mode in the metadata and in the
    parameters cell's output, and that cell's source kept (`SMALL = True`)."""
    path = clone / "notebooks" / name
    execute_in_mode(path, "small")
    notebook = nbformat.read(path, as_version=4)
    committed = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    assert [cell.source for cell in notebook.cells] == [cell.source for cell in committed.cells]
    assert notebook.metadata["headlab"] == {"mode": "small"}
    (parameters,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert [o["text"] for o in parameters.outputs] == [
        "small mode: these outputs were made with SMALL = True (scripts/execute_notebooks.py small)\n"]


@pytest.fixture(autouse=True)
def _newcomer(monkeypatch):
    """A newcomer has chosen no study through the environment."""
    monkeypatch.delenv("HEADLAB_STUDY", raising=False)


def test_six_notebooks_are_found():
    assert [p.name[:2] for p in [STORY, *NOTEBOOKS]] == ["00", "01", "02", "03", "04", "05"]


# nbmake runs 03 alone first in CI's clone (and 04, which reads no study); 02 alone repeats 01's and 03's calls.
ALONE = [notebook.name for notebook in NOTEBOOKS if notebook.name.startswith(("01", "05"))]


@pytest.mark.parametrize("name", ALONE, ids=lambda name: name[:2])
def test_notebook_runs_alone_first_in_a_fresh_clone(tmp_path, name):
    """Each writes only into runs/, and one that trains the small study trains one, of six runs."""
    clone = fresh_clone(tmp_path)
    execute(clone, name)
    assert {p.name for p in clone.iterdir()} <= {"pyproject.toml", "notebooks", "runs"}
    studies = list((clone / "runs" / "notebooks" / "small").glob("*/study.json"))
    assert len(studies) <= 1 and all(len(list((s.parent / "runs").glob("*-seed0"))) == 6 for s in studies)


def test_notebook_02_in_full_mode_reads_shipped_tables_and_trains_nothing(tmp_path):
    """Full mode in a fresh clone beside a `make demo` under way (its runs/ begun, no tables yet):
    02 shows the 3-seed cpu-small study from the tables shipped inside headlab, takes apart the
    pretrained MiniLM's weights, and neither trains a run nor writes into the study. (Notebook 03
    in full mode runs beside such a study installed outside any checkout:
    tests/study/test_shipped_tables.py.)"""
    clone = fresh_clone(tmp_path)
    text = full_mode_beside_a_begun_demo(clone, clone / "notebooks" / next(p.name for p in NOTEBOOKS
                                                                          if p.name.startswith("02")))
    assert "all-MiniLM-L6-v2: 6 layers x 12 heads" in text
    assert "cpu-small, 3 seed(s) per variant. Trained with the paper's split: Muon" in text
