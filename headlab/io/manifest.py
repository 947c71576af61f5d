"""Manifests: every folder headlab writes (a run, an analysis, a study's tables, report and
figures, the README's docs) holds a manifest naming each file headlab wrote there with its size
and SHA-256, hashed while it was written. Every read is verified against it, and headlab
overwrites only what its manifest names and deletes only a file whose content still matches what
it recorded: a non-empty folder without one is not headlab's and is refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from headlab.io.files import (
    TEMPORARY,
    HashingFile,
    atomic_write_text,
    below,
    commit_file,
    descriptor_digest,
    file_digest,
    held_path,
    inside,
    make_folder,
    make_folders,
    mismatch,
    open_regular,
    read_regular,
    remove_verified,
    stage_file,
)
from headlab.io.locks import LOCK, FolderLock, being_written

FORMAT = "headlab"


def refuse_foreign(folder: Path, name: str) -> None:
    """Refuse a folder holding files but no manifest `name`: headlab did not write it. Writers
    call it before taking the folder's lock too, so a refused folder does not even get a `.lock`."""
    folder = Path(folder)
    if (folder / name).exists() or (folder / name).is_symlink() or not folder.is_dir() or being_written(folder):
        return  # a manifest to read, nothing yet, or a writer at work (whose lock will say so)
    stale_manifest = re.compile(rf"^\.{re.escape(name)}\.[0-9a-f]{{8}}\.tmp$")  # a claim killed mid-write
    foreign = sorted(p.name for p in folder.iterdir() if p.name != LOCK and not stale_manifest.match(p.name))
    if foreign:
        raise ValueError(f"{folder} holds files headlab did not write ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}; no {name}): headlab writes only into a new or "
                         "empty folder, or one it wrote; choose another")


def _is_entry(entry) -> bool:
    """{"bytes": a size, "sha256": text}. A size is an int ≥ 0 and not a bool, which Python
    counts as an int (`true` would pass for a 1-byte file)."""
    if not isinstance(entry, dict):
        return False
    size = entry.get("bytes")
    return type(size) is int and size >= 0 and isinstance(entry.get("sha256"), str)


class Manifest:
    """What headlab wrote in one folder: each file's size and SHA-256 (`files`, the folder's
    state), files it wrote that are not (or not yet) part of that state (`retired`, same
    entries: deleted at the next write if their content still matches), names its caller is
    writing now (`discard`: at the next write only their temporaries, and a folder among them
    once empty if headlab made it, are removed; nothing there is deleted on a name alone), the
    folders it made (`folders`, recorded before each is made), and `meta`.

    `intended` is the write-ahead record of `write_all`: a name the manifest does not list yet
    is saved there (entry None) before its temporary exists; every name is saved there with the
    size and SHA-256 of its new content before that is renamed over it, and moves to `files`
    once renamed. A writer killed at any point leaves each file it was writing listed, so the
    file at that name (its earlier version, the new one or a stray one) is recognisably
    headlab's: the next write replaces it and removes its temporaries; nothing is deleted on
    that name alone."""

    def __init__(self, folder: Path, name: str, kind: str, files: dict | None = None,
                 discard: list | None = None, meta: dict | None = None, retired: dict | None = None,
                 folders: list | None = None, intended: dict | None = None):
        self.folder, self.name, self.kind = Path(folder), name, kind
        self.files: dict[str, dict] = files or {}
        self.discard: list[str] = discard or []
        self.meta: dict = meta or {}
        self.retired: dict[str, dict] = retired or {}
        self.folders: list[str] = folders or []
        self.intended: dict[str, dict | None] = intended or {}

    @property
    def path(self) -> Path:
        return self.folder / self.name

    @classmethod
    def read(cls, folder: Path, name: str, kind: str) -> "Manifest":
        """The manifest of `folder`, which must be `kind` ('a headlab run', 'an analysis folder', ...)."""
        path = Path(folder) / name
        try:
            payload = json.loads(read_regular(path))
        except FileNotFoundError:
            raise ValueError(f"{folder} is not {kind} written by headlab (no {name}): write it again, or check "
                             "the path") from None
        except (OSError, ValueError) as error:
            raise ValueError(f"{path} is not a readable manifest ({error}): write the folder again") from None
        if not (isinstance(payload, dict) and payload.get("format") == FORMAT and payload.get("kind") == kind
                and isinstance(payload.get("files"), dict) and isinstance(payload.get("discard"), list)
                and isinstance(payload.get("meta"), dict) and isinstance(payload.get("retired", {}), dict)
                and isinstance(payload.get("folders", []), list) and isinstance(payload.get("intended", {}), dict)
                and all(map(_is_entry, payload["files"].values()))
                and all(map(_is_entry, payload.get("retired", {}).values()))
                and all(entry is None or _is_entry(entry) for entry in payload.get("intended", {}).values())):
            raise ValueError(f"{path} is not the manifest of {kind} (format, kind, files, discard, retired, folders, "
                             "intended, meta)")
        manifest = cls(folder, name, kind, payload["files"], payload["discard"], payload["meta"],
                       payload.get("retired"), payload.get("folders"), payload.get("intended"))
        for listed in [*manifest.files, *manifest.retired, *manifest.discard, *manifest.folders, *manifest.intended]:
            below(folder, listed)  # the folder itself, its parent or an odd name: refused before anything is done
            if listed.split("/")[0] in (name, LOCK):
                raise ValueError(f"{path} lists {listed!r}, its own manifest or lock: refusing it")
        return manifest

    @classmethod
    def claim(cls, folder: Path, name: str, kind: str) -> "Manifest":
        """The manifest of `folder` for writing into it: a new one if the folder is empty (but for
        its lock). A folder holding anything else without a manifest is not headlab's: refused."""
        folder = Path(folder)
        if (folder / name).exists() or (folder / name).is_symlink():
            return cls.read(folder, name, kind)
        refuse_foreign(folder, name)
        manifest = cls(folder, name, kind)
        manifest.save()
        return manifest

    def save(self) -> None:
        payload = {"format": FORMAT, "kind": self.kind, "files": self.files, "discard": self.discard,
                   "retired": self.retired, "folders": self.folders, "intended": self.intended, "meta": self.meta}
        atomic_write_text(self.path, json.dumps(payload, indent=1))

    def file(self, name: str) -> Path:
        return inside(self.folder, name)

    def _target(self, name: str) -> Path:
        """The path headlab is about to write as `name`: refused if something headlab did not
        write (not listed, not being written) is already there."""
        inside(self.folder, name)
        missing = [parent.as_posix() for parent in reversed(PurePosixPath(name).parents[:-1])
                   if not os.path.lexists(self.folder / parent)]
        if missing:  # recorded as headlab's before they exist, so a kill leaves none it disowns
            self.folders += [f for f in missing if f not in self.folders]
            self.save()
        path = make_folders(self.folder, name)
        if os.path.lexists(path) and not self._owns(name):
            raise ValueError(f"{path} exists but {self.path} does not list it (not written by headlab): headlab "
                             "never overwrites it; move it away or choose another folder")
        return path

    def _owns(self, name: str) -> bool:
        """Whether `name` is a file headlab wrote here, or was writing when it last stopped."""
        return name in self.files or name in self.retired or name in self.discard or name in self.intended

    def write(self, name: str, write: Callable[[HashingFile], None]) -> None:
        """Write file `name` atomically and record it (saved with the manifest's next `save`)."""
        self.write_all({name: write})

    def write_bytes(self, name: str, data: bytes) -> None:
        self.write(name, lambda file: file.write(data))

    def write_all(self, writes: dict[str, Callable[[HashingFile], None]]) -> None:
        """Write every file of `writes` into temporaries first and only then rename them over
        their names, so a failure while writing leaves every earlier version in place. Each
        step is recorded in `intended` and saved before it is taken (see the class); the names
        written move to `files` (saved with the next `save`)."""
        new = [name for name in writes if not self._owns(name)]
        if new:  # before their temporaries exist
            for name in new:
                self._target(name)
            self.intended.update(dict.fromkeys(new))
            self.save()
        staged = {}
        try:
            for name, write in writes.items():
                staged[name] = stage_file(self._target(name), write)
        except BaseException:
            for tmp, _ in staged.values():
                tmp.unlink(missing_ok=True)
            raise
        self.intended.update({name: entry for name, (_, entry) in staged.items()})
        self.save()  # before the renames: whichever version a kill leaves at a name, this manifest can verify
        for name, (tmp, _) in staged.items():
            commit_file(tmp, self.file(name))
        for name, (_, entry) in staged.items():
            self.files[name] = entry
            self.retired.pop(name, None)
            del self.intended[name]
        self.discard = [name for name in self.discard if name not in writes]

    def retire(self, name: str) -> None:
        """Move a listed file out of the folder's state: deleted at the next `remove_leftovers`."""
        self.retired[name] = self.files.pop(name)

    def entry(self, name: str) -> dict:
        if name not in self.files:
            raise ValueError(f"{self.path} does not list {name}: it was not written by headlab; write the folder again")
        return self.files[name]

    def read_bytes(self, name: str, verify: bool = True) -> bytes:
        """The content of file `name`, verified against its recorded SHA-256; with `verify` False only
        its size is checked (for a reader whose peer verifies the same file at the same time)."""
        entry, path = self.entry(name), self.file(name)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            raise self._missing(path) from None
        if len(data) != entry["bytes"] or verify and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise self._mismatch(name, path)
        return data

    @contextmanager
    def opened(self, name: str, verify: bool = True) -> Iterator[Path]:
        """A path naming file `name` as it is open for this block (a regular file reached without
        a link), its content verified against its recorded SHA-256 in chunks (with `verify` False
        only its size): for readers that map or stream a file too large to hold in memory, as
        `read_bytes` holds it. The path names the very file verified even should `name` be
        replaced meanwhile (`held_path`)."""
        entry, path = self.entry(name), self.file(name)
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            raise self._missing(path) from None
        try:
            if os.fstat(fd).st_size != entry["bytes"] or verify and descriptor_digest(fd) != entry["sha256"]:
                raise self._mismatch(name, path)
            yield held_path(fd, path)
        finally:
            os.close(fd)

    def verify(self, name: str) -> Path:
        """The path of file `name` once its content is verified (read in chunks: for large files)."""
        entry, path = self.entry(name), self.file(name)
        if not path.exists():
            raise self._missing(path)
        if file_digest(path) != entry["sha256"]:
            raise self._mismatch(name, path)
        return path

    def _missing(self, path: Path) -> ValueError:
        return ValueError(f"{path} is missing, but {self.path} lists it: restore it, or write the folder again")

    def _mismatch(self, name: str, path: Path) -> ValueError:
        if name in self.intended:
            return ValueError(f"{path} was being rewritten when headlab stopped ({self.path} lists it as being "
                              "written): write the folder again")
        return mismatch(path, self.path)

    def remove_leftovers(self) -> list[str]:
        """Delete what a killed or superseded writer left: temporaries whose name says which
        listed or discarded name they were becoming, retired files whose content still matches
        their entry (never one the folder's state lists), and discarded folders once empty.
        Nothing else is touched."""
        ours = set(self.files) | set(self.retired) | set(self.discard) | set(self.intended) | {self.name}
        folders = {self.folder} | {self.file(name).parent for name in ours} | {self.file(name) for name in self.discard}
        removed = []
        for folder in folders:
            if folder.is_dir() and not folder.is_symlink():
                for path in folder.iterdir():
                    if ((m := TEMPORARY.match(path.name)) and not path.is_dir()
                            and (path.parent / m.group(1)).relative_to(self.folder).as_posix() in ours):
                        path.unlink(missing_ok=True)
                        removed.append(path.name)
        for name, entry in self.retired.items():
            if name not in self.files and remove_verified(self.file(name), entry):
                removed.append(name)
        for name in sorted(self.discard, key=lambda n: -n.count("/")):
            path = self.file(name)
            if name in self.folders and path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
                path.rmdir()
                removed.append(name)
        # A name still there may be a file renamed into place just before a kill: headlab may
        # overwrite it, but nothing on a name alone is deleted.
        pending = [name for name in dict.fromkeys(self.discard) if os.path.lexists(self.file(name))]
        made = [name for name in self.folders if os.path.isdir(self.file(name))]
        intended = {name: entry for name, entry in self.intended.items() if os.path.lexists(self.file(name))}
        if pending != self.discard or self.retired or made != self.folders or intended != self.intended:
            self.discard, self.retired, self.folders, self.intended = pending, {}, made, intended
            self.save()
        return removed


class writing:
    """`with writing(folder, name, kind, writer) as manifest:` the manifest of `folder` to write
    files into, claimed as `Manifest.claim` does (a folder holding files but no manifest is
    refused), under the folder's lock and with a killed writer's leftovers removed; saved when
    the block ends without error (what it wrote is then listed)."""

    def __init__(self, folder: Path, name: str, kind: str, writer: str):
        self.folder, self.name, self.kind, self.writer = Path(folder), name, kind, writer

    def __enter__(self) -> Manifest:
        refuse_foreign(self.folder, self.name)
        make_folder(self.folder)
        self.lock = FolderLock(self.folder, self.writer).__enter__()
        try:
            self.manifest = Manifest.claim(self.folder, self.name, self.kind)
            self.manifest.remove_leftovers()
        except BaseException:
            self.lock.__exit__()
            raise
        return self.manifest

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None:
                self.manifest.save()
        finally:
            self.lock.__exit__()
