"""A path a command names that cannot be right (missing, a file where a folder belongs or the
reverse, a FIFO, unreadable) is reported in one line before torch loads, so a typo costs a fraction
of a second, not the seconds of torch's import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headlab.cli import paths
from headlab.cli.main import main
from headlab.cli.parser import parse_arguments, path_problem


@pytest.fixture
def place(tmp_path) -> Path:
    (tmp_path / "notes.txt").write_text("to be or not to be\n")
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "pipe")
    return tmp_path


# (arguments with {tmp} for the folder above, words the one line says)
MISTAKES = [
    (["analyze", "{tmp}/missing", "--out", "{tmp}/a"], "source '{tmp}/missing' does not exist"),
    (["analyze", "{tmp}/notes.txt", "--out", "{tmp}/a"], "is a file, not a run or checkpoint folder"),
    (["analyze", "{tmp}/pipe", "--out", "{tmp}/a"], "is not a regular file or folder"),
    (["analyze", "{tmp}/run", "--text", "{tmp}/missing.txt", "--measure", "data", "--out", "{tmp}/a"],
     "--text {tmp}/missing.txt: no such file"),
    (["analyze", "{tmp}/run", "--text", "{tmp}/run", "--measure", "data", "--out", "{tmp}/a"],
     "--text {tmp}/run is a folder, not a file"),
    (["analyze", "{tmp}/run", "--out", "{tmp}/notes.txt"], "--out {tmp}/notes.txt is a file, not a folder"),
    (["report", "{tmp}/missing"], "study folder {tmp}/missing: no such folder"),
    (["docs", "{tmp}/notes.txt"], "study folder {tmp}/notes.txt is a file, not a folder"),
    (["docs", "{tmp}/run", "--out", "{tmp}/notes.txt"], "--out {tmp}/notes.txt is a file, not a folder"),
]
IDS = ["missing source", "text file source", "fifo source", "missing text", "folder text", "file out",
       "missing study", "file study", "file docs out"]


def _filled(words: list[str] | str, tmp: Path):
    return [w.format(tmp=tmp) for w in words] if isinstance(words, list) else words.format(tmp=tmp)


@pytest.mark.parametrize("argv,says", MISTAKES, ids=IDS)
def test_a_bad_path_is_one_line_and_status_2_before_torch_loads(place, argv, says):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "headlab", *_filled(argv, place)],
                            capture_output=True, text=True, timeout=120)
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert result.returncode == 2 and said == [f"headlab: error: {said[0][16:]}"] and _filled(says, place) in said[0], \
        result.stderr[-2000:]
    assert "headlab.cli.paths" in imported and not {"torch", "pandas", "numpy"} & imported


@pytest.mark.parametrize("argv,says", MISTAKES[:2], ids=IDS[:2])
def test_the_same_line_comes_from_main_in_process(place, argv, says, capsys):
    assert main(_filled(argv, place)) == 2
    err = capsys.readouterr().err
    assert err.startswith("headlab: error: ") and err.count("\n") == 1 and _filled(says, place) in err


def test_an_unreadable_folder_is_named(place, monkeypatch):
    """As root every file is readable, so the refusal is simulated where the check asks the system."""
    monkeypatch.setattr(paths.os, "access", lambda path, mode: Path(path) != place / "run")
    args = parse_arguments(["analyze", str(place / "run"), "--out", str(place / "a")])
    assert path_problem(args) == f"source '{place / 'run'}': permission denied (it cannot be read)"
    assert path_problem(parse_arguments(["report", str(place / "run")])) == \
        f"study folder {place / 'run'}: permission denied (the folder cannot be read)"


def test_good_paths_and_hub_names_pass_to_the_command(place):
    """A Hub name is resolved where it is read (the cache, or a download): nothing to check early."""
    args = parse_arguments(["analyze", str(place / "run"), "hf:ORG/NAME", "--text", str(place / "notes.txt"),
                            "--measure", "data", "--out", str(place / "new")])
    assert path_problem(args) is None
    assert path_problem(parse_arguments(["info"])) is None
