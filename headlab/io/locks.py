"""Folder locks: an flock on `<folder>/.lock` held while one process writes the folder. The kernel
drops it when that process dies, so a dead writer's lock is never obeyed."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import time
from pathlib import Path

from headlab.io.files import open_new, temporary_path

LOCK = ".lock"
HELD = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)  # flock's answers when another process holds the lock
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP)  # a file system that has no flock (Lustre without -o flock)


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
            if error.errno in NO_FLOCK:
                raise RuntimeError(f"{self.path.parent} is on a file system without flock (e.g. Lustre mounted "
                                   "without -o flock): headlab locks each folder it writes, so write to a folder on "
                                   "a file system with flock (a local disk, or Lustre mounted with -o flock)") from None
            if error.errno not in HELD:
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
    except OSError as error:
        return error.errno in HELD  # without flock no process can hold the lock either
    finally:
        os.close(fd)
