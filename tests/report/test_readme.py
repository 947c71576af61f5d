"""The README's results block (between its RESULTS markers) states only what make demo's tables say:
the headline `make docs` writes from them (docs/headline.md; here regenerated from the copy of those
tables the package ships, headlab/study/shipped/cpu-small), quoted whole, and around it prose whose every
number is one the headline states. A number from another study (the AdamW recipe, an ablation)
belongs below the block, beside the benchmark that measured it. (The first screen and every other
section marked with its sources: tests/docs/test_pages_agree.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headlab.report.writer import headline_lines
from headlab.study.table_files import SHIPPED, read_study_tables

ROOT = Path(__file__).resolve().parents[2]


def numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+(?:\.\d+)?", text))


@pytest.fixture(scope="module")
def headline() -> str:
    return "\n".join(headline_lines(read_study_tables(SHIPPED)))


def test_docs_headline_is_what_make_docs_writes_from_the_demo_tables(headline):
    assert (ROOT / "docs" / "headline.md").read_text(encoding="utf-8") == headline


def test_the_readme_quotes_the_headline_and_no_number_it_does_not_state(headline):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("<!-- RESULTS"):readme.index("<!-- /RESULTS -->")]
    assert headline.strip() in block
    assert numbers(block.replace(headline.strip(), "")) - numbers(headline) == set()
