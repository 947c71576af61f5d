"""Execute the paired notebooks in place, in one mode, and record the mode in each notebook's
metadata (`headlab.mode`), so a saved notebook says what made its outputs.

    python scripts/execute_notebooks.py small notebooks/*.ipynb   # make notebooks: CI's settings
    python scripts/execute_notebooks.py full notebooks/*.ipynb    # make notebooks-full: SMALL = False,
                                                                  # make demo's runs/reproduce, or its shipped
                                                                  # tables where it is not there (they say so)

The mode is set like papermill's parameter injection, offline with nbclient: `SMALL = ...` and a
line printing the mode are appended to the `parameters` cell for the run, and the cell's source is
put back afterwards, so the .ipynb still holds exactly the cells of its .py
(tests/notebooks/test_notebooks_paired.py) while the cell's output says which mode made the outputs."""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

MODES = ("small", "full")


def execute(path: Path, mode: str) -> None:
    notebook = nbformat.read(path, as_version=4)
    (parameters,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    source = parameters.source
    # The restored cell shows its default; its output says which mode made the notebook's outputs.
    parameters.source = (f"{source}\nSMALL = {mode == 'small'}\n"
                         f"print('{mode} mode: these outputs were made with SMALL = {mode == 'small'} "
                         f"(scripts/{Path(__file__).name} {mode})')")
    NotebookClient(notebook, timeout=None, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    parameters.source = source
    notebook.metadata["headlab"] = {"mode": mode}
    nbformat.write(notebook, path)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        sys.exit(f"usage: {Path(__file__).name} {{{','.join(MODES)}}} NOTEBOOK.ipynb ...")
    for name in sys.argv[2:]:
        print(f"executing {name} in {sys.argv[1]} mode")
        execute(Path(name), sys.argv[1])
