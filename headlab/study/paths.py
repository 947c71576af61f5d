"""Where the project is, from any working directory, and how a log line names a folder in it."""

from __future__ import annotations

import os
import re
from pathlib import Path


def project_root(start: str | Path | None = None) -> Path:
    """The nearest folder at or above `start` (default: the working directory) that holds
    headlab's pyproject.toml, so a notebook run from notebooks/ finds the project's runs/; else
    the source checkout headlab is imported from; else `start` itself (an installed package, Colab)."""
    start = Path(start or Path.cwd()).resolve()
    checkout = Path(__file__).resolve().parents[2]
    for folder in (start, *start.parents, checkout):
        project = folder / "pyproject.toml"
        if project.is_file() and re.search(r'^name\s*=\s*"headlab"', project.read_text(encoding="utf-8"), re.M):
            return folder
    return start


def shown_path(path: str | Path) -> str:
    """`path` as a log line names it: inside the project relative to the working directory (so a
    notebook's saved output names no machine's folders), elsewhere as it is."""
    return os.path.relpath(path) if Path(path).resolve().is_relative_to(project_root()) else str(path)
