"""The tree-diff checker: hash every entry under a scratch root before and after a command and
judge the difference by the invariants of `headlab.io`.

    before = Tree.read(root)
    status, err = run_cli(argv)
    check(before, Tree.read(root), status, err)

- The exit status is 0, 2 or 130, and an error is one line `headlab: error: ...` on stderr.
- headlab replaces or deletes a file only while its bytes are what a manifest recorded for that
  name (in `files`, `retired` or `intended`), or a temporary whose inode a manifest recorded when
  headlab made it (`staging`), or what a manifest's save killed midway leaves (named by the
  bytes of the manifest it was replacing): a name alone (a `discard` or content-less `intended` entry, a file
  named like a temporary) licenses nothing. A manifest owns nothing inside a sub-folder that holds
  a manifest of its own: its entries naming a path there are no licence (a study's record of a
  run's file).
- A file a manifest listed with matching content ("good") stays as it was, unless the folder's
  manifest afterwards lists a complete, verified state (every listed file present and matching,
  or matching the new version it records as being written before renaming it into place): a
  verified new version replaced it. A manifest itself changes only into one that verifies.
- A file recorded as being written (`intended`, with its new bytes) may change only into a
  verified listed file or that new version, or vanish once its folder's manifest lists a
  complete, verified state (a rerun wrote it again, made it current, then superseded it); one
  retired (superseded, recorded with its hash) may be deleted while it matches. A log headlab
  appends to keeps the prefix its manifest recorded.
- No new file appears outside a folder that holds a headlab manifest; a folder that appears
  holding nothing (a writer killed after making it) is no file.
Locks (their text names the last holder) are not content, and new temporaries are not (a write
killed midway leaves one); a run's starts.jsonl may only grow."""

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
from headlab.io import LOCK, MANIFEST_NAMES, TEMPORARY

MANIFESTS = tuple(sorted(MANIFEST_NAMES))
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
    """A lock (its text names the last holder)."""
    return path.name == LOCK


def is_temporary(name: str) -> bool:
    return bool(TEMPORARY.match(Path(name).name))


@dataclass
class Tree:
    root: Path
    entries: dict[str, str]  # name below root -> SHA-256, '-> target' of a link, or 'folder'
    listed: dict[str, str]  # name below root -> SHA-256 a manifest recorded for it
    complete: set[str]  # folders (below root) whose manifest's every file is present and matches
    pending: set[str]  # names below root a manifest lists as being written (its `discard`)
    retired: dict[str, str]  # name below root -> SHA-256 of a file a manifest retired (to be deleted)
    made: set[str]  # folders below root a manifest records headlab made (its `folders`)
    intended: dict[str, str]  # name below root -> SHA-256 of the version being written
    logs: dict[str, bytes]  # the content of every `APPEND_ONLY` file
    staged: dict[str, int]  # temporary below root -> the inode a manifest recorded when headlab made it
    inodes: dict[str, int]  # temporary below root -> its inode now
    prefixes: dict[str, bool]  # listed name not matching -> whether its recorded prefix is intact (a grown log)

    @classmethod
    def read(cls, root: Path) -> "Tree":
        entries = snapshot(root, skip=not_content)
        listed, complete, pending, retired, made, intended, staged, sizes = {}, set(), set(), {}, set(), {}, {}, {}
        manifests = {Path(name).parent.as_posix() for name in entries if Path(name).name in MANIFESTS}
        for name, digest in entries.items():
            path = Path(name)
            if path.name not in MANIFESTS or digest.startswith("->") or digest == "folder":
                continue
            folder = path.parent.as_posix()

            def own(records) -> list[tuple[str, str]]:
                """(name, name below root) of each name `records` lists, but those inside a sub-folder
                holding a manifest of its own: no licence to touch them."""
                kept = []
                for f in records:
                    parts = f.split("/") if isinstance(f, str) else []
                    subfolders = {(path.parent / "/".join(parts[:i])).as_posix() for i in range(1, len(parts))}
                    if parts and not subfolders & manifests:
                        kept.append((f, (path.parent / f).as_posix()))
                return kept
            try:
                payload = json.loads((root / name).read_text())
                files, intended_ = payload["files"], payload.get("intended", {})
                recorded = {full: files[f]["sha256"] for f, full in own(files)}
                size = {full: files[f]["bytes"] for f, full in own(files)}
                every = {(path.parent / f).as_posix(): e["sha256"] for f, e in files.items()}  # the whole state
                waiting = {full for _, full in own(payload["discard"])}
                gone = {full: payload["retired"][f]["sha256"] for f, full in own(payload.get("retired", {}))}
                folders = {full for _, full in own(payload.get("folders", []))}
                writing = {full: intended_[f]["sha256"] for f, full in own(intended_) if intended_[f]}
                temporaries = {full: payload["staging"][f] for f, full in own(payload.get("staging", {}))}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a manifest a hostile edit made unreadable lists nothing
            listed.update(recorded)
            sizes.update(size)
            pending |= waiting
            retired.update(gone)
            made |= folders
            intended.update(writing)
            staged.update(temporaries)
            if all(entries.get(f) in (sha, writing.get(f)) for f, sha in every.items()):
                complete.add(folder)
        logs = {name: (root / name).read_bytes() for name, digest in entries.items()
                if Path(name).name in APPEND_ONLY and not digest.startswith("->") and digest != "folder"}
        inodes = {name: os.lstat(root / name).st_ino for name in entries if is_temporary(name)}
        staged.update({name: inodes[name] for name in inodes if killed_save(root, name)})
        prefixes = {name: prefix_matches(root / name, sizes[name], sha) for name, sha in listed.items()
                    if entries.get(name) not in (sha, None, "folder") and not entries[name].startswith("->")}
        return cls(root, entries, listed, complete, pending, retired, made, intended, logs, staged, inodes, prefixes)

    def owned(self, name: str) -> bool:
        """Whether `name` lies in a folder holding a headlab manifest (or is one)."""
        parents = [Path(name), *Path(name).parents]
        return any(f"{p.as_posix()}/{m}" in self.entries or (p == Path(".") and m in self.entries)
                   for p in parents for m in MANIFESTS)

    def good(self, name: str) -> bool:
        return name in self.listed and self.entries.get(name) == self.listed[name]

    def as_intended(self, name: str) -> bool:
        """Whether `name` holds the new version its manifest records as being written."""
        return name in self.intended and self.entries.get(name) == self.intended[name]

    def recorded(self, name: str) -> bool:
        """Whether the bytes at `name` are ones a manifest recorded for that name."""
        digest = self.entries.get(name)
        return digest is not None and digest in (self.listed.get(name), self.retired.get(name), self.intended.get(name))


def killed_save(root: Path, name: str) -> bool:
    """Whether temporary `name` is what a write killed before its record was saved leaves: named
    by the first 8 hex digits of the SHA-256 of the bytes of the manifest (of the nearest folder
    holding one) on disk, followed by the name of its file below that folder (none: the manifest's
    own save; no manifest: of nothing)."""
    match = TEMPORARY.match(Path(name).name)
    if match is None:
        return False
    target = Path(name).parent / match.group(1)
    for folder in target.parents:
        manifests = [folder / m for m in MANIFESTS if (root / folder / m).is_file()]
        if manifests or target.name in MANIFESTS and folder == target.parent:
            for manifest in manifests or [target]:
                current = (root / manifest).read_bytes() if (root / manifest).is_file() else b""
                own = target.relative_to(folder).as_posix()
                suffix = b"" if target == manifest else b"\0" + own.encode()
                tokens = {hashlib.sha256(current + suffix).hexdigest()[:8]}
                if target == manifest:  # a new folder's claim, killed before its manifest was there
                    tokens.add(hashlib.sha256(b"").hexdigest()[:8])
                if Path(name).name in {f".{target.name}.{token}.tmp" for token in tokens}:
                    return True
            return False
    return False


def prefix_matches(path: Path, size, sha: str) -> bool:
    """Whether the first `size` bytes of `path` hash to `sha` (a log headlab appended to since)."""
    if not isinstance(size, int) or size < 0:
        return False
    with open(path, "rb") as file:
        return hashlib.sha256(file.read(size)).hexdigest() == sha


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
        if is_temporary(name) and not before.recorded(name):  # a temporary headlab made and recorded, still its own
            if name not in before.staged or before.staged[name] != before.inodes.get(name):
                broken.append(f"{name}, named like a temporary but not one a manifest recorded, changed or vanished")
            continue
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
        elif before.recorded(name) and (after.good(name) or after.as_intended(name)):
            continue  # its bytes recorded as headlab's: replaced by a version its manifest verifies
        elif (before.as_intended(name) and name not in after.entries
              and any(p.as_posix() in after.complete for p in Path(name).parents)):
            continue  # a version being written, never a verified state's, gone once a verified state superseded it
        elif before.prefixes.get(name) and (after.good(name) or after.prefixes.get(name)):
            continue  # a log headlab appended to beyond what its manifest recorded: the recorded part kept
        elif name in before.pending and name not in before.listed and after.good(name):
            continue  # a log being written before its manifest lists it, now listed and verified
        else:
            broken.append(f"{name}, whose bytes no manifest recorded, changed or vanished")
    for name in after.entries.keys() - before.entries.keys():
        if is_temporary(name):
            continue  # what a write killed midway leaves: not content
        empty_folder = after.entries[name] == "folder" and not any(n.startswith(name + "/") and not is_temporary(n)
                                                                   for n in after.entries)
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
