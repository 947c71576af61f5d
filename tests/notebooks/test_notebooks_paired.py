"""Every notebook source `notebooks/NN_name.py` (py:percent) has its paired `NN_name.ipynb`, and
the .ipynb holds exactly the cells jupytext makes of the .py now. So CI fails when one of the pair
was edited without the other; `make notebooks` re-pairs them and executes the .ipynb in small mode.
The committed .ipynb carry those outputs, so a reader without a kernel (GitHub, nbviewer) sees
every figure: each cell that ends in a figure and the explorer cell hold a PNG, and no output is
an error, a stderr stream or a progress bar. Every .py is valid Python; the Colab cells are one
install cell, with pyproject's repository URL (None while it has none), which on a Colab without
headlab installs the `colab` extra from what the user points it at, or says what to do."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest
import tomllib

jupytext = pytest.importorskip("jupytext")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("*.py"))
REGENERATE = "regenerate it with `make notebooks`"
PUBLISHED = re.search(r'^Repository = "(.+)"$', (NOTEBOOKS.parent / "pyproject.toml").read_text(), re.M)
REPOSITORY = PUBLISHED.group(1) if PUBLISHED else None  # None until the repository is published
FIGURE_CALL = re.compile(r"^(plots\.\w+_(figure|heatmaps)\(|explorer$)")  # a last line that displays a figure


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
def test_pair_is_declared(source: Path):
    notebook = jupytext.read(source)
    assert notebook.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", \
        f"{source.name}: its jupytext header must declare `formats: ipynb,py:percent`"


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_ipynb_is_executed_and_shows_its_figures_without_a_kernel(source: Path):
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.skip(f"{ipynb.name} is missing (reported by the test above)")
    code = [cell for cell in jupytext.read(ipynb).cells if cell.cell_type == "code"]
    unexecuted = [n for n, cell in enumerate(code) if cell.get("execution_count") is None]
    assert not unexecuted, f"{ipynb.name}: code cell(s) {unexecuted} were not executed: " + REGENERATE
    for n, cell in enumerate(code):
        outputs = cell.get("outputs", [])
        bad = [o.get("ename") or o.get("name") for o in outputs if o["output_type"] == "error"
               or (o["output_type"] == "stream" and (o["name"] == "stderr" or "0%|" in o["text"]))]
        assert not bad, f"{ipynb.name}, code cell {n}: outputs {bad} (an error, stderr or a progress bar)"
        if FIGURE_CALL.match(cell.source.strip().splitlines()[-1]):
            assert any("image/png" in o.get("data", {}) for o in outputs), \
                f"{ipynb.name}, code cell {n} ends in a figure but holds no PNG: " + REGENERATE


def colab_cell(source: Path) -> str:
    """The install cell of a notebook: the one that imports google.colab."""
    (cell,) = [cell for cell in jupytext.read(source).cells if "import google.colab" in cell.source]
    return cell.source


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_source_is_valid_python(source: Path):
    ast.parse(source.read_text(encoding="utf-8"), filename=source.name)  # a SyntaxError names file and line


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_colab_cell_installs_from_the_repository_in_pyproject(source: Path):
    cell = colab_cell(source)
    assert f"REPOSITORY = {REPOSITORY!r}  #" in cell, \
        f"{source.name}: its Colab cell must set REPOSITORY = {REPOSITORY!r} (pyproject.toml's [project.urls])"
    install = colab_cell(SOURCES[0])  # every notebook installs the same way; 03 adds Colab's widget manager
    assert cell.startswith(install), f"{source.name}: its Colab cell must begin as {SOURCES[0].name}'s does"
    assert "git+{REPOSITORY}" in install and "SystemExit" not in install  # Colab shows it as an exception


class FakeIPython:
    """The `get_ipython()` of a Colab cell: records the line magics (%pip) it runs."""

    def __init__(self):
        self.magics: list[tuple[str, str]] = []

    def run_line_magic(self, name: str, line: str) -> None:
        self.magics.append((name, line))


def run_colab_cell(source: Path, monkeypatch, on_colab: bool = True) -> list[tuple[str, str]]:
    """Execute the Colab cell of `source` as on a Colab where headlab is not installed (a
    google.colab module; headlab not found); returns the magics it ran."""
    if on_colab:
        colab = types.ModuleType("google.colab")
        colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: None)
        monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
        monkeypatch.setitem(sys.modules, "google.colab", colab)
    else:
        monkeypatch.setitem(sys.modules, "google.colab", None)  # import google.colab raises ImportError
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "headlab" else find_spec(name, *rest))
    ipython = FakeIPython()
    exec(compile(colab_cell(source), source.name, "exec"), {"get_ipython": lambda: ipython})
    return ipython.magics


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_colab_cell_without_a_source_says_what_to_do_without_an_exception(source: Path, monkeypatch, capsys):
    monkeypatch.delenv("HEADLAB_SOURCE", raising=False)
    assert run_colab_cell(source, monkeypatch) == ([] if REPOSITORY is None else [
        ("pip", f'install --quiet "headlab[colab] @ git+{REPOSITORY}"')])
    if REPOSITORY is None:
        assert "set HEADLAB_SOURCE to its path" in capsys.readouterr().out


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_colab_cell_installs_the_colab_extra_from_what_the_user_points_it_at(source: Path, monkeypatch, tmp_path):
    wheel = tmp_path / "headlab-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    monkeypatch.setenv("HEADLAB_SOURCE", str(wheel))
    assert run_colab_cell(source, monkeypatch) == [("pip", f'install --quiet "headlab[colab] @ {wheel.as_uri()}"')]
    monkeypatch.setenv("HEADLAB_SOURCE", "git+https://example.org/headlab.git")
    assert run_colab_cell(source, monkeypatch) == [
        ("pip", 'install --quiet "headlab[colab] @ git+https://example.org/headlab.git"')]
    assert run_colab_cell(source, monkeypatch, on_colab=False) == []  # elsewhere the user installs headlab


def test_colab_extra_is_the_notebooks_extra_without_a_notebook_server():
    extras = tomllib.loads((NOTEBOOKS.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    server = {"jupyterlab", "ipykernel", "jupytext"}  # Colab brings its own
    assert requirement_names(extras["colab"]) == requirement_names(extras["notebooks"]) - server


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in requirements}


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_one_parameters_cell(source: Path):
    tagged = [cell for cell in jupytext.read(source).cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1 and "SMALL" in tagged[0].source, \
        f"{source.name} must have exactly one cell tagged `parameters`, holding the SMALL switch"


def notebook_mode(path: Path) -> str:
    """The mode that made a saved notebook's outputs (`make notebooks`: small, `make notebooks-full`:
    full), as scripts/execute_notebooks.py records it; 'unrecorded' for a notebook executed otherwise."""
    return jupytext.read(path).metadata.get("headlab", {}).get("mode", "unrecorded")


# Expected to fail until the committed notebooks are regenerated: `make demo && make notebooks-full`.
@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_committed_notebooks_show_full_mode_results(source: Path):
    mode = notebook_mode(source.with_suffix(".ipynb"))
    assert mode == "full", (f"{source.with_suffix('.ipynb').name} was executed in {mode} mode: commit it as "
                            "`make demo && make notebooks-full` leaves it, so a visitor sees real results")
