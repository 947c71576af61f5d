"""Manifests: every folder headlab writes (a run, an analysis, a study's tables, report and
figures, the README's docs) holds a manifest naming each file headlab wrote there with its size
and SHA-256, hashed while it was written. Every read is verified against it, and headlab
replaces or deletes a file only while its bytes are what the manifest recorded (or a temporary
whose identity it recorded when it made it): a name alone licenses nothing, and a non-empty
folder without a manifest is not headlab's and is refused. A folder's manifest owns nothing in a
sub-folder that holds a manifest of its own (a study's runs)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import warnings
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from headlab.io.files import (
    TEMPORARY,
    HashingFile,
    below,
    commit_file,
    descriptor_digest,
    file_digest,
    fill,
    held_path,
    inside,
    make_folder,
    make_folders,
    mismatch,
    open_regular,
    open_temporary,
    parse_json,
    read_regular,
    remove_verified,
    temporary_path,
    write_file,
)
from headlab.io.locks import LOCK, FolderLock, being_written

FORMAT = "headlab"
# The names of headlab's manifests, one per kind of folder (a run's, an analysis's, a study's, ...), so that a
# folder can tell a sub-folder that holds one: no file there is its own (a manifest of a new name adds it here).
MANIFEST_NAMES = {"manifest.json", "analysis.json", "study.json", "docs.json", "sweep.json"}


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


def _remove_regular(path: Path) -> None:
    """Delete `path` if it is a regular file (a temporary headlab recognises as its own)."""
    if os.path.lexists(path) and stat.S_ISREG(os.lstat(path).st_mode):
        path.unlink()


def _is_inode(value) -> bool:
    return type(value) is int and value >= 0


class Manifest:
    """What headlab wrote in one folder: each file's size and SHA-256 (`files`, the folder's
    state), files it wrote that are not (or not yet) part of that state (`retired`, same
    entries: deleted at the next write if their content still matches), names its caller is
    writing now (`discard`: a folder among them is removed once empty if headlab made it; a name
    there licenses nothing else), the folders it made (`folders`, recorded before each is made),
    and `meta`.

    Write-ahead (`write_all`): each temporary is recorded in `staging` (its name and inode, right
    after it is made, before its bytes), then each new version's size and SHA-256 in `intended`
    before it is renamed over its name; it moves to `files` once renamed. Whatever a kill leaves is
    therefore recognisable by what is recorded of it: a temporary by its inode, a file at a name
    by its bytes (those of `files`, `retired` or `intended`). Nothing else is replaced or deleted:
    a file at a listed name whose bytes headlab did not record (edited, or put there after a kill)
    is refused, never overwritten."""

    def __init__(self, folder: Path, name: str, kind: str, files: dict | None = None,
                 discard: list | None = None, meta: dict | None = None, retired: dict | None = None,
                 folders: list | None = None, intended: dict | None = None, staging: dict | None = None):
        self.folder, self.name, self.kind = Path(folder), name, kind
        MANIFEST_NAMES.add(name)
        self.files: dict[str, dict] = files or {}
        self.discard: list[str] = discard or []
        self.meta: dict = meta or {}
        self.retired: dict[str, dict] = retired or {}
        self.folders: list[str] = folders or []
        # a None entry (an earlier release recorded a name so before its bytes existed) licenses nothing
        self.intended: dict[str, dict | None] = intended or {}
        self.staging: dict[str, int] = staging or {}  # temporary's name -> its inode

    @property
    def path(self) -> Path:
        return self.folder / self.name

    @classmethod
    def read(cls, folder: Path, name: str, kind: str) -> "Manifest":
        """The manifest of `folder`, which must be `kind` ('a headlab run', 'an analysis folder', ...)."""
        path = Path(folder) / name
        try:
            data = read_regular(path)
        except FileNotFoundError:
            raise ValueError(f"{folder} is not {kind} written by headlab (no {name}): write it again, or check "
                             "the path") from None
        except ValueError as error:  # not a file (a link, a FIFO); a refused read stays an OSError, named so
            raise ValueError(f"{path} is not a readable manifest ({error}): write the folder again") from None
        try:
            payload = parse_json(data, path)
        except ValueError as error:
            raise ValueError(f"{error}; write the folder again") from None
        if not (isinstance(payload, dict) and payload.get("format") == FORMAT and payload.get("kind") == kind
                and isinstance(payload.get("files"), dict) and isinstance(payload.get("discard"), list)
                and isinstance(payload.get("meta"), dict) and isinstance(payload.get("retired", {}), dict)
                and isinstance(payload.get("folders", []), list) and isinstance(payload.get("intended", {}), dict)
                and isinstance(payload.get("staging", {}), dict)
                and all(map(_is_inode, payload.get("staging", {}).values()))
                and all(map(_is_entry, payload["files"].values()))
                and all(map(_is_entry, payload.get("retired", {}).values()))
                and all(entry is None or _is_entry(entry) for entry in payload.get("intended", {}).values())):
            raise ValueError(f"{path} is not the manifest of {kind} (format, kind, files, discard, retired, folders, "
                             "intended, staging, meta)")
        manifest = cls(folder, name, kind, payload["files"], payload["discard"], payload["meta"],
                       payload.get("retired"), payload.get("folders"), payload.get("intended"), payload.get("staging"))
        for listed in [*manifest.files, *manifest.retired, *manifest.discard, *manifest.folders, *manifest.intended,
                       *manifest.staging]:
            below(folder, listed)  # the folder itself, its parent or an odd name: refused before anything is done
            if listed.split("/")[0] in (name, LOCK):
                raise ValueError(f"{path} lists {listed!r}, its own manifest or lock: refusing it")
        for temporary in manifest.staging:
            if not TEMPORARY.match(PurePosixPath(temporary).name):
                raise ValueError(f"{path} records {temporary!r} as a temporary, which is not a temporary's name: "
                                 "refusing it")
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
        if self.staging:  # absent while nothing is being written: what a release before it wrote
            payload["staging"] = self.staging
        data = json.dumps(payload, indent=1).encode()
        token = self._save_token()  # a temporary named by the bytes it replaces: a save killed midway leaves one
        try:                        # headlab knows
            write_file(self.path, lambda file: file.write(data), token)
        except FileExistsError:  # a save from these same bytes killed midway left it: this one replaces it
            _remove_regular(temporary_path(self.path, token))
            write_file(self.path, lambda file: file.write(data), token)

    def _save_token(self, name: str | None = None) -> str:
        """The token of the temporary of file `name` (None: of the manifest itself) made while the
        manifest's bytes on disk are what they are now: the first 8 hex digits of the SHA-256 of
        those bytes (of nothing if there are none), followed by `name`. A manifest cannot record its
        own temporary, nor one made before its record of it is saved: its bytes then stand for
        the record, so what a kill leaves then is known to the next writer."""
        try:
            current = read_regular(self.path)
        except (OSError, ValueError):
            current = b""
        return hashlib.sha256(current + (b"" if name is None else b"\0" + name.encode())).hexdigest()[:8]

    def _killed_temporaries(self) -> list[Path]:
        """The temporaries a write killed before its record was saved left in the folders this
        manifest writes: named by the token of the manifest's bytes on disk and of their file."""
        folders = {self.folder} | {self.folder / f for f in [*self.folders, *self.discard]}
        folders |= {(self.folder / name).parent for name in [*self.files, *self.retired, *self.intended]}
        found = []
        for folder in sorted(folders):
            if folder.is_symlink() or not folder.is_dir() or (folder != self.folder and self._nested_owner(
                    (folder / "x").relative_to(self.folder).as_posix()) is not None):
                continue
            for path in folder.iterdir():
                match = TEMPORARY.match(path.name)
                if match is None or path.is_symlink() or not path.is_file():
                    continue
                name = (folder / match.group(1)).relative_to(self.folder).as_posix()
                tokens = {self._save_token(None if name == self.name else name)}
                if name == self.name:  # the claim of a new folder, killed before its manifest was there
                    tokens.add(hashlib.sha256(b"").hexdigest()[:8])
                if path.name in {temporary_path(folder / match.group(1), token).name for token in tokens}:
                    found.append(path)
        return found

    def file(self, name: str) -> Path:
        """The path of `name`, refused unless it lies strictly below the folder, through no link,
        and outside every sub-folder that holds a manifest of its own."""
        path = inside(self.folder, name)
        owner = self._nested_owner(name)
        if owner is not None:
            raise ValueError(f"{self.path} lists {name!r}, but {owner} holds a manifest of its own ({owner.name} is "
                             "another headlab folder): refusing it")
        return path

    def _nested_owner(self, name: str) -> Path | None:
        """The sub-folder between the folder and `name` nearest the folder that holds a manifest."""
        for parent in reversed(PurePosixPath(name).parents[:-1]):
            if any(os.path.lexists(self.folder / parent / manifest) for manifest in MANIFEST_NAMES):
                return self.folder / parent
        return None

    def recorded(self, name: str) -> set[str]:
        """The SHA-256s recorded for `name`: the bytes that make a file there headlab's."""
        return {entry["sha256"] for entry in (self.files.get(name), self.retired.get(name), self.intended.get(name))
                if entry}

    def _target(self, name: str) -> Path:
        """The path headlab is about to write as `name`: refused unless nothing is there or a
        regular file whose bytes this manifest recorded for that name."""
        self.file(name)
        missing = [parent.as_posix() for parent in reversed(PurePosixPath(name).parents[:-1])
                   if not os.path.lexists(self.folder / parent)]
        if missing:  # recorded as headlab's before they exist, so a kill leaves none it disowns
            self.folders += [f for f in missing if f not in self.folders]
            self.save()
        path = make_folders(self.folder, name)
        if os.path.lexists(path):
            self._check_ours(name, path)
        return path

    def check_writable(self, names: list[str]) -> None:
        """Refuse now what writing each of `names` would refuse when its turn came (`_target`): a
        name not strictly below the folder or through a link, or a file there whose bytes this
        manifest did not record. For a writer that draws or computes before it writes: refused
        before that work, and before it has replaced any file."""
        for name in names:
            path = self.file(name)
            if os.path.lexists(path):
                self._check_ours(name, path)

    def _check_ours(self, name: str, path: Path) -> None:
        recorded = self.recorded(name)
        if not recorded and name in self.intended:  # recorded before its bytes were: what is there is not headlab's
            raise ValueError(f"{path} exists, but headlab stopped before it wrote it ({self.path} records no content "
                             "for it): headlab never overwrites it; move it away or choose another folder")
        if not recorded:
            raise ValueError(f"{path} exists but {self.path} does not list it (not written by headlab): headlab "
                             "never overwrites it; move it away or choose another folder")
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not the file headlab wrote (a link, folder or FIFO is there now): headlab "
                             "never replaces it; move it away")
        if file_digest(path) not in recorded:
            raise ValueError(f"{path} was changed since headlab wrote it (its SHA-256 is not the one {self.path} "
                             "records): headlab never overwrites it; move it away, or restore it")

    def write(self, name: str, write: Callable[[HashingFile], None]) -> None:
        """Write file `name` atomically and record it (saved with the manifest's next `save`)."""
        self.write_all({name: write})

    def write_bytes(self, name: str, data: bytes) -> None:
        self.write(name, lambda file: file.write(data))

    def write_all(self, writes: dict[str, Callable[[HashingFile], None]]) -> None:
        """Write every file of `writes` into temporaries first and only then rename them over
        their names, so a failure while writing leaves every earlier version in place. Each
        temporary and each new version is recorded and saved before it exists or is renamed (see
        the class); the names written move to `files` (saved with the next `save`)."""
        paths = {name: self._target(name) for name in writes}
        staged, handed, entries = {}, set(), {}
        try:
            for name, path in paths.items():
                token = self._save_token(name)  # the manifest's bytes on disk name it: a kill before the
                try:                            # record below leaves one headlab knows
                    tmp, file = open_temporary(path, token)
                except FileExistsError:  # one such write killed before: replaced
                    _remove_regular(temporary_path(path, token))
                    tmp, file = open_temporary(path, token)
                staged[name] = (tmp, file)
                self.staging[self._name(tmp)] = os.fstat(file.fd).st_ino
            self.save()  # before their bytes: a kill leaves temporaries the next writer knows by their inode
            for name, (tmp, file) in staged.items():
                handed.add(name)  # `fill` closes it, whatever happens
                entries[name] = fill(file, writes[name])
        except BaseException:
            for name, (tmp, file) in staged.items():
                if name not in handed:
                    with contextlib.suppress(OSError):
                        os.close(file.fd)
                tmp.unlink(missing_ok=True)  # made by this process
                self.staging.pop(self._name(tmp), None)
            raise
        self.intended.update(entries)
        self.save()  # before the renames: whichever version a kill leaves at a name, this manifest can verify
        for name, (tmp, _) in staged.items():
            commit_file(tmp, paths[name])
            self.staging.pop(self._name(tmp))
        for name, entry in entries.items():
            self.files[name] = entry
            self.retired.pop(name, None)
            del self.intended[name]
        self.discard = [name for name in self.discard if name not in writes]

    def _name(self, path: Path) -> str:
        return Path(path).relative_to(self.folder).as_posix()

    def replace_log(self, name: str, data: bytes) -> None:
        """Replace log `name` (a file headlab appends to, such as a run's metrics, whose manifest
        entry hashes only the part up to the state it lists) by `data` atomically: a run cutting
        what it appended after its last checkpoint. Its temporary is named as `write_all` names
        one, so a kill midway leaves nothing the next writer does not know."""
        path, token = self.file(name), self._save_token(name)
        try:
            write_file(path, lambda file: file.write(data), token)
        except FileExistsError:  # one such write killed before: replaced
            _remove_regular(temporary_path(path, token))
            write_file(path, lambda file: file.write(data), token)

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

    @contextlib.contextmanager
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

    def _forget_nested(self) -> bool:
        """Drop every record of a write (retired, being written, a temporary, a folder) that names
        a path inside a sub-folder holding a manifest of its own: not this folder's to touch."""
        changed = False
        for records in (self.retired, self.intended, self.staging):
            for name in [name for name in records if self._nested_owner(name) is not None]:
                del records[name]
                changed = True
        for records in (self.discard, self.folders):
            kept = [name for name in records if self._nested_owner(name) is None]
            changed |= kept != records
            records[:] = kept
        return changed

    def remove_leftovers(self) -> list[str]:
        """Delete what a killed or superseded writer left: temporaries it recorded, while still
        the file it made (same inode), retired files whose content still matches their entry
        (never one the folder's state lists, nor one inside a sub-folder with a manifest of its
        own), and folders it made and discarded once empty. Nothing else is touched."""
        forgotten = self._forget_nested()
        removed, failed, kept = [], [], {}
        for path in self._killed_temporaries():
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
        for temporary, inode in self.staging.items():
            path = below(self.folder, temporary)
            try:
                self.file(temporary)
                status = os.lstat(path)
                if stat.S_ISREG(status.st_mode) and status.st_ino == inode:
                    path.unlink()
                    removed.append(temporary)
            except FileNotFoundError:
                pass
            except OSError as error:  # kept on record, for the next writer to try again
                failed.append((temporary, error))
                kept[temporary] = inode
            except ValueError:  # no longer below the folder through real folders: not this folder's
                pass
        retired = {}
        for name, entry in self.retired.items():
            try:
                if name not in self.files and remove_verified(self.file(name), entry):
                    removed.append(name)
            except OSError as error:
                failed.append((name, error))
                retired[name] = entry
        for name in sorted(self.discard, key=lambda n: -n.count("/")):
            path = self.file(name)
            if name in self.folders and path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
                try:
                    path.rmdir()
                    removed.append(name)
                except OSError as error:
                    failed.append((name, error))
        if failed:  # nothing is lost by keeping them: the work goes on, and the next write tries again
            name, error = failed[0]
            warnings.warn(f"could not delete {len(failed)} file(s) headlab no longer needs in {self.folder} ({name}: "
                          f"{error.strerror or error}); they stay on record in {self.name} and the next write "
                          "tries again", stacklevel=2)
        # A name still there may be a file renamed into place just before a kill: its bytes, as
        # recorded in `intended`, make it headlab's to overwrite; nothing on a name alone is deleted.
        pending = [name for name in dict.fromkeys(self.discard) if os.path.lexists(self.file(name))]
        made = [name for name in self.folders if os.path.isdir(self.file(name))]
        intended = {name: entry for name, entry in self.intended.items()
                    if entry is not None and os.path.lexists(self.file(name))}
        if (forgotten or pending != self.discard or retired != self.retired or made != self.folders
                or intended != self.intended or kept != self.staging):
            self.discard, self.retired, self.folders, self.intended = pending, retired, made, intended
            self.staging = kept
            self.save()
        return removed


class writing:
    """`with writing(folder, name, kind, writer) as manifest:` the manifest of `folder` to write
    files into, claimed as `Manifest.claim` does (a folder holding files but no manifest is
    refused), under the folder's lock and with a killed writer's leftovers removed; saved when the
    block ends without error (what it wrote is then listed) and what it retired then deleted."""

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
                if self.manifest.retired:
                    self.manifest.remove_leftovers()
        finally:
            self.lock.__exit__()
