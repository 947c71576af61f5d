"""The tree-diff checker: hash every entry under a scratch root before and after a command and
judge the difference by the invariants of `headlab.io`.

    before = Tree.read(root)
    status, err = run_cli(argv)
    check(before, Tree.read(root), status, err)

- The exit status is 0, 2 or 130, and an error is one line `headlab: error: ...` on stderr.
- A file no manifest listed (a user's, a hostile edit's) is never changed or removed, and no new
  file appears outside a folder that holds a headlab manifest (after the command).
- A file a manifest listed with matching content ("good") stays as it was, unless the folder's
  manifest afterwards lists a complete, verified state (every listed file present and matching,
  or matching the new version it records as being written before renaming it into place): a
  verified new version replaced it. A manifest itself changes only into one that verifies.
- A file a manifest records as being written (its `intended`, the write-ahead record) may change
  only into a verified listed file or the new version recorded for it.
- A file a manifest names as being written (its `discard`) may change only into a verified
  listed file, or anything inside a folder the manifest records headlab made; one it retired
  (superseded, recorded with its hash) may be deleted while it matches. A folder that appears
  holding nothing (a writer killed after making it) is no file.
Locks (their text names the last holder) and headlab's temporaries of a killed write are not
content; a run's starts.jsonl may only grow."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from headlab.cli.main import main
from headlab.io import LOCK, TEMPORARY

MANIFESTS = ("manifest.json", "analysis.json", "study.json", "docs.json", "sweep.json")
APPEND_ONLY = ("starts.jsonl",)  # a run's log of its starts: headlab only appends to it, never rewrites it


def snapshot(root: Path, skip: Callable[[Path], bool] = lambda path: False) -> dict[str, str]:
    """Every entry below `root` but those `skip` names: a file's SHA-256, '-> target' of a link,
    or 'folder' (a FIFO or socket has no content: left out)."""
    entries = {}
    for path in sorted(root.rglob("*")):
        if skip(path):
            continue
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            entries[name] = "-> " + os.readlink(path)
        elif path.is_dir():
            entries[name] = "folder"
        elif path.is_file():
            entries[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


def not_content(path: Path) -> bool:
    """A lock (its text names the last holder) or a temporary of a killed write."""
    return path.name == LOCK or bool(TEMPORARY.match(path.name))


@dataclass
class Tree:
    root: Path
    entries: dict[str, str]  # name below root -> SHA-256, '-> target' of a link, or 'folder'
    listed: dict[str, str]  # name below root -> SHA-256 a manifest recorded for it
    complete: set[str]  # folders (below root) whose manifest's every file is present and matches
    pending: set[str]  # names below root a manifest lists as being written (its `discard`)
    retired: dict[str, str]  # name below root -> SHA-256 of a file a manifest retired (to be deleted)
    made: set[str]  # folders below root a manifest records headlab made (its `folders`)
    intended: dict[str, str | None]  # name below root -> SHA-256 of the version being written (None: not yet known)
    logs: dict[str, bytes]  # the content of every `APPEND_ONLY` file

    @classmethod
    def read(cls, root: Path) -> "Tree":
        entries = snapshot(root, skip=not_content)
        listed, complete, pending, retired, made, intended = {}, set(), set(), {}, set(), {}
        for name, digest in entries.items():
            path = Path(name)
            if path.name not in MANIFESTS or digest.startswith("->") or digest == "folder":
                continue
            try:
                payload = json.loads((root / name).read_text())
                folder = path.parent.as_posix()
                recorded = {(path.parent / f).as_posix(): e["sha256"] for f, e in payload["files"].items()}
                pending |= {(path.parent / f).as_posix() for f in payload["discard"] if isinstance(f, str)}
                retired.update({(path.parent / f).as_posix(): e["sha256"]
                                for f, e in payload.get("retired", {}).items()})
                made |= {(path.parent / f).as_posix() for f in payload.get("folders", []) if isinstance(f, str)}
                writing = {(path.parent / f).as_posix(): e and e["sha256"]
                           for f, e in payload.get("intended", {}).items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a manifest a hostile edit made unreadable lists nothing
            listed.update(recorded)
            intended.update(writing)
            if all(entries.get(f) in (sha, writing.get(f)) for f, sha in recorded.items()):
                complete.add(folder)
        logs = {name: (root / name).read_bytes() for name, digest in entries.items()
                if Path(name).name in APPEND_ONLY and not digest.startswith("->") and digest != "folder"}
        return cls(root, entries, listed, complete, pending, retired, made, intended, logs)

    def owned(self, name: str) -> bool:
        """Whether `name` lies in a folder holding a headlab manifest (or is one)."""
        parents = [Path(name), *Path(name).parents]
        return any(f"{p.as_posix()}/{m}" in self.entries or (p == Path(".") and m in self.entries)
                   for p in parents for m in MANIFESTS)

    def good(self, name: str) -> bool:
        return name in self.listed and self.entries.get(name) == self.listed[name]

    def as_intended(self, name: str) -> bool:
        """Whether `name` holds the new version its manifest records as being written."""
        return self.intended.get(name) is not None and self.entries.get(name) == self.intended[name]


def check(before: Tree, after: Tree, status: int, err: str) -> list[str]:
    """The invariants broken by a command that took the tree from `before` to `after`."""
    broken = []
    lines = err.strip().splitlines()
    if status not in (0, 2, 130):
        broken.append(f"exit status {status}: {lines[-1:] if lines else ''}")
    if status and not (len(lines) == 1 and lines[0].startswith("headlab: error: ")):
        broken.append(f"error is not one line: {lines[:3]}")
    for name, digest in before.entries.items():
        if after.entries.get(name) == digest or digest == "folder":
            continue
        if name in before.logs and after.logs.get(name, b"").startswith(before.logs[name]):
            continue  # appended to
        if Path(name).name in MANIFESTS:  # the state's record: replaced by a verified one, or was not verified
            folder = Path(name).parent.as_posix()
            if folder in after.complete or folder not in before.complete:
                continue
            broken.append(f"manifest {name} changed and what it lists no longer verifies")
            continue
        if before.good(name):
            folder = next((p.as_posix() for p in Path(name).parents if p.as_posix() in after.complete), None)
            if folder is None:
                broken.append(f"good {name} changed or vanished without a verified new version")
        elif name in before.retired and digest == before.retired[name] and name not in after.entries:
            continue  # a file headlab wrote and retired, deleted as its manifest said
        elif name in before.intended and (after.good(name) or after.as_intended(name)):
            continue  # being written: replaced by a version its manifest verifies
        elif name in before.pending and any(p.as_posix() in before.made for p in Path(name).parents):
            continue  # being written in a folder headlab made: rewritten (and superseded) by headlab
        elif name not in before.listed and not (name in before.pending and after.good(name)):
            broken.append(f"{name}, which headlab did not write, changed or vanished")
    for name in after.entries.keys() - before.entries.keys():
        empty_folder = after.entries[name] == "folder" and not any(n.startswith(name + "/") for n in after.entries)
        if not after.owned(name) and not empty_folder:  # a writer killed after making its folder leaves it empty
            broken.append(f"{name} appeared outside every headlab folder")
    return broken


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`headlab argv` in this process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exit:  # argparse's usage errors
            status = exit.code
    return status, err.getvalue()
