"""Every notebook source `notebooks/NN_name.py` (py:percent) has its paired `NN_name.ipynb`, and
the .ipynb holds exactly the cells jupytext makes of the .py now, without outputs. So CI fails when
one of the pair was edited without the other; `make notebooks` (jupytext --sync) re-pairs them."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("*.py"))
REGENERATE = "regenerate it with `.venv/bin/jupytext --to ipynb notebooks/{name}` or `make notebooks`"


def _cells(notebook) -> list[tuple[str, str, list[str]]]:
    """What must agree between the pair: each cell's type, source and tags (`parameters`)."""
    return [(cell.cell_type, cell.source, list(cell.metadata.get("tags", []))) for cell in notebook.cells]


def _difference(expected: list, actual: list) -> str:
    """The first cell where the .ipynb differs from the .py, as a readable diff."""
    for n, (want, have) in enumerate(zip(expected, actual)):
        if want != have:
            diff = difflib.unified_diff(have[1].splitlines(), want[1].splitlines(), ".ipynb", ".py", lineterm="")
            return (f"cell {n} differs: .ipynb has a {have[0]} cell tagged {have[2]}, the .py a {want[0]} cell "
                    f"tagged {want[2]}\n" + "\n".join(diff))
    return f"the .py has {len(expected)} cells, the .ipynb {len(actual)}"


def test_there_are_notebooks():
    assert SOURCES, f"no notebook sources (*.py) in {NOTEBOOKS}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_ipynb_has_the_cells_of_its_py(source: Path):
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: " + REGENERATE.format(name=source.name)
    expected, actual = _cells(jupytext.read(source)), _cells(jupytext.read(ipynb))
    assert actual == expected, (f"{ipynb.name} has drifted from {source.name}: {_difference(expected, actual)}\n"
                                + REGENERATE.format(name=source.name))


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_pair_is_declared_and_ipynb_has_no_outputs(source: Path):
    notebook = jupytext.read(source)
    assert notebook.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", \
        f"{source.name}: its jupytext header must declare `formats: ipynb,py:percent`"
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.skip(f"{ipynb.name} is missing (reported by the test above)")
    executed = [n for n, cell in enumerate(jupytext.read(ipynb).cells)
                if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not executed, (f"{ipynb.name} carries outputs in cell(s) {executed}: commit it without outputs ("
                          + REGENERATE.format(name=source.name) + ")")


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_one_parameters_cell(source: Path):
    tagged = [cell for cell in jupytext.read(source).cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1 and "SMALL" in tagged[0].source, \
        f"{source.name} must have exactly one cell tagged `parameters`, holding the SMALL switch"
