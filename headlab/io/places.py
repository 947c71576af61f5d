"""Places headlab reads but does not own: a Hugging Face Hub cache, a user's checkpoint folder.

Unlike the folders headlab writes (whose files it reads only without links, `headlab.io.files`),
such a place may hold links: the Hub cache stores every file of a snapshot as a link into the
repository's `blobs/`. Links are followed, but only to regular files inside the place's root
(the repository folder `models--ORG--NAME` of the cache, else the checkpoint folder itself),
resolved to the end of any chain; a name that lands elsewhere is refused, one that points at
nothing is named as missing. Nothing in a place is ever written.

    place = ReadPlace(folder).check()         # every entry of `folder` resolved once
    data = place.read_bytes("config.json")    # through its link, if it stays inside
    place = hub_snapshot(repo, snapshot)      # a Hub repository's snapshot, its refs resolved too

The Hub lays a repository out as models--ORG--NAME/{refs/<branch>, snapshots/<commit>/<files>,
blobs/<sha>}: refs/<branch> holds a commit name, each snapshot file is a relative link into
blobs/."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from headlab.io.files import below, open_regular, parse_json

SNAPSHOTS, REFS = "snapshots", "refs"


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


class ReadPlace:
    """Folder `folder`, read through links that stay inside `root` (by default the folder itself;
    both are resolved once, so a root reached through a link of the user's own, such as a linked
    cache folder, is the place). `what` names it in errors."""

    def __init__(self, folder: Path, root: Path | None = None, what: str | None = None):
        self.folder = Path(folder)
        self.root = _real(root if root is not None else folder)
        self.what = what or f"the checkpoint folder {self.folder}"
        if not _real(self.folder).is_relative_to(self.root):
            raise ValueError(f"{self.what}: {self.folder} leads outside it, to {_real(self.folder)} ({self.root}): "
                             "refusing to read it")

    def exists(self, name: str) -> bool:
        """Whether something (a file, a folder, a link, even a dangling one) is named `name`."""
        return os.path.lexists(below(self.folder, name))

    def path(self, name: str) -> Path:
        """The real path of regular file `name` (a link followed to its end), refused unless it is
        inside the root and there."""
        return self._resolved(below(self.folder, name), name)

    def _resolved(self, path: Path, name: str) -> Path:
        real = _real(path)
        if not real.is_relative_to(self.root):
            raise ValueError(f"{self.what}: {name} leads outside it, to {real}: headlab follows the links of a place "
                             f"it reads only to files inside it ({self.root}); refusing it")
        try:
            mode = os.stat(real).st_mode
        except FileNotFoundError:
            if os.path.islink(path) or real != path.absolute():
                raise ValueError(f"{self.what} is incomplete: {name} is a link to {real}, which is missing (an "
                                 "interrupted download?): download it again") from None
            raise ValueError(f"{path} is missing from {self.what}") from None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ValueError(f"{self.what}: {name} is a chain of links that never ends (a loop, {path}); "
                                 "refusing it") from None
            raise
        if not stat.S_ISREG(mode):
            raise ValueError(f"{self.what}: {name} is not a regular file (a FIFO, device or folder: {path}); it "
                             "cannot be read through it")
        return real

    def read_bytes(self, name: str) -> bytes:
        fd = open_regular(self.path(name))
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def read_json(self, name: str):
        """The JSON value of file `name` (one line naming the file if it is not JSON in UTF-8)."""
        return parse_json(self.read_bytes(name), self.folder / name)

    def check(self) -> "ReadPlace":
        """Resolve every entry of the folder (those a reader such as `transformers` opens by name):
        a link that leaves the root is refused, one to nothing names the place incomplete. A folder
        (or a link to one inside the root) is not looked into."""
        for entry in sorted(os.scandir(self.folder), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                continue
            real = _real(Path(entry.path))
            if entry.is_symlink() and real.is_dir() and real.is_relative_to(self.root):
                continue
            if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                self._resolved(Path(entry.path), entry.name)
        return self


def hub_repository(repo: Path) -> ReadPlace:
    """Hub repository folder `repo` (models--ORG--NAME) as a place, once it is found to resolve
    inside the cache that holds it (a name in the cache, like its refs and links) and each of its refs is found
    to be a file inside it naming one plain commit: checked before the Hub's client reads a ref,
    since it joins what a ref holds to a path without a look."""
    repo = Path(repo)
    what = f"the Hugging Face cache of {repo.name}"
    cache = _real(repo.parent)  # the cache may be reached through a link of the user's; its names may not lead out
    if not _real(repo).is_relative_to(cache):
        raise ValueError(f"{what}: {repo} leads outside the cache, to {_real(repo)}: headlab reads a model's folder "
                         f"only inside the cache ({cache}); link the whole cache instead, or set HF_HUB_CACHE")
    place = ReadPlace(repo, what=what)
    refs = repo / REFS
    if refs.is_dir() and not refs.is_symlink():
        for entry in sorted(refs.rglob("*")):
            if not entry.is_dir() or entry.is_symlink():
                name = entry.relative_to(repo).as_posix()
                commit = place.read_bytes(name).decode("utf-8", errors="replace").strip()
                if not commit or any(c in commit for c in "/\\\0") or commit in (".", ".."):
                    raise ValueError(f"{place.what}: {name} does not hold a commit name (it holds {commit[:80]!r}); "
                                     f"the cache is damaged ({entry}): refusing it")
    elif os.path.lexists(refs):
        place.path(REFS)  # a link or a file where the refs folder goes: refused unless it stays inside
    return place


def hub_snapshot(repo: Path, snapshot: Path) -> ReadPlace:
    """The snapshot folder `snapshot` of Hub repository folder `repo` (as the Hub's client resolved
    it) as a checked place whose root is `repo`: refused unless it is `repo`/snapshots/<one plain
    name> and resolves to a folder inside `repo`."""
    place = hub_repository(repo)
    snapshot = Path(snapshot)
    if _real(snapshot.parent) != _real(place.folder / SNAPSHOTS) or snapshot.name in ("", ".", ".."):
        raise ValueError(f"{place.what}: {snapshot} is not one of its snapshot folders (snapshots/<commit>): "
                         "refusing it")
    real = _real(snapshot)
    if not real.is_relative_to(place.root) or not real.is_dir():
        raise ValueError(f"{place.what}: the snapshot {snapshot.name} leads outside it, to {real} ({place.root}): "
                         "refusing it")
    return ReadPlace(snapshot, place.folder, place.what).check()


def _in_hub_cache(folder: Path) -> bool:
    """Whether absolute `folder` is named as a Hub cache snapshot (models--ORG--NAME/snapshots/<commit>)."""
    return folder.parent.name == SNAPSHOTS and folder.parent.parent.name.startswith("models--")


def checkpoint_place(folder: Path) -> ReadPlace:
    """Checkpoint folder `folder`, named by path, as a checked place: rooted at itself, or at its
    repository when it is a snapshot folder of a Hub cache (models--ORG--NAME/snapshots/<commit>,
    whose files are links into the repository's blobs/)."""
    folder = Path(folder).absolute()
    if _in_hub_cache(folder):
        return hub_snapshot(folder.parent.parent, folder)
    return ReadPlace(folder).check()


def checkpoint_file(path: Path) -> Path:
    """The real path of checkpoint file `path`, named by the user by itself (a GGUF file, a
    wheel): in a Hub cache's snapshot folder, that place's file, found through links that stay in
    its repository; elsewhere the file named is the place, so a link of the user's own is followed
    to its end, as opening it by name would, and must end at a regular file."""
    path = Path(path).absolute()
    if _in_hub_cache(path.parent):
        return hub_snapshot(path.parent.parent.parent, path.parent).path(path.name)
    real = _real(path)
    return ReadPlace(real.parent, what=f"the checkpoint {path}").path(real.name)
