"""Token shards: a tokenized corpus as memory-mapped `train_*.bin` / `val_*.bin` files plus
`meta.json`, and seeded random training windows read from them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from headlab.data.tokenizers import get_tokenizer
from headlab.data.bpe import TOKENIZER_FILE
from headlab.io import atomic_write_bytes, atomic_write_text, file_digest, mismatch, read_regular

TOKENS_FOLDER = "tokens-sha256"  # under the cache: shard folders whose meta.json records each file's SHA-256
VAL_FRACTION = 0.1
SHARD_TOKENS = 1 << 26  # 64 Mi tokens per shard file


@dataclass
class Corpus:
    """Tokenized train/val streams (lists of memory-mapped shards) and how to read them."""

    name: str
    tokenizer_name: str
    vocab_size: int
    train: list[np.ndarray]
    val: list[np.ndarray]
    bytes_per_token: float  # UTF-8 bytes per token over the corpus, for bits per byte
    sha256: str | None = None  # of the token stream (train then val), the corpus's identity
    folder: Path | None = None  # the shards' folder (a trained tokenizer lives there too)

    @property
    def n_train_tokens(self) -> int:
        return sum(len(s) for s in self.train)

    @property
    def n_val_tokens(self) -> int:
        return sum(len(s) for s in self.val)

    @property
    def tokenizer(self):
        return get_tokenizer(self.tokenizer_name, self.folder)


def write_shards(texts: Iterable[str], tokenizer, folder: Path, val_texts: Iterable[str] | None = None) -> None:
    """Tokenize `texts` into `train_NNN.bin` / `val_NNN.bin` and `meta.json` under `folder`.

    Tokens stream to a scratch file as they are produced, so memory stays bounded whatever the
    corpus size; the final VAL_FRACTION of the stream becomes the validation split, unless
    `val_texts` give it."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / "stream.tmp"
    n_tokens = n_bytes = 0
    digest = hashlib.sha256()
    with open(scratch, "wb") as f:
        for split_texts in (texts, val_texts or ()):
            train_tokens = n_tokens
            for text in split_texts:
                tokens = tokenizer.encode(text).tobytes()
                f.write(tokens)
                digest.update(tokens)
                n_tokens += len(tokens) // np.dtype(tokenizer.dtype).itemsize
                n_bytes += len(text.encode("utf-8"))
    if n_tokens < 1000:
        scratch.unlink()
        raise ValueError(f"corpus has only {n_tokens} tokens; at least 1000 are needed")
    stream = np.memmap(scratch, dtype=tokenizer.dtype, mode="r")
    cut = train_tokens if val_texts is not None else int(n_tokens * (1 - VAL_FRACTION))
    meta = {"tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size, "dtype": np.dtype(tokenizer.dtype).name,
            "bytes_per_token": n_bytes / n_tokens, "sha256": digest.hexdigest(), "shards": {}, "files": {}}
    if (folder / TOKENIZER_FILE).exists():  # a BPE trained for these shards
        meta["files"][TOKENIZER_FILE] = hashlib.sha256(read_regular(folder / TOKENIZER_FILE)).hexdigest()
    for split, (start, end) in (("train", (0, cut)), ("val", (cut, n_tokens))):
        names = []
        for i, shard_start in enumerate(range(start, end, SHARD_TOKENS)):
            name = f"{split}_{i:03d}.bin"
            entry = atomic_write_bytes(folder / name, stream[shard_start:min(end, shard_start + SHARD_TOKENS)].tobytes())
            meta["files"][name] = entry["sha256"]
            names.append(name)
        meta["shards"][split] = names
    del stream
    scratch.unlink()
    atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))


def read_shards(folder: Path, name: str) -> Corpus:
    """The corpus in `folder`, every shard (and trained tokenizer) verified against the SHA-256
    meta.json recorded when it was written."""
    meta = json.loads(read_regular(folder / "meta.json"))
    for file, sha256 in meta["files"].items():
        if file_digest(folder / file) != sha256:
            raise ValueError(f"{mismatch(folder / file, folder / 'meta.json')}. The token cache is damaged: delete "
                             f"{folder} and it will be tokenized again")
    dtype = np.dtype(meta["dtype"])
    splits = {split: [np.memmap(folder / f, dtype=dtype, mode="r") for f in files]
              for split, files in meta["shards"].items()}
    return Corpus(name, meta["tokenizer"], meta["vocab_size"], splits["train"], splits["val"], meta["bytes_per_token"],
                  sha256=meta["sha256"], folder=folder)


def random_windows(shards: list[np.ndarray], batch_size: int, seq_len: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (B, seq_len) from windows at seeded random offsets.

    A window never crosses a shard boundary; shards are chosen in proportion to their size."""
    usable = np.array([max(0, len(s) - seq_len) for s in shards], dtype=np.int64)  # starts 0 … len − seq_len − 1
    if usable.sum() == 0:
        raise ValueError(f"seq_len = {seq_len} is longer than every token shard")
    offsets = torch.randint(0, int(usable.sum()), (batch_size,), generator=generator).numpy()
    bounds = np.cumsum(usable)
    rows = []
    for offset in offsets:
        shard = int(np.searchsorted(bounds, offset, side="right"))
        start = offset - (bounds[shard - 1] if shard else 0)
        rows.append(np.asarray(shards[shard][start:start + seq_len + 1], dtype=np.int64))
    batch = torch.from_numpy(np.stack(rows))
    return batch[:, :-1], batch[:, 1:]
