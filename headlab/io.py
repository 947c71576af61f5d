"""Files that are never half-written, never mistaken and never someone else's.

Atomic writes: a file is written under a temporary name beside it (`.<name>.<8 hex>.tmp`),
fsynced and renamed over its target, so a reader sees the old file or the new one. Files get
the usual permissions (0666 less the umask). New files are opened with O_EXCL | O_NOFOLLOW and
replaced by rename, so a write never follows a symbolic link.

Manifests: every folder headlab writes (a run, an analysis, a study's tables, report and figures,
the README's docs) holds a manifest naming each file headlab wrote there with its size and
SHA-256, hashed while it was written. Every read is verified against it, and headlab overwrites
only what its manifest names and deletes only a file whose content still matches what it
recorded: a non-empty folder without one is not headlab's and is refused. A name read from a
file must name a path strictly below its folder, reached through no link (`inside`).

Scratch folders: the token cache is built in a private folder (`ScratchFolder`) that is renamed
into place whole, so a reader sees no cache or a complete one; only the files it made there are
ever deleted from it.

Nothing else in headlab writes, renames or deletes a path (tests/test_one_writer.py checks it):
folders are made by `make_folder`, files by the writers below.

Locks: `FolderLock` holds an flock on `<folder>/.lock` while one process writes the folder; the
kernel drops it when that process dies, so a dead writer's lock is never obeyed."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
import stat
import time
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable

TEMPORARY_SUFFIX = ".tmp"
TEMPORARY = re.compile(r"^\.(.+)\.[0-9a-f]{8}\.tmp$")  # what `temporary_path` names
LOCK = ".lock"
FORMAT = "headlab"
CHUNK = 1 << 24


def temporary_path(path: Path) -> Path:
    """A fresh hidden name beside `path` that `Manifest.remove_leftovers` recognises."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingFile:
    """A new file (never through a link) that hashes what is written to it: what `torch.save`
    and the other writers are handed, so the hash costs no second pass over the data."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        self.digest, self.size = hashlib.sha256(), 0
        self.failure: OSError | None = None  # what the disk said, when a caller (torch) rewords it

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        written = 0
        try:
            while written < len(view):
                written += os.write(self.fd, view[written:written + (1 << 30)])
        except OSError as error:
            self.failure = error
            raise
        self.size += len(view)
        return len(view)

    def flush(self) -> None:  # writes go straight to the descriptor
        pass

    @property
    def entry(self) -> dict:
        return {"bytes": self.size, "sha256": self.digest.hexdigest()}


def stage_file(path: Path, write: Callable[[HashingFile], None]) -> tuple[Path, dict]:
    """Write the content of `path` through `write(file)` into a new temporary beside it; returns
    the temporary and the manifest entry (size and SHA-256, hashed as it was written). `path`
    itself is not touched until `commit_file`."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        file = HashingFile(tmp)
        try:
            write(file)
            os.fsync(file.fd)
        except Exception:
            if file.failure is not None:
                raise file.failure from None
            raise
        finally:
            os.close(file.fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, file.entry


def commit_file(tmp: Path, path: Path) -> None:
    """Rename a staged temporary over `path` (a link there is replaced, never followed)."""
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(Path(path).parent)


def write_file(path: Path, write: Callable[[HashingFile], None]) -> dict:
    """Write `path` atomically through `write(file)`; returns its manifest entry."""
    tmp, entry = stage_file(path, write)
    commit_file(tmp, path)
    return entry


def atomic_write_bytes(path: Path, data: bytes) -> dict:
    return write_file(path, lambda file: file.write(data))


def atomic_write_text(path: Path, text: str) -> dict:
    return atomic_write_bytes(path, text.encode("utf-8"))


def open_regular(path: Path) -> int:
    """A read descriptor of `path`, refused unless it is a regular file reached without a link
    (a FIFO or device would block or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link: headlab reads only the files it wrote, never through "
                             "links; replace the link by the file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file (a FIFO, device or folder): remove it")
    return fd


def append_line(path: Path, line: bytes) -> None:
    """Append `line` to `path` (created if missing) in one write, never through a symlink. A
    file with other names (hard links: a `cp -al` or `rsync --link-dest` backup) is rewritten
    under this name instead, so the other names keep what they hold."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        if os.fstat(fd).st_nlink > 1:
            atomic_write_bytes(path, read_regular(path) + line)
        else:
            os.write(fd, line)
    finally:
        os.close(fd)


def read_regular(path: Path) -> bytes:
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def file_digest(path: Path) -> str:
    """SHA-256 of a regular file, read in chunks (for files too large to hold twice)."""
    digest = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def mismatch(path: Path, manifest: Path) -> ValueError:
    return ValueError(f"{path} does not match the SHA-256 recorded in {manifest} when headlab wrote it (edited, "
                      "corrupted, or copied from elsewhere): restore the original, or write the folder again")


def below(folder: Path, name) -> Path:
    """`folder / name` for a name read from a file in `folder`, refused unless it names a path
    strictly below it in plain form: relative, '/'-separated parts none of which is empty, '.'
    or '..' (so never the folder itself nor its parent; links are the reader's to judge)."""
    folder = Path(folder)
    if (not isinstance(name, str) or not name or os.path.isabs(name) or "\\" in name or "\0" in name
            or any(part in ("", ".", "..") for part in name.split("/"))):
        raise ValueError(f"{name!r} (read from a file in {folder}) is not the name of a path strictly below "
                         f"{folder}: refusing it")
    return folder / name


def inside(folder: Path, name) -> Path:
    """`folder / name` for a name read from a file in `folder`, refused unless it is strictly
    below `folder` and every folder between them is a real folder, not a link."""
    path = below(folder, name)
    for parent in reversed(path.relative_to(folder).parents[:-1]):
        if (folder / parent).is_symlink() or ((folder / parent).exists() and not (folder / parent).is_dir()):
            raise ValueError(f"{folder / parent} is a symbolic link or not a folder: headlab never reads or writes "
                             "through links; replace it by a folder")
    return path


def make_folder(path: Path) -> Path:
    """Create folder `path` (and its missing parents) where headlab is told to write, refused if
    `path` is a link or a file: headlab writes into a folder, never through a link named as one.
    Folders above it that exist are the user's to choose (a linked home is theirs)."""
    path = Path(path)
    try:
        if not path.is_symlink():
            path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        pass  # judged below
    if path.is_symlink() or not path.is_dir():
        raise ValueError(f"{path} cannot be used as a folder: a symbolic link or a file is in the way (headlab "
                         "never writes through links); choose another path, or move it away")
    return path


def make_folders(folder: Path, name: str) -> Path:
    """Create the folders between `folder` and file `name` below it (none through a link)."""
    path = inside(folder, name)
    for parent in reversed(path.relative_to(folder).parents[:-1]):
        try:
            os.mkdir(folder / parent)
        except FileExistsError:
            inside(folder, name)  # lost a race to a link: refused
    return path


def remove_verified(path: Path, entry: dict) -> bool:
    """Delete regular file `path` if its content still is what `entry` recorded (a link, an
    edited file or someone else's file in its place is kept); returns whether it was deleted."""
    try:
        if file_digest(path) != entry["sha256"]:
            return False
    except (OSError, ValueError):
        return False
    path.unlink()
    return True


def open_new(path: Path) -> BinaryIO:
    """`path`, a new file opened for writing: never one already there, never through a link."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), "wb")


class ScratchFolder:
    """`with ScratchFolder(final) as scratch:` a private folder beside `final` (made by an
    exclusive mkdir, so no other process shares it) that the block fills through `new_file`,
    `update` and `remove`; renamed to `final` whole when the block ends without error, so a
    reader sees no folder or a complete one. If another process published `final` first, or the
    block fails, exactly the files this folder made are deleted, then the folder: never a file it
    did not make. A process killed meanwhile leaves `.<final>.<8 hex>.tmp/`, which no reader takes
    for the folder."""

    def __init__(self, final: Path):
        self.final = Path(final)
        self.path = temporary_path(self.final)
        self.made: list[str] = []

    def __enter__(self) -> "ScratchFolder":
        make_folder(self.final.parent)
        os.mkdir(self.path)
        return self

    def file(self, name: str) -> Path:
        return below(self.path, name)

    def _made(self, name: str) -> Path:
        if name not in self.made:
            raise ValueError(f"{self.path} did not make {name!r}: refusing to change it")
        return self.file(name)

    def new_file(self, name: str) -> BinaryIO:
        """A new file `name` in the folder, opened for writing."""
        file = open_new(self.file(name))
        self.made.append(name)
        return file

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.new_file(name) as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())

    def update(self, name: str) -> BinaryIO:
        """File `name`, which this folder made, opened to read, overwrite and truncate in place."""
        return os.fdopen(os.open(self._made(name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), "r+b")

    def remove(self, name: str) -> None:
        self._made(name).unlink()
        self.made.remove(name)

    def discard(self) -> None:
        for name in self.made:
            self.file(name).unlink(missing_ok=True)
        self.made = []
        try:
            os.rmdir(self.path)
        except OSError:  # something this folder did not make was put there: it stays, with the folder
            pass

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:
            self.discard()
            return
        fsync_path(self.path)
        try:
            os.rename(self.path, self.final)  # fails if another process published a (non-empty) folder first
        except OSError:
            self.discard()
            return
        fsync_path(self.final.parent)


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
    return isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)


class Manifest:
    """What headlab wrote in one folder: each file's size and SHA-256 (`files`, the folder's
    state), files it wrote that are not (or not yet) part of that state (`retired`, same
    entries: deleted at the next write if their content still matches), names it is writing
    now (`discard`: at the next write only their temporaries, and a folder among them once
    empty if headlab made it, are removed; nothing there is deleted on a name alone), the
    folders it made (`folders`, recorded before each is made), and `meta`."""

    def __init__(self, folder: Path, name: str, kind: str, files: dict | None = None,
                 discard: list | None = None, meta: dict | None = None, retired: dict | None = None,
                 folders: list | None = None):
        self.folder, self.name, self.kind = Path(folder), name, kind
        self.files: dict[str, dict] = files or {}
        self.discard: list[str] = discard or []
        self.meta: dict = meta or {}
        self.retired: dict[str, dict] = retired or {}
        self.folders: list[str] = folders or []

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
                and isinstance(payload.get("folders", []), list)
                and all(map(_is_entry, payload["files"].values()))
                and all(map(_is_entry, payload.get("retired", {}).values()))):
            raise ValueError(f"{path} is not the manifest of {kind} (format, kind, files, discard, retired, folders, "
                             "meta)")
        manifest = cls(folder, name, kind, payload["files"], payload["discard"], payload["meta"],
                       payload.get("retired"), payload.get("folders"))
        for listed in [*manifest.files, *manifest.retired, *manifest.discard, *manifest.folders]:
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
                   "retired": self.retired, "folders": self.folders, "meta": self.meta}
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
        if (os.path.lexists(path) and name not in self.files and name not in self.retired
                and name not in self.discard):
            raise ValueError(f"{path} exists but {self.path} does not list it (not written by headlab): headlab "
                             "never overwrites it; move it away or choose another folder")
        return path

    def write(self, name: str, write: Callable[[HashingFile], None]) -> None:
        """Write file `name` atomically and record it (saved with the manifest's next `save`)."""
        self.write_all({name: write})

    def write_bytes(self, name: str, data: bytes) -> None:
        self.write(name, lambda file: file.write(data))

    def write_all(self, writes: dict[str, Callable[[HashingFile], None]]) -> None:
        """Write every file of `writes` into temporaries first and only then rename them over
        their names, so a failure while writing leaves every earlier version in place. The
        names are recorded (saved with the next `save`)."""
        new = [name for name in writes if name not in self.files and name not in self.retired
               and name not in self.discard]
        if new:  # listed as being written first, so a kill after a rename leaves no file headlab disowns
            for name in new:
                self._target(name)
            self.discard += new
            self.save()
        staged = {}
        try:
            for name, write in writes.items():
                staged[name] = stage_file(self._target(name), write)
        except BaseException:
            for tmp, _ in staged.values():
                tmp.unlink(missing_ok=True)
            raise
        for name, (tmp, entry) in staged.items():
            commit_file(tmp, self.file(name))
            self.files[name] = entry
            self.retired.pop(name, None)
        self.discard = [name for name in self.discard if name not in writes]

    def retire(self, name: str) -> None:
        """Move a listed file out of the folder's state: deleted at the next `remove_leftovers`."""
        self.retired[name] = self.files.pop(name)

    def entry(self, name: str) -> dict:
        if name not in self.files:
            raise ValueError(f"{self.path} does not list {name}: it was not written by headlab; write the folder again")
        return self.files[name]

    def read_bytes(self, name: str) -> bytes:
        """The content of file `name`, verified against its recorded SHA-256."""
        entry, path = self.entry(name), self.file(name)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            raise ValueError(f"{path} is missing, but {self.path} lists it: restore it, or write the folder "
                             "again") from None
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise mismatch(path, self.path)
        return data

    def verify(self, name: str) -> Path:
        """The path of file `name` once its content is verified (read in chunks: for large files)."""
        entry, path = self.entry(name), self.file(name)
        if not path.exists():
            raise ValueError(f"{path} is missing, but {self.path} lists it: restore it, or write the folder again")
        if file_digest(path) != entry["sha256"]:
            raise mismatch(path, self.path)
        return path

    def remove_leftovers(self) -> list[str]:
        """Delete what a killed or superseded writer left: temporaries whose name says which
        listed or discarded name they were becoming, retired files whose content still matches
        their entry (never one the folder's state lists), and discarded folders once empty.
        Nothing else is touched."""
        ours = set(self.files) | set(self.retired) | set(self.discard) | {self.name}
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
        if pending != self.discard or self.retired or made != self.folders:
            self.discard, self.retired, self.folders = pending, {}, made
            self.save()
        return removed


class FolderLocked(RuntimeError):
    """Another live process is writing this folder."""


class FolderLock:
    """An exclusive flock on `folder/.lock`, held while this process writes the folder. The
    lock file is opened without following links; its text (pid, host, start) only names the
    holder in the error, and is written only into a file of this folder alone (one a hard-linked
    backup shares is first replaced by the folder's own)."""

    def __init__(self, folder: Path, writer: str):
        self.path, self.writer = Path(folder) / LOCK, writer
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        fd = self._locked()
        while not _names(self.path, fd) or (os.fstat(fd).st_nlink > 1 and _headlabs(fd)):
            if _names(self.path, fd):  # shared with a hard-linked backup (`cp -al`): the backup's keeps its
                own = temporary_path(self.path)  # bytes, this folder gets a lock of its own
                try:
                    with open_new(own):
                        pass
                    os.replace(own, self.path)
                finally:
                    own.unlink(missing_ok=True)
            os.close(fd)  # (or another writer replaced it meanwhile) lock the file the name holds now
            fd = self._locked()
        if _headlabs(fd):  # never overwrite another tool's file
            os.ftruncate(fd, 0)
            since = time.strftime("%Y-%m-%d %H:%M:%S")
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None

    def _locked(self) -> int:
        """A descriptor of the lock file (created if missing, never through a link) holding its flock."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise ValueError(f"{self.path} is a symbolic link: headlab never writes through links; remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{self.path} is not a regular file: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise FolderLocked(f"{self.path.parent} is being written by another {self.writer} ({holder}): wait for "
                               "it to finish, then retry, or choose another folder") from None
        return fd


def _headlabs(fd: int) -> bool:
    """Whether the lock file open as `fd` is headlab's: empty, or naming a holder as headlab does."""
    return os.fstat(fd).st_size == 0 or os.pread(fd, 4, 0) == b"pid "


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (not replaced since it was opened)."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def being_written(folder: Path) -> bool:
    """Whether a live process holds `folder`'s lock (so a failed read may be a write in progress)."""
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


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
