"""What a careful or a tired user, or the machine, does to headlab's folders: links, swaps,
truncations, hand edits of a manifest, a file-size limit, a full disk, kill -9 (at a moment, or
right after any chosen write). Shared by the
tree-diff test (tests/disk/test_treediff.py) and the hostile-input benchmark
(tools/hostile_inputs.py), so both inflict the same faults the same way.

The edits are the user's, made with plain file operations on purpose: they are what headlab
must survive, not something headlab does."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import time
from pathlib import Path
from typing import Callable

from headlab.io import MANIFEST_NAMES, being_written

MANIFESTS = tuple(sorted(MANIFEST_NAMES))
FIELDS = ("files", "intended", "retired", "discard", "staging")  # a manifest's records of a write
STATES = ("no content", "true", "false")  # what a forged record says of the file it names


# ---- edits of files and folders ----------------------------------------------------------------

def remove(path: Path) -> None:
    """Whatever is at `path` (a folder with all it holds, a file, a link), gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def link(path: Path, target: Path) -> None:
    """Replace whatever is at `path` by a symbolic link to `target`."""
    remove(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def swap(a: Path, b: Path) -> bool:
    """Exchange two entries (files or folders) by name; False if either is missing."""
    if not (os.path.lexists(a) and os.path.lexists(b)):
        return False
    parked = a.with_name(a.name + ".swapping")
    os.rename(a, parked)
    os.rename(b, a)
    os.rename(parked, b)
    return True


def truncate(path: Path, keep: int) -> bool:
    """Cut regular file `path` to its first `keep` bytes (a link or folder is left alone)."""
    if not path.is_file() or path.is_symlink():
        return False
    os.truncate(path, min(keep, path.stat().st_size))
    return True


def users_file(path: Path, text: str = "the user's own") -> bool:
    """A user's file at `path`, if nothing is there and its folder is a real one."""
    if os.path.lexists(path) or not path.parent.is_dir() or path.parent.is_symlink():
        return False
    path.write_text(text)
    return True


def manifest_of(folder: Path) -> Path | None:
    """The headlab manifest in `folder` (a regular file), if there is one."""
    return next((folder / name for name in MANIFESTS
                 if (folder / name).is_file() and not (folder / name).is_symlink()), None)


def edit_json(path: Path, change: Callable[[dict], None]) -> bool:
    """Apply `change` to the JSON object in `path` and write it back by hand; False if unreadable."""
    try:
        payload = json.loads(path.read_text())
        change(payload)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    path.write_text(json.dumps(payload))
    return True


def list_in_manifest(folder: Path, field: str, name) -> bool:
    """Add `name` to a manifest's `discard` list or (with a made-up entry) its `files`."""
    manifest = manifest_of(folder)
    if manifest is None:
        return False
    return edit_json(manifest, lambda payload: payload["discard"].append(name) if field == "discard"
                     else payload["files"].__setitem__(name, {"bytes": 1, "sha256": "0" * 64}))


def forge_entry(folder: Path, field: str, name: str, state: str) -> bool:
    """Record `name` (a path below `folder`) in `field` of the manifest of `folder`, as a hostile
    hand would: with no content (an `intended` entry written before its bytes; elsewhere a name
    alone), the true record of what is there now (its size and SHA-256, or for `staging` its
    inode), or a false one. False if there is no readable manifest."""
    manifest = manifest_of(folder)
    if manifest is None:
        return False
    path = folder / name
    if field == "staging":
        inode = os.lstat(path).st_ino if os.path.lexists(path) else 1
        record = None if state == "no content" else inode if state == "true" else inode + 1
    elif state == "no content":
        record = None
    elif state == "true" and path.is_file() and not path.is_symlink():
        record = {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    else:
        record = {"bytes": 7, "sha256": hashlib.sha256(b"another").hexdigest()}

    def change(payload: dict) -> None:
        if field == "discard":
            payload["discard"].append(name)
        else:
            payload.setdefault(field, {})[name] = record
    return edit_json(manifest, change)


def hub_layout(files: Path, cache: Path, repo: str, commit: str) -> Path:
    """The files of folder `files` put into Hub cache `cache` as the Hub lays a download out:
    each file's bytes in `repo`/blobs/<sha256>, `repo`/snapshots/`commit`/<file> a relative link
    to it, `repo`/refs/main naming the commit. Returns the repository folder."""
    folder = cache / repo
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    for file in sorted(files.iterdir()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, folder / "blobs" / digest)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    return folder


def edit_study_meta(folder: Path, **fields) -> bool:
    """Change what a study's study.json states about it (its preset, shape, seeds), by hand."""
    return edit_json(folder / "study.json", lambda payload: payload["meta"]["meta"].update(fields))


# ---- the machine: a full disk, a file-size limit, kill -9 ------------------------------------------

@contextlib.contextmanager
def failing_call(owner, attribute: str, nth: int, error: OSError | None = None):
    """`owner.attribute` fails with `error` (default: a full disk) on its `nth` call in the block."""
    real = getattr(owner, attribute)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == nth:
            raise error or OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)
    setattr(owner, attribute, failing)
    try:
        yield calls
    finally:
        setattr(owner, attribute, real)


def in_child(work: Callable[[], int], file_size: int | None = None) -> tuple[int, int]:
    """Fork a child that runs `work()` (optionally under RLIMIT_FSIZE = `file_size` bytes, so a
    write beyond it fails with EFBIG, as on a full quota) and exits with its status; returns its
    pid and the read end of a pipe that carries its stderr."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        status = 1
        try:
            os.close(read)
            os.dup2(write, 2)
            if file_size is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            status = work()
        finally:
            os._exit(status if isinstance(status, int) else 1)
    os.close(write)
    return pid, read


def _finish(pid: int, read: int) -> tuple[int, str]:
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)), err


def with_file_size_limit(work: Callable[[], tuple[int, str]], file_size: int) -> tuple[int, str]:
    """(exit status, stderr) of `work()` (which returns its status and stderr) run in a child
    process whose files may not grow beyond `file_size` bytes."""
    def child() -> int:
        status, err = work()
        os.write(2, err.encode())
        return status
    return _finish(*in_child(child, file_size))


def kill_while_writing(work: Callable[[], object], folder: Path, delay: float, timeout: float = 120) -> bool:
    """Run `work()` in a child process and kill -9 it `delay` seconds after it starts writing
    `folder` (holds its lock); returns whether it was killed before it finished."""
    pid, read = in_child(lambda: (work(), 0)[1])
    try:
        start = time.monotonic()
        while not being_written(folder) and time.monotonic() - start < timeout:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return False  # finished (or refused) before it wrote anything
            time.sleep(0.005)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return os.WIFSIGNALED(status)
    finally:
        os.close(read)


# The os functions through which headlab.io changes a file or folder (tests/disk/test_one_writer.py
# checks that no other module does): each call to one is a write point `killed_after_write` counts.
WRITES = ("open", "write", "ftruncate", "replace", "rename", "unlink", "mkdir", "rmdir")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT
KILLED = -signal.SIGKILL  # the status `_finish` gives a child killed -9


def written_path(call: str, args: tuple) -> Path | None:
    """The path that os function `call` with `args` changes (None: it only reads)."""
    if call in ("write", "ftruncate"):
        return Path(os.readlink(f"/proc/self/fd/{args[0]}"))
    if call == "open" and not (len(args) > 1 and args[1] & WRITE_FLAGS):
        return None
    path = os.path.abspath(args[1] if call in ("replace", "rename") else args[0])
    return Path(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def kill_after_write(work: Callable[[], object], root: Path, nth: int,
                     where: Callable[[Path], bool] = lambda path: True) -> int:
    """Run `work()` in a child process that is killed -9 right after its `nth` write below `root`
    that `where` accepts (a call of one of `WRITES` that creates, writes, truncates, renames or
    deletes a path there; a rename counts for its new name). Returns the child's status: KILLED,
    or (with fewer such writes) 0 when `work()` returned, 1 when it raised."""
    root = Path(root).resolve()

    def child() -> int:
        count = 0

        def counted(call: str, real: Callable) -> Callable:
            def write(*args, **kwargs):
                nonlocal count
                path = written_path(call, args)
                result = real(*args, **kwargs)
                if path is not None and path.is_relative_to(root) and where(path):
                    count += 1
                    if count == nth:
                        os.kill(os.getpid(), signal.SIGKILL)
                return result
            return write
        for call in WRITES:
            setattr(os, call, counted(call, getattr(os, call)))
        work()
        return 0
    return _finish(*in_child(child))[0]
