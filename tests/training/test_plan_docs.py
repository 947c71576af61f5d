"""Every `--plan` the README and docs/ quote (a `$ headlab ... --plan` line of a console block and
the lines below it) is what that command prints today: a change to the plan's arithmetic (memory,
wall time) fails here until the quoted tables are regenerated."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

import headlab.study.study
from headlab.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = re.compile(r"^( *)```console\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def quoted_plans(text: str) -> list[tuple[str, str]]:
    """(command, its quoted output) of every `$ headlab ... --plan` in the console blocks of a
    Markdown text: a command goes on past lines ending in a backslash, its output to the next `$ `
    line or the block's end."""
    plans = []
    for block in CONSOLE.finditer(text):
        lines = textwrap.dedent(block.group(2)).splitlines()
        starts = [n for n, line in enumerate(lines) if line.startswith("$ ")] + [len(lines)]
        for start, end in zip(starts, starts[1:]):
            command, n = lines[start][2:], start
            while command.endswith("\\"):
                n += 1
                command = command[:-1] + " " + lines[n].strip()
            if command.startswith("headlab ") and "--plan" in command.split():
                plans.append((command, "\n".join(lines[n + 1:end]).strip("\n")))
    return plans


PLANS = [(path.relative_to(ROOT).as_posix(), command, output)
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
         for command, output in quoted_plans(path.read_text(encoding="utf-8"))]


def test_the_docs_quote_plans():
    assert {path for path, *_ in PLANS} >= {"docs/paper-scale.md", "docs/training.md"}


@pytest.mark.parametrize("path, command, quoted", PLANS, ids=[f"{path}:{n}" for n, (path, *_) in enumerate(PLANS)])
def test_a_quoted_plan_is_what_its_command_prints_today(path, command, quoted, capsys, monkeypatch):
    """On any machine: a plan for GPUs never depends on the cores of the machine that prints it."""
    monkeypatch.setattr(headlab.study.study, "available_cores", lambda: 8)
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.strip("\n") == quoted
