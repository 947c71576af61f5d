"""A byte-level BPE tokenizer trained on the corpus itself, so every path works offline.

`tokenizer="bpe:<vocab size>"` in `load_corpus` trains one (Hugging Face `tokenizers`) on the
corpus's training split, saves it as `tokenizer.json` beside the token shards, and tokenizes
the corpus with it. It is byte-level (GPT-2's pre-tokenizer regex over bytes mapped to
printable characters), so every text round-trips exactly and no token is unknown.

Splits: the corpus is first cached as bytes (`tokenizer="byte"`), whose validation split is the
final 10 % of the UTF-8 bytes. The BPE is trained on that byte corpus's training split only (at
most `MAX_TRAINING_BYTES` of it), and the BPE corpus keeps the same cut, moved back to a
character boundary when it falls inside one, so no validation text is ever seen in training.
Training is deterministic: the same text and vocabulary size give the same merges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import tokenizers

from headlab.io import ScratchFolder

MIN_VOCAB = 256  # the byte alphabet
MAX_TRAINING_BYTES = 1 << 30  # the first GiB of the training split trains the merges
CHUNK_BYTES = 1 << 20
TOKENIZER_FILE = "tokenizer.json"
END_OF_TEXT = "<|endoftext|>"  # the token a BPE trained for a document corpus ends each document with


def parse_bpe_vocab(name: str) -> int:
    """The vocabulary size in a tokenizer name 'bpe:<vocab size>'."""
    size = name.removeprefix("bpe:")
    if not size.isdigit() or not MIN_VOCAB <= int(size) < 1 << 32:
        raise ValueError(f"tokenizer {name!r} is invalid: write bpe:<vocab size> with a vocab size of at least "
                         f"{MIN_VOCAB}, e.g. bpe:8192")
    return int(size)


class BPETokenizer:
    """Byte-level BPE with exactly `vocab_size` tokens (256 bytes + merges)."""

    encode_in_workers = True  # merging is compute: worker processes scale it over the cores

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.name = f"bpe:{self.vocab_size}"
        self.dtype = np.uint16 if self.vocab_size <= 1 << 16 else np.uint32
        self.end_of_text = tokenizer.token_to_id(END_OF_TEXT)  # None unless trained with it

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, end_of_text: bool = False) -> "BPETokenizer":
        """Learn merges on `texts` until the vocabulary holds `vocab_size` tokens (one of them
        END_OF_TEXT if `end_of_text`); refuses text too small to yield that many."""
        tk = tokenizers
        tokenizer = tk.Tokenizer(tk.models.BPE())
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                         special_tokens=[END_OF_TEXT] if end_of_text else [],
                                         initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        if tokenizer.get_vocab_size() != vocab_size:
            raise ValueError(f"tokenizer 'bpe:{vocab_size}': the training text yields only "
                             f"{tokenizer.get_vocab_size()} distinct tokens; choose a vocab size up to that")
        return cls(tokenizer)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(text).ids, dtype=self.dtype)

    def decode(self, tokens) -> str:
        return self._tokenizer.decode([int(t) for t in tokens])

    def to_json(self) -> str:
        """The tokenizer as a Hugging Face `tokenizer.json`."""
        return self._tokenizer.to_str()

    def save(self, folder: ScratchFolder) -> None:
        folder.write_bytes(TOKENIZER_FILE, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        try:
            return cls(tokenizers.Tokenizer.from_file(str(path)))
        except Exception as error:  # the tokenizers library raises its own Exception type
            raise ValueError(f"{path} is not a readable tokenizer.json: {error}") from error


def _start_of_last_character(data: bytes) -> int:
    """Index of the first byte of `data`'s last UTF-8 character (continuation bytes are 10xxxxxx)."""
    i = len(data) - 1
    while i > 0 and data[i] & 0xC0 == 0x80:
        i -= 1
    return i


def utf8_texts(pieces: Sequence, max_bytes: int | None = None) -> Iterator[str]:
    """Decode byte arrays as one UTF-8 stream in ~1 MiB texts, each ending at a line break (or,
    in a chunk without one, at a character boundary), so no character or line is split. With
    `max_bytes`, stop after the text that reaches it."""
    carry, written = b"", 0
    for piece in pieces:
        for start in range(0, len(piece), CHUNK_BYTES):
            data = carry + bytes(piece[start:start + CHUNK_BYTES])
            cut = data.rfind(b"\n") + 1 or _start_of_last_character(data)
            carry = data[cut:]
            if cut:
                yield data[:cut].decode("utf-8")
                written += cut
                if max_bytes is not None and written >= max_bytes:
                    return
    if carry:
        yield carry.decode("utf-8")


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` are an incomplete UTF-8 character (0 to 3)."""
    if not data:
        return 0
    start = _start_of_last_character(data)
    lead = data[start]
    length = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) - start if start + length > len(data) else 0


def split_at_character(train: list, val: list) -> tuple[list, list]:
    """The byte splits with the cut moved back to a character boundary: an incomplete
    character at the end of `train` moves to the start of `val`."""
    last = train[-1]
    tail = _incomplete_tail(bytes(last[-3:]))
    if not tail:
        return train, val
    return train[:-1] + [last[:len(last) - tail]], [last[len(last) - tail:]] + val
