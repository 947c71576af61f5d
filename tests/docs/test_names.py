"""Every name of headlab a page quotes (README.md, docs/*.md and the results pages: `headlab.x.y`
in backticks) exists where the page says it does, and the packages' documented imports (`from
headlab.analysis import attention_similarity`) work while their __init__ loads nothing heavy."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "science").glob("*.md"),
                *(ROOT / "tools").glob("*.md"), *(ROOT / "benchmarks" / "results").glob("*.md")])


def quoted_names() -> list[tuple[str, str]]:
    """(page, dotted name) for every `headlab.…` a page quotes, a call's parentheses left out."""
    found = set()
    for page in PAGES:
        for name in re.findall(r"`(headlab(?:\.[A-Za-z_]\w*)+)", page.read_text(encoding="utf-8")):
            found.add((str(page.relative_to(ROOT)), name))
    return sorted(found)


def resolve(name: str):
    """The object `name` names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(name)


@pytest.mark.parametrize("page,name", quoted_names())
def test_every_name_a_page_quotes_exists(page, name):
    try:
        resolve(name)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{page} quotes `{name}`, which does not exist: {error}")


def test_the_analysis_packages_documented_imports_load_only_their_own_modules():
    """`from headlab.analysis import attention_similarity` (the README's name for the behaviour view)
    works, in a fresh interpreter in which importing the package alone loaded none of its modules."""
    probe = """
import sys
import headlab.analysis
print(sorted(name for name in sys.modules if name.startswith("headlab.")))
from headlab.analysis import analyze, attention_similarity, concat, norm_scale_effect
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['headlab.analysis', 'headlab.package']"


PACKAGES = sorted(".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "headlab").rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_a_package_exports_is_there(package):
    """A lazy re-export names its module: each name in __all__ is found where the package says."""
    module = importlib.import_module(package)
    assert [name for name in getattr(module, "__all__", ()) if not hasattr(module, name)] == []
