"""The pages agree with each other and with the tables they quote: README.md, docs/*.md and the
results pages (science/*.md, benchmarks/results/*.md, tools/*.md).

- A section marked `<!-- NAME: from A and B -->` … `<!-- /NAME -->` states only numbers that its
  sources state, to the digits it shows (−27.3 is held by a source's −27.30, not by −27.2); a
  sentence of it about `make demo` only numbers of make demo's own tables (docs/headline.md); a
  count of seeds it claims ("3 seeds each") covers every seed count its sources' tables show.
- A results page shows a training command only beside result rows of that command's seeds.
- Words that read a sign ("negative: the gap closes") stand beside numbers of that sign.
- A page that says a variant was not trained under a preset names none that the preset's headline
  table has.
- What `headlab docs --help` says headline.md holds, it holds; what the README says the committed
  notebooks read, their outputs say they read.
(The README's results block against make demo's headline: tests/report/test_readme.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from headlab.cli.parser import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "science").glob("*.md"),
                *(ROOT / "benchmarks" / "results").glob("*.md"), *(ROOT / "tools").glob("*.md")])
RESULT_PAGES = [page for page in PAGES if page.parent.name in ("science", "results", "tools")]
NUMBER = r"[−-]?\d+(?:,\d{3})*(?:\.\d+)?"
HEADLINE = ROOT / "docs" / "headline.md"  # make demo's tables, as `make docs` writes them


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def numbers(text: str) -> list[str]:
    """The numbers of `text` as written (a thousands comma dropped, a minus sign kept)."""
    return [n.replace(",", "").replace("−", "-") for n in re.findall(NUMBER, text)]


def held(number: str, stated: list[str]) -> bool:
    """Whether a source states `number` to the digits it is written with: some source number with at
    least as many decimals rounds to it (the sign ignored: a page may say 'lower by 8.4')."""
    digits = len(number.split(".")[1]) if "." in number else 0
    value = abs(float(number))
    return any(len(s.split(".")[1] if "." in s else "") >= digits and round(abs(float(s)), digits) == value
               for s in stated)


def without_links(text: str) -> str:
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"<!--.*?-->", "", text, flags=re.S))


def marked_sections() -> list[tuple[str, str, list[Path], str]]:
    """(page, marker name, sources, text) of every marked section (the README's RESULTS block aside)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"<!-- ([A-Z]+): from (.+?) -->(.*?)<!-- /\1 -->", text, re.S):
            if match.group(1) == "RESULTS":
                continue
            sources = [ROOT / s.strip(" `") for s in re.split(r",| and ", match.group(2)) if s.strip(" `")]
            found.append((name(page), match.group(1), sources, match.group(3)))
    return found


SECTIONS = marked_sections()
IDS = [f"{page}:{marker}" for page, marker, _, _ in SECTIONS]


def tables(text: str) -> list[list[dict[str, str]]]:
    """The markdown tables of `text`, each a list of rows {header: cell}."""
    found = []
    for block in re.findall(r"((?:^\|.*\|[ \t]*\n?)+)", text, re.M):
        lines = [line.strip().strip("|").split("|") for line in block.strip().splitlines()]
        if len(lines) > 2 and set("".join(lines[1])) <= set("-: "):
            header = [cell.strip() for cell in lines[0]]
            found.append([dict(zip(header, (cell.strip() for cell in row))) for row in lines[2:]])
    return found


def sentences(text: str) -> list[str]:
    """The sentences of the prose of `text` (its tables, code and headings left out)."""
    prose = [p for p in re.split(r"\n\s*\n", text) if p.strip() and p.lstrip()[0] not in "|#" and p[:4] != "    "]
    return [s for paragraph in prose for s in re.split(r"(?<=[.;])\s+(?=[A-Z(`*])", " ".join(paragraph.split()))]


def test_every_marker_names_files_that_exist():
    assert SECTIONS, "no page marks a section with its sources"
    assert [(page, str(s)) for page, _, sources, _ in SECTIONS for s in sources if not s.is_file()] == []


@pytest.mark.parametrize("page,marker,sources,text", SECTIONS, ids=IDS)
def test_a_marked_section_states_only_numbers_its_sources_state(page, marker, sources, text):
    stated = [n for source in sources for n in numbers(source.read_text(encoding="utf-8"))]
    assert [n for n in numbers(without_links(text)) if not held(n, stated)] == []


@pytest.mark.parametrize("page,marker,sources,text", SECTIONS, ids=IDS)
def test_a_sentence_about_make_demo_quotes_make_demos_tables(page, marker, sources, text):
    """make demo's numbers are its tables' (docs/headline.md), not another training of its recipe."""
    demo = numbers(HEADLINE.read_text(encoding="utf-8"))
    about_demo = [s for s in sentences(without_links(text)) if "`make demo`" in s]
    assert [(n, s[:120]) for s in about_demo for n in numbers(s) if not held(n, demo)] == []


@pytest.mark.parametrize("page,marker,sources,text", SECTIONS, ids=IDS)
def test_a_count_of_seeds_covers_every_count_its_sources_show(page, marker, sources, text):
    shown = {row["seeds"] for source in sources for table in tables(source.read_text(encoding="utf-8"))
             for row in table if "seeds" in row}
    for claim in re.finditer(r"(\d+)(?: or (\d+))? seeds each", text):
        assert shown <= {claim.group(1), claim.group(2)}, f"{claim.group(0)!r}, but the tables show {sorted(shown)}"


def section_texts(text: str) -> list[str]:
    return re.split(r"^## ", text, flags=re.M)


@pytest.mark.parametrize("page", RESULT_PAGES, ids=name)
def test_a_results_page_shows_a_command_beside_rows_of_its_seeds(page):
    """A command shown (indented) above a table with a seeds column trained rows of its seed count."""
    for section in section_texts(page.read_text(encoding="utf-8")):
        seeds = {row["seeds"] for table in tables(section) for row in table if "seeds" in row}
        if not seeds:
            continue
        for command in re.findall(r"^ {4}(\S.*--seeds (\d+).*)$", section, re.M):
            assert command[1] in seeds, f"{name(page)} shows `{command[0].strip()}`, but no row has {command[1]} seeds"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_words_that_read_a_sign_stand_beside_numbers_of_that_sign(page):
    for sentence in sentences(page.read_text(encoding="utf-8")):
        for word, sign in (("negative:", "-"), ("positive:", "+")):
            if word in sentence:
                signed = re.findall(r"(?<![\w.])([+−-])\d+\.\d+(?= \(| over)", sentence)
                assert all(s.replace("−", "-") == sign for s in signed), f"{name(page)}: {sentence[:300]}"


def headline_of(preset: str) -> Path | None:
    """The headline page `make docs` wrote for `preset` (its first line names it)."""
    for page in (ROOT / "docs").rglob("headline.md"):
        if page.read_text(encoding="utf-8").startswith(f"`{preset}`:"):
            return page
    return None


VARIANTS = {"MHA": "Standard MHA", "LRKV": "LRKV", "MQA": "MQA", "MLA": "MLA", "GQA": "GQA"}


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_a_variant_said_untrained_under_a_preset_is_not_in_its_headline(page):
    for section in section_texts(page.read_text(encoding="utf-8")):
        presets = set(re.findall(r"cpu-[a-z-]+", section.splitlines()[0] if section else ""))
        for sentence in sentences(section):
            if not re.search(r"not been trained|never trained", sentence):
                continue
            for preset in presets | set(re.findall(r"`(cpu-[a-z-]+)`", sentence)):
                headline = headline_of(preset)
                trained = set() if headline is None else {row["ours"].split(" (")[0] for row in
                                                          tables(headline.read_text(encoding="utf-8"))[0]}
                said = {short for short in VARIANTS if re.search(rf"\b{short}\b", sentence)}
                assert not {s for s in said if any(t.startswith(VARIANTS[s]) for t in trained)}, sentence[:300]


def test_docs_help_promises_only_what_headline_holds():
    """Each item `headlab docs --help` lists for headline.md, and where in it a reader finds it."""
    where = {"loss and effective rank": "% of H", "mean ± sd over seeds": " ± ",
             "paired differences to MHA ± 95% half-width": "vs MHA (paired)"}
    (docs,) = [command for command in COMMANDS if command.name == "docs"]
    promised = re.search(r"headline\.md \(([^)]*)\)", docs.description).group(1)
    headline = HEADLINE.read_text(encoding="utf-8")
    items = [item.strip() for item in re.split(r",(?![^(]*\))", promised)]
    assert [item for item in items if item not in where or where[item] not in headline] == []


def notebook_outputs(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "".join("".join(output.get("text", "")) for cell in cells for output in cell.get("outputs", []))


def test_the_readme_says_what_the_committed_notebooks_read():
    """Where a committed notebook printed that it read the tables shipped with headlab (no finished
    study in ../runs/reproduce), the README says so of the committed notebooks."""
    shipped = [p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
               if re.search(r"no (finished )?study in \S+: .*tables shipped with headlab", notebook_outputs(p))]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    said = re.search(r"The committed `\.ipynb` are executed[^.]*\.[^.]*\.", readme).group(0)
    assert ("shipped" in said) == bool(shipped), (shipped, said)
