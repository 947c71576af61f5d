"""Scratch folders: a folder filled in private and renamed into place whole (the token cache),
so a reader sees no folder or a complete one; only the files it made there are ever deleted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from headlab.io.files import below, fsync_path, make_folder, open_new, temporary_path


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
