"""Every code line of README.md and docs/*.md runs in the tests, as a reader would paste it.

Each fenced block says its language (python, bash, console; `text` for what is not code) and runs:
- python blocks, in order, one namespace per page (README's study block in tests/report/test_report.py,
  whose fixture is that block);
- console blocks: each `$ ` command in process, its output compared with what the page shows;
- bash blocks: `headlab` commands in process, `make` targets as `make -n` (the recipe they would run,
  whose `python -m headlab` lines then run as below), other lines through bash;
with the budget substitutions stated here, as no test can train for minutes:
- a command that trains (`train`, `reproduce`, `sweep`; under torchrun too, run here as one
  process) runs up to where it would read its corpus or start its first run: parsing, the presets,
  the training settings, a study's roles and grid, the folder it claims; there it is stopped
  (`StopBeforeTraining`);
- a python block that trains gets a few steps (each substitution names the text it replaces).
The few lines that cannot run offline on a CPU are in `NOT_RUN`, each with its reason and what
checks it instead; a test fails if one of them disappears from its page."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import headlab.cli.model_commands
import headlab.study.study
from doc_blocks import ROOT, all_blocks, argv, code_block, commands, run_python
from headlab.cli.main import main
from headlab.cli.parser import parse_arguments

PAGES_QUOTING_COMMANDS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "science").glob("*.md"),
                                 *(ROOT / "tools").glob("*.md"), *(ROOT / "benchmarks" / "results").glob("*.md")])
# python blocks run by another test (block's page and first line -> that test, which calls code_block on it)
RUN_ELSEWHERE = {("README.md", "from headlab.study import Study"): "tests/report/test_report.py",
                 ("docs/pretrained.md", "from headlab.analysis.similarity import analyze"):
                     "tests/analysis/test_gguf_forward.py"}
# command -> why it does not run here, and what checks it instead
NOT_RUN = {
    'pip install -U "huggingface_hub[cli]"': "installs from PyPI; the tests run offline",
    'huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type dataset --include "sample/10BT/*" '
    '--local-dir fineweb-edu': "downloads 27 GB from the Hub; the tests run offline",
    "rsync -av fineweb-edu/sample/10BT/ node:/data/fineweb-edu-10BT/": "copies to a GPU node",
    "tools/gpu_check.sh": "a GPU node's check (minutes; every row a SKIP without a GPU): "
                          "tests/cli/test_gpu_check.py runs its stages and its wrapper's refusals",
    'pip install -e ".[notebooks,test]"': "what `make install` runs (the Makefile's install recipe, checked "
                                          "below); every test runs in what it installed",
    "conda env create -f environment.yml && conda activate headlab": "conda is not in the test environment; "
                                                                      "environment.yml is checked below",
    **{f"headlab analyze .venv/checkpoints/{name} --measure both --text shakespeare --attention-maps --out "
       f"analysis/{name}": "reads the wheels `make checkpoints` downloads (about 340 MB, not part of make test): "
                           "tests/analysis/test_gguf_real.py analyses those files when they are there, and "
                           "test_gguf_forward.py runs this command on a GGUF file it writes"
       for name in ("smollm2", "gemma3")},
}


# command -> what runs instead, and why (run by test_the_colab_wheel_builds_with_the_shipped_tables)
WHEEL = "pip wheel --no-deps . -w dist"
WHEEL_RUN = f"{sys.executable} -m pip wheel --no-deps --no-build-isolation --quiet {{source}} -w {{out}}"
WHEEL_WHY = ("offline: built with this environment's setuptools, from a copy of the checkout's files (setuptools "
             "writes build/ beside its source) into a temporary folder")


class StopBeforeTraining(BaseException):
    """Raised where a documented command would start training (a BaseException, so the command
    line's handlers, which turn an Exception into one line, let it through to the test)."""


@pytest.fixture
def no_training(monkeypatch):
    def stop(*args, **kwargs):
        raise StopBeforeTraining()

    monkeypatch.setattr(headlab.study.study.Study, "train", stop)  # reproduce and every point of a sweep
    monkeypatch.setattr(headlab.cli.model_commands, "prepared_corpus", stop)  # train


def every_command() -> list:
    return [command for block in all_blocks() if block.info in ("bash", "console") for command in commands(block)]


def test_every_fenced_block_says_its_language():
    """A block without one could be code that no test runs."""
    assert [b.name for b in all_blocks() if b.info not in ("python", "bash", "console", "text")] == []


def test_every_python_block_is_run_here_or_by_the_test_named():
    run_here = {("README.md", first) for first in README_SESSION} | {("docs/training.md", TRAINING_FIRST_LINE)}
    for block in all_blocks():
        if block.info != "python":
            continue
        key = (block.page, block.first_line)
        assert key in run_here or key in RUN_ELSEWHERE, f"{block.name}: no test runs this block"
        if key in RUN_ELSEWHERE:
            assert f'code_block("{block.page}", "{block.first_line}")' in (ROOT / RUN_ELSEWHERE[key]).read_text()


def test_every_line_not_run_is_on_its_page_and_checked_otherwise():
    lines = {command.line for command in every_command()}
    assert set(NOT_RUN) <= lines, f"no page shows {sorted(set(NOT_RUN) - lines)} any more: drop it from NOT_RUN"
    install = (ROOT / "Makefile").read_text().split("\n$(STAMP):", 1)[-1]
    assert re.search(r"pip install .*-e '\.\[notebooks,test\]'", install), "make install runs the page's pip line"
    assert re.search(r"^name: headlab$", (ROOT / "environment.yml").read_text(), re.M)


# ---- python -------------------------------------------------------------------------------------------

README_SESSION = ("import torch, headlab", "from headlab.analysis import analyze, concat",
                  "from headlab.analysis.inputs import encode_text, input_moments")
TRAINING_FIRST_LINE = "import headlab"


def test_the_readmes_python_examples_run_in_order():
    namespace = {}
    for first in README_SESSION:
        run_python(code_block("README.md", first), namespace)
    assert namespace["logits"].shape[:2] == (2, 64) and namespace["text"].shape == (1, 51)
    summary, weighted = namespace["result"].summary, namespace["weighted"].summary
    assert set(summary["model"]) == {"LRKV (r=16)"} and set(weighted["measure"]) == {"data"}
    assert (Path("analysis/lrkv-16") / "summary.csv").is_file()


@pytest.fixture(autouse=True)
def _in_a_fresh_folder(tmp_path, monkeypatch):
    """Examples write relative paths (runs/, analysis/): into a temporary working folder."""
    monkeypatch.chdir(tmp_path)


def test_the_training_page_example_trains_resumes_and_loads():
    """docs/training.md, for 6 steps instead of the preset's 900."""
    namespace = run_python(code_block("docs/training.md", TRAINING_FIRST_LINE), substitutes=[
        ('headlab.train_preset("cpu-small"),', 'headlab.train_preset("cpu-small").replace(steps=6, eval_every=3),')])
    assert namespace["run"].model.config.kv_rank == 16 and Path("runs/lrkv-16/config.json").is_file()


# ---- shell ----------------------------------------------------------------------------------------------

def _in_process(command: str) -> list[str]:
    """`headlab ARGS`, `python -m headlab ARGS` or `torchrun ... -m headlab ARGS` as argv for main()."""
    words = argv(command)
    if words[0] == "headlab":
        return words[1:]
    return words[words.index("headlab") + 1:] if "-m" in words and "headlab" in words else []


CONSOLE = [c for c in every_command() if c.block.info == "console"]
SHELL = [c for c in every_command() if c.block.info == "bash" and c.line not in {*NOT_RUN, WHEEL}]


@pytest.mark.parametrize("command", CONSOLE, ids=[f"{c.block.name}:{c.line[:40]}" for c in CONSOLE])
def test_a_console_block_prints_what_the_page_shows(command, capsys):
    assert main(_in_process(command.line)) == 0
    printed = "\n".join(line.rstrip() for line in capsys.readouterr().out.strip("\n").splitlines())
    assert printed == "\n".join(line.rstrip() for line in command.shown_output.splitlines())


def _run_headlab(words: list[str], no_training) -> None:
    try:
        status = main(words)
    except StopBeforeTraining:
        assert words[0] in ("train", "reproduce", "sweep") and "--plan" not in words, f"{words} was stopped"
        return
    assert status == 0, words


# A command substitution that runs a Python one-liner ("$(python -c '...')", as a page names a folder
# inside the installed packages): run here, its printed line put in its place, so the command around
# it runs in process as any other `headlab` line rather than in two new Pythons (imports: seconds).
PYTHON_SUBSTITUTION = re.compile(r"\"\$\(python -c '([^']*)'\)\"")


def _python_substituted(line: str) -> str:
    def printed(match: re.Match) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(match.group(1), "<python -c>", "exec"), {"__name__": "__main__"})
        return shlex.quote(out.getvalue().rstrip("\n"))
    return PYTHON_SUBSTITUTION.sub(printed, line)


@pytest.mark.parametrize("command", SHELL, ids=[f"{c.block.name}:{c.line[:40]}" for c in SHELL])
def test_a_shell_line_runs(command, no_training, capsys):
    line = _python_substituted(command.line)
    words = argv(line)
    if words[0] == "make":  # the recipe it would run; its headlab lines run here
        recipe = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert recipe.returncode == 0, recipe.stderr
        for line in recipe.stdout.splitlines():
            if " -m headlab " in line:
                _run_headlab(_in_process(line), no_training)
    elif _in_process(line) and not re.search(r"\$\(|&&|\|", line):
        _run_headlab(_in_process(line), no_training)
    else:  # shell syntax ($(...), &&): bash, with this environment's headlab and python first on PATH
        environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=environment,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]


def test_the_colab_wheel_builds_with_the_shipped_tables(tmp_path):
    """docs/install.md's wheel for Colab (WHEEL_WHY), holding the tables notebooks read untrained."""
    assert WHEEL in {command.line for command in every_command()}
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is still listed
            (tmp_path / "source" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tmp_path / "source" / name)
    done = subprocess.run(shlex.split(WHEEL_RUN.format(source=tmp_path / "source", out=tmp_path / "dist")),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("headlab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert any(re.fullmatch(r"headlab/study/.+/study\.json", name) for name in names), names


# ---- commands quoted inline ----------------------------------------------------------------------------

def quoted_commands() -> list[tuple[str, str]]:
    """(page, command) for each `headlab ...` in backticks and each indented `python -m headlab`
    line of every page; left out are synopses (`...`, `|`, `[...]`) and bare `headlab X` names."""
    found = set()
    for page in PAGES_QUOTING_COMMANDS:
        text = page.read_text(encoding="utf-8")
        quoted = re.findall(r"`(headlab [^`]+)`", text)
        quoted += re.findall(r"^ {4}(?:nice -n \d+ )?python -m (headlab .+)$", text, re.M)
        for command in quoted:
            if not re.search(r"\.\.\.|\||\[|\$\(", command) and len(command.split()) > 2:
                found.add((str(page.relative_to(ROOT)), command))
    return sorted(found)


@pytest.mark.parametrize("page,command", quoted_commands())
def test_every_command_a_page_quotes_parses(page, command):
    """The options and values it uses exist (a renamed option or removed preset fails here)."""
    try:
        parse_arguments(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{page} quotes `{command}`, which headlab refuses")
