"""Atomic file writes: write a temporary file in the same folder, fsync, then rename over the
target, so a reader (or a resumed run) sees the old file or the new one, never half of one.

Temporary names are `.<name>.<random>.tmp`; `remove_temporaries` deletes those a killed
process left behind. Files get the usual permissions (0666 less the umask, typically 0644)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Callable

TEMPORARY_SUFFIX = ".tmp"


def temporary_path(path: Path) -> Path:
    """A fresh hidden name beside `path` that `remove_temporaries` recognises."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")


def default_file_mode() -> int:
    """0666 less the process's umask: the permissions `open()` gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_path)` and atomically move the result to `path`."""
    path = Path(path)
    tmp = temporary_path(path)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # umask applies, unlike mkstemp's 0600
    try:
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def remove_temporaries(folder: Path) -> list[str]:
    """Delete the hidden `.*.tmp` files and folders a killed writer left in `folder`; returns their names."""
    removed = []
    for entry in Path(folder).glob(f".*{TEMPORARY_SUFFIX}"):
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed
