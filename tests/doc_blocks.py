"""The code of README.md and docs/*.md as the tests run it: each fenced block, its language (the info
string: python, bash, console; a block that is not code says `text`), and its commands.

A block runs as written, except where a test substitutes a smaller budget (a tiny preset, fewer
steps or seeds, a temporary folder): `run_python` applies such substitutions and refuses one
whose text the block no longer holds, so a page that changes its example changes the test too."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
LANGUAGES = ("python", "bash", "console", "text")  # text: a block that is not code (a tree, a listing)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of its opening fence, from 1
    info: str  # the fence's info string
    text: str

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One command of a shell block: the line as a shell reads it (continuations joined, a comment
    dropped) and, in a console block, the output the page shows below it."""

    block: Block
    line: str
    shown_output: str | None


def fenced_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"^([ \t]*)```([^\n`]*)\n(.*?)^[ \t]*```[ \t]*$", text, re.S | re.M):
        indent = match.group(1)
        body = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match.group(3).splitlines(keepends=True))
        found.append(Block(str(page.relative_to(ROOT)), text[:match.start()].count("\n") + 1,
                           match.group(2).strip(), body))
    return found


def all_blocks() -> list[Block]:
    return [block for page in CODE_PAGES for block in fenced_blocks(page)]


def code_block(page: str, first_line: str) -> Block:
    """The block of `page` whose first line is `first_line`."""
    (block,) = [b for b in fenced_blocks(ROOT / page) if b.first_line == first_line]
    return block


def substituted(code: str, substitutes: list[tuple[str, str]]) -> str:
    for old, new in substitutes:
        assert old in code, f"the page's example no longer holds {old!r}: update the test's substitution"
        code = code.replace(old, new)
    return code


def run_python(block: Block, namespace: dict | None = None, substitutes: list[tuple[str, str]] = ()) -> dict:
    """Execute a python block (after `substitutes`, each (text on the page, text run)) in `namespace`
    (a fresh one by default), which it returns; a traceback names the page and line."""
    assert block.info == "python", f"{block.name} is a {block.info!r} block, not python"
    namespace = {"__name__": "__doc_example__"} if namespace is None else namespace
    code = "\n" * block.line + substituted(block.text, list(substitutes))  # line numbers as on the page
    exec(compile(code, block.page, "exec"), namespace)
    return namespace


def commands(block: Block) -> list[Command]:
    """The commands of a bash block (every logical line but comments) or a console block (the lines
    after `$ `, with the output lines below each up to the next prompt)."""
    lines = block.text.splitlines()
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        if block.info == "console" and not line.startswith("$ "):
            i += 1
            continue
        logical = line[2:] if block.info == "console" else line
        while logical.endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        command = _without_comment(logical)
        if not command:
            continue
        output = None
        if block.info == "console":
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            output = "\n".join(shown).strip("\n")
        found.append(Command(block, command, output))
    return found


def _without_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # inside quotes or $(...) stays)."""
    depth, quote = 0, None
    for position, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith("$(", position):
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif char == "#" and not depth and (position == 0 or line[position - 1].isspace()):
            return line[:position].strip()
    return line.strip()


def argv(command: str) -> list[str]:
    return shlex.split(command)
