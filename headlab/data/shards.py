"""Token shards: a tokenized corpus as memory-mapped `train_*.bin` / `val_*.bin` files plus
`meta.json`, and seeded random training windows read from them."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from headlab.data.bpe import TOKENIZER_FILE
from headlab.data.encoding import encode_texts
from headlab.data.tokenizers import get_tokenizer
from headlab.io import ScratchFolder, file_digest, mismatch, read_regular

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


def write_shards(texts: Iterable[str], tokenizer, folder: ScratchFolder, val_texts: Iterable[str] | None = None,
                 workers: int = 1, documents: bool = False) -> None:
    """Tokenize `texts` into `train_NNN.bin` / `val_NNN.bin` and `meta.json` under `folder`.

    Tokens are appended to the shard files as they are produced (by `workers` processes, in
    order), so memory stays bounded whatever the corpus size and there is no second copy on disk;
    the final VAL_FRACTION of the stream becomes the validation split, unless `val_texts` give it.
    With `documents`, each text is a document followed by the tokenizer's end-of-text token."""
    splits = {split: ShardFiles(folder, split, tokenizer.dtype) for split in ("train", "val")}
    n_bytes = 0
    digest = hashlib.sha256()
    for split, split_texts in (("train", texts), ("val", val_texts or ())):
        for tokens, text_bytes in encode_texts(split_texts, tokenizer, workers, documents):
            splits[split].write(tokens)
            digest.update(tokens)
            n_bytes += text_bytes
    n_tokens = sum(files.n_tokens for files in splits.values())
    if n_tokens < 1000:
        for files in splits.values():
            files.remove()
        raise ValueError(f"corpus has only {n_tokens} tokens; at least 1000 are needed")
    if val_texts is None:
        splits["train"].move_tail(int(n_tokens * (1 - VAL_FRACTION)), splits["val"])
    empty = [split for split, files in splits.items() if files.n_tokens == 0]
    if empty:
        for files in splits.values():
            files.remove()
        raise ValueError(f"corpus leaves the {empty[0]} split empty ({n_tokens} tokens): a document corpus needs at "
                         "least 10 non-empty documents (every 10th is validation)")
    meta = {"tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size, "dtype": np.dtype(tokenizer.dtype).name,
            "bytes_per_token": n_bytes / n_tokens, "sha256": digest.hexdigest(),
            "shards": {split: files.close() for split, files in splits.items()}}
    # Each file's hash, taken once it is final (the validation tail moves after writing), read back
    # a shard at a time; read_shards verifies every file against it.
    owned = [name for names in meta["shards"].values() for name in names]
    owned += [TOKENIZER_FILE] if TOKENIZER_FILE in folder.made else []  # a BPE trained for these shards
    meta["files"] = {name: file_digest(folder.file(name)) for name in owned}
    folder.write_bytes("meta.json", json.dumps(meta, indent=2).encode())


class ShardFiles:
    """One split's tokens appended to `<split>_000.bin`, `<split>_001.bin`, ... of SHARD_TOKENS
    each as they arrive: neither the split nor one shard is ever held in memory."""

    COPY_TOKENS = 1 << 22  # tokens per read when moving a tail: bounded memory

    def __init__(self, folder: ScratchFolder, split: str, dtype):
        self.folder, self.split, self.itemsize = folder, split, np.dtype(dtype).itemsize
        self.names: list[str] = []
        self.n_tokens = 0
        self.file = None

    def write(self, tokens: bytes) -> None:
        data = memoryview(tokens).cast("B")
        while data:
            if self.n_tokens % SHARD_TOKENS == 0:  # the current shard is full, or there is none yet
                self.start_shard()
            room = (SHARD_TOKENS - self.n_tokens % SHARD_TOKENS) * self.itemsize
            self.file.write(data[:room])
            self.n_tokens += len(data[:room]) // self.itemsize
            data = data[room:]

    def start_shard(self) -> None:
        self.finish_shard()
        self.names.append(f"{self.split}_{len(self.names):03d}.bin")
        self.file = self.folder.new_file(self.names[-1])

    def finish_shard(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())  # as durable as the atomic writes of meta.json, which follow
            self.file.close()
            self.file = None

    def move_tail(self, cut: int, to: "ShardFiles") -> None:
        """Move the tokens from position `cut` on to the end of `to`, a shard at a time in
        bounded reads, truncating (or removing) this split's shards: the stream is unchanged."""
        self.finish_shard()
        kept = []
        for i, name in enumerate(self.names):
            keep = min(max(cut - i * SHARD_TOKENS, 0), SHARD_TOKENS) * self.itemsize
            with self.folder.update(name) as f:
                f.seek(keep)
                while chunk := f.read(self.COPY_TOKENS * self.itemsize):
                    to.write(chunk)
                f.truncate(keep)
            if keep:
                kept.append(name)
            else:
                self.folder.remove(name)
        self.names, self.n_tokens = kept, cut

    def close(self) -> list[str]:
        """The shard file names, every shard written and closed."""
        self.finish_shard()
        return self.names

    def remove(self) -> None:
        self.finish_shard()
        for name in self.names:
            self.folder.remove(name)
        self.names, self.n_tokens = [], 0


def read_shards(folder: Path, name: str, verified_by_peer: bool = False) -> Corpus:
    """The corpus in `folder`, every shard (and trained tokenizer) verified against the SHA-256
    meta.json recorded when it was written, unless `verified_by_peer`: another process of this
    node has just verified the same files (`headlab.training.trainer.prepared_corpus`)."""
    meta = json.loads(read_regular(folder / "meta.json"))
    if not verified_by_peer:
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
