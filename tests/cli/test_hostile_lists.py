"""Issue 45's round of fresh hostile inputs (tools/hostile/round_issue45_{io,faults,more}.py) lists
its inputs before it runs any: at least 60 distinct ones, each naming the issue's class it attacks,
at least 40 aimed at the io classes (1, 2, 3, 5, 8 where files are read and written). Nothing is
run here: the round itself takes about an hour (tools/hostile_inputs.py --round ...)."""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
ROUNDS = ("issue45_io", "issue45_faults", "issue45_more")


def round_cases():
    sys.path.insert(0, str(TOOLS))
    import importlib

    from hostile.cases import CLASSES
    return CLASSES, {name: importlib.import_module(f"hostile.round_{name}").CASES for name in ROUNDS}


def test_the_round_lists_60_distinct_inputs_each_naming_its_class():
    classes, rounds = round_cases()
    cases = [case for listed in rounds.values() for case in listed]
    assert len({case.name for case in cases}) == len(cases) >= 60
    assert all(case.cls and set(case.cls.split("/")) <= set(classes) and callable(case.inflict) for case in cases)
    assert all(case.title.startswith(f"[{case.cls}] ") for case in cases)  # the page's class column reads it
    io = [case for name in ("issue45_io", "issue45_faults") for case in rounds[name]]
    assert len(io) >= 40 and {case.cls for case in io} <= {"1", "2", "3", "5", "8"}
    assert len(rounds["issue45_more"]) >= 20 and {"4", "6", "7", "9"} <= {case.cls for case in rounds["issue45_more"]}


def test_the_page_counts_every_outcome_by_class(tmp_path):
    sys.path.insert(0, str(TOOLS))
    from hostile_inputs import write_page
    results = [("[2] a forged record", "OK", "done"), ("[2] a user's temporary", "lost", "changed x"),
               ("[8] a FIFO", "clear", "headlab: error: a | b")]
    write_page(tmp_path / "page.md", results, "python tools/hostile_inputs.py", 120.0)
    page = (tmp_path / "page.md").read_text()
    # OK, recovered, clear, vague, traceback, silent wrong, data lost, security, hang
    assert "| 2 | 2 | 1 | 0 | 0 | 0 | 0 | 0 | 1 | 0 | 0 |" in page
    assert "| all | 3 | 1 | 0 | 1 | 0 | 0 | 0 | 1 | 0 | 0 |" in page
    assert "| 2 | a user's temporary | data lost | changed x |" in page and "a / b" in page
