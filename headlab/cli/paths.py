"""The paths a command names, looked at before the command loads torch: a mistyped, wrong-kind or
unreadable path is reported in one line at once, not after seconds of imports. Only what can be
told from the file system without opening a file is checked here (it exists, is a folder or a
regular file as the option needs, can be read); what a file holds is checked where it is read."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from headlab.analysis.gguf_sources import GGUF_FILE_SUFFIXES
from headlab.analysis.hub import HUB_PREFIX

# A SOURCE given as a file rather than a folder: a checkpoint's weights, read with the config.json beside them.
SOURCE_FILE_SUFFIXES = (".safetensors", *GGUF_FILE_SUFFIXES)
# --text's name for the held-out Shakespeare text (`headlab.data.sources.shakespeare_held_out`), where no such file is
SHAKESPEARE_TEXT = "shakespeare"


def _kind(path: Path) -> str | None:
    """'folder', 'file' (a regular file), 'other' (a FIFO, device or socket) or None (nothing there),
    following links as reading the path would."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a component of the path is a file
        return None
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "other"


def _unreadable(path: Path, kind: str) -> bool:
    """A folder must be listable and enterable, a file readable, by this process."""
    return not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0))


KINDS = {"folder": "a folder", "file": "a file", "other": "not a regular file or folder (a FIFO, device or socket)"}


def folder_problem(path: Path, what: str) -> str | None:
    """Why `path` cannot be the readable folder `what` names (None: it can)."""
    return _kind_problem(path, what, "folder")


def file_problem(path: Path, what: str) -> str | None:
    """Why `path` cannot be the readable regular file `what` names (None: it can)."""
    return _kind_problem(path, what, "file")


def _kind_problem(path: Path, what: str, wanted: str) -> str | None:
    kind = _kind(path)
    if kind is None:
        return f"{what} {path}: no such {wanted}"
    if kind != wanted:
        return f"{what} {path} is {KINDS[kind]}, not {KINDS[wanted]}"
    if _unreadable(path, kind):
        return f"{what} {path}: permission denied (the {wanted} cannot be read)"
    return None


def output_problem(path: Path, what: str) -> str | None:
    """Why `path` cannot be an output folder: something that is not a folder is in its place."""
    kind = _kind(path)
    return None if kind in (None, "folder") else f"{what} {path} is {KINDS[kind]}, not a folder"


def source_problem(source: str) -> str | None:
    """Why `source` cannot be an `analyze` SOURCE: a run or checkpoint folder, or a checkpoint file.
    A Hub name (hf:ORG/NAME) is looked up where it is read."""
    if source.startswith(HUB_PREFIX):
        return None
    path = Path(source)
    kind = _kind(path)
    if kind is None:
        return f"source {source!r} does not exist"
    if kind == "file" and path.suffix not in SOURCE_FILE_SUFFIXES:
        return (f"source {source!r} is a file, not a run or checkpoint folder (a file SOURCE is a checkpoint's "
                f"{' or '.join(SOURCE_FILE_SUFFIXES)} file)")
    if kind == "other":
        return f"source {source!r} is not a regular file or folder"
    if _unreadable(path, kind):
        return f"source {source!r}: permission denied (it cannot be read)"
    return None


def analyze_problems(args: argparse.Namespace) -> list[str]:
    problems = [source_problem(source) for source in args.sources]
    if args.text is not None and not (str(args.text) == SHAKESPEARE_TEXT and _kind(Path(args.text)) is None):
        problems.append(file_problem(args.text, "--text"))
    problems.append(output_problem(args.out, "--out"))
    return problems


def study_folder_problems(args: argparse.Namespace) -> list[str]:
    """`headlab report DIR` and `headlab docs DIR [--out DIR]`."""
    problems = [folder_problem(args.folder, "study folder")]
    if getattr(args, "out", None) is not None:
        problems.append(output_problem(args.out, "--out"))
    return problems
