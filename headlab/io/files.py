"""Files that are never half-written and never reached through a link.

A file is written under a temporary name beside it (`.<name>.<8 hex>.tmp`), fsynced and renamed
over its target, so a reader sees the old file or the new one; it gets the usual permissions
(0666 less the umask). New files are opened with O_EXCL | O_NOFOLLOW and replaced by rename, so
a write never follows a symbolic link. A name read from a file must name a path strictly below
its folder, reached through no link (`inside`)."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Callable

TEMPORARY_SUFFIX = ".tmp"
TEMPORARY = re.compile(r"^\.(.+)\.[0-9a-f]{8}\.tmp$")  # what `temporary_path` names
CHUNK = 1 << 24
BUFFER = 1 << 20


def temporary_path(path: Path, token: str | None = None) -> Path:
    """A hidden name beside `path`: `.<name>.<token>.tmp`, the token 8 random hex digits unless given."""
    return path.with_name(f".{path.name}.{token or secrets.token_hex(4)}{TEMPORARY_SUFFIX}")


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingFile:
    """A new file (never through a link) that hashes what is written to it: what `torch.save`
    and the other writers are handed, so the hash costs no second pass over the data. Writes
    smaller than `BUFFER` are gathered before they reach the descriptor: torch.save hands over
    each record of a checkpoint apart, some hundred system calls per checkpoint otherwise."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        self.digest, self.size = hashlib.sha256(), 0
        self.pending = bytearray()
        self.failure: OSError | None = None  # what the disk said, when a caller (torch) rewords it

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        if len(self.pending) + len(view) <= BUFFER:
            self.pending += view
        else:
            self.flush()
            self._write_through(view)
        return len(view)

    def flush(self) -> None:
        """Hand what is gathered to the descriptor (`stage_file` does before its fsync)."""
        with memoryview(self.pending) as view:
            self._write_through(view)
        self.pending.clear()

    def _write_through(self, view: memoryview) -> None:
        written = 0
        try:
            while written < len(view):
                written += os.write(self.fd, view[written:written + (1 << 30)])
        except OSError as error:
            self.failure = error
            raise

    @property
    def entry(self) -> dict:
        return {"bytes": self.size, "sha256": self.digest.hexdigest()}


def open_temporary(path: Path, token: str | None = None) -> tuple[Path, HashingFile]:
    """A new temporary beside `path` (never one already there, never through a link), open for
    `fill`. `path` itself is not touched until `commit_file`."""
    tmp = temporary_path(Path(path), token)
    try:
        return tmp, HashingFile(tmp)
    except OSError as error:  # named by the file being written, not by its temporary
        raise OSError(error.errno, error.strerror, str(path)) from None


def fill(file: HashingFile, write: Callable[[HashingFile], None]) -> dict:
    """Write the content of a temporary from `open_temporary` through `write(file)`, flush it to
    disk and close it; returns its manifest entry (size and SHA-256, hashed as it was written).
    A failure of the disk is raised as the disk said it, even where the writer (torch) rewords it."""
    try:
        write(file)
        file.flush()
        os.fsync(file.fd)
    except Exception:
        if file.failure is not None:
            raise file.failure from None
        raise
    finally:
        os.close(file.fd)
    return file.entry


def stage_file(path: Path, write: Callable[[HashingFile], None], token: str | None = None) -> tuple[Path, dict]:
    """Write the content of `path` through `write(file)` into a new temporary beside it; returns
    the temporary and the manifest entry. A failure removes the temporary (this process made it)."""
    tmp, file = open_temporary(path, token)
    try:
        return tmp, fill(file, write)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def commit_file(tmp: Path, path: Path) -> None:
    """Rename a staged temporary over `path` (a link there is replaced, never followed). A refusal
    (an immutable file, a folder in the way) names `path`, not the temporary, which is removed."""
    try:
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(Path(path).parent)


def write_file(path: Path, write: Callable[[HashingFile], None], token: str | None = None) -> dict:
    """Write `path` atomically through `write(file)` (its temporary named by `token`, if given);
    returns its manifest entry."""
    tmp, entry = stage_file(path, write, token)
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
    fd = open_regular(path)
    try:
        return descriptor_digest(fd)
    finally:
        os.close(fd)


def descriptor_digest(fd: int) -> str:
    """SHA-256 of the whole file open as `fd`, read from its start in `CHUNK`s (its offset is left alone)."""
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a float")
    return value


def parse_json(data: bytes | str, where) -> object:
    """The JSON value of `data`, read from `where` (named in the error). Refused, in one line: text
    that is not JSON in UTF-8, nesting too deep to read, an integer too long for Python to convert,
    and a number beyond the range of a float (1e400, which Python would read as infinity: headlab
    writes infinity as `Infinity`, never so)."""
    try:
        return json.loads(data, parse_float=_finite)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{where} is not valid JSON: {str(error)[:200]}") from None


def held_path(fd: int, path: Path) -> Path:
    """A path that names the file open as `fd` while it stays open, whatever `path` names by
    then (Linux: /proc/self/fd/N), for readers that open by name (a memory map); `path` where
    the system has no such names."""
    own = Path(f"/proc/self/fd/{fd}")
    return own if own.exists() else path


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


def silence_stdout() -> None:
    """Point this process's stdout at /dev/null, so that flushing it at exit does not fail a second
    time after its reader went away (`headlab analyze ... | head -1`)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no descriptor (a captured stdout): nothing is flushed to a pipe
        pass
