"""Time notebooks 02 and 03 in full mode as Colab runs them: headlab installed from a wheel (not
editable) with the `colab` extra, the notebooks copied into an empty folder outside any checkout.
Each must show make demo's 3-seed study from the tables shipped inside the package and train
nothing (no run folder anywhere under the folder).

    python -m pip wheel --no-deps . -w /tmp/wheel                     # in the checkout
    python3 -m venv /tmp/colab && /tmp/colab/bin/pip install torch==2.13.0
    /tmp/colab/bin/pip install "headlab[colab] @ file:///tmp/wheel/headlab-0.1.0-py3-none-any.whl" \\
        nbclient ipykernel                                            # what Colab brings itself
    /tmp/colab/bin/python scripts/time_installed_notebooks.py         # from the checkout: it reads notebooks/

Run it with the installed environment's python; it refuses to time a checkout's headlab. The
numbers go to stdout; issue 30 asks for under a minute each."""

import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from execute_notebooks import execute

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("02_extract_spectra.ipynb", "03_compare_layers.ipynb")
SHIPPED_NOTE = "showing instead the cpu-small tables shipped with headlab"


def printed(path: Path) -> str:
    """Everything the notebook's code cells printed."""
    return "".join(output.get("text", "") for cell in nbformat.read(path, as_version=4).cells
                   if cell.cell_type == "code" for output in cell.outputs)


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="headlab-colab-"))
    probe = folder / "probe.ipynb"  # where the kernel's headlab comes from, seen from that folder
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import headlab\nprint(headlab.__file__)", metadata={"tags": ["parameters"]})]), probe)
    execute(probe, "full")
    imported = printed(probe).splitlines()[0]
    if "site-packages" not in imported:
        sys.exit(f"headlab is imported from a checkout here ({imported}): "
                 "run this with the python of an environment that installed the wheel")
    failed = False
    for name in NAMES:
        path = folder / name
        shutil.copy(NOTEBOOKS / name, path)
        start = time.perf_counter()
        execute(path, "full")
        seconds = time.perf_counter() - start
        runs = list(folder.rglob("config.json"))
        shipped = SHIPPED_NOTE in printed(path)
        print(f"{name}: {seconds:.1f} s in full mode, shipped tables read: {shipped}, run folders made: {len(runs)}")
        failed |= bool(runs) or not shipped
    shutil.rmtree(folder)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
