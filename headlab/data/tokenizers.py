"""Tokenizers by name: `byte` (UTF-8 bytes), `gpt2` (tiktoken) and `bpe:<vocab size>` (trained on
the corpus, `headlab.data.bpe`), each with `encode`, `decode`, `vocab_size` and the shard `dtype`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headlab.data.bpe import TOKENIZER_FILE, BPETokenizer, parse_bpe_vocab

PADDED_GPT2_VOCAB = 50304  # 50257 rounded up to a multiple of 64, as in the paper
TOKENIZERS = ("byte", "gpt2", "bpe:<vocab size>")


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, lossless, one token per byte."""

    name = "byte"
    vocab_size = 256
    dtype = np.uint8
    end_of_text = 0  # NUL: no room for a token beyond the bytes, and text never holds it
    encode_in_workers = False  # a copy of the UTF-8 bytes: shipping text to a worker costs more than encoding it

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2 BPE through tiktoken; the model's vocabulary is padded to 50304 (unused ids)."""

    name = "gpt2"
    vocab_size = PADDED_GPT2_VOCAB
    dtype = np.uint16
    encode_in_workers = True

    def __init__(self):
        try:
            import tiktoken
        except ImportError as error:
            raise RuntimeError("tokenizer 'gpt2' needs tiktoken: pip install 'headlab[hf]'") from error
        try:
            self._encoding = tiktoken.get_encoding("gpt2")
        except Exception as error:
            raise RuntimeError(
                "tokenizer 'gpt2': tiktoken could not get the GPT-2 BPE files (it downloads them once "
                "and caches them in $TIKTOKEN_CACHE_DIR). Connect once or copy that cache here, or use "
                f"tokenizer='byte'. Cause: {type(error).__name__}: {str(error)[:200]}") from error

    @property
    def end_of_text(self) -> int:
        return self._encoding.eot_token  # <|endoftext|>, 50256

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._encoding.encode_ordinary(text), dtype=np.uint16)

    def decode(self, tokens) -> str:
        return self._encoding.decode([int(t) for t in tokens])


def get_tokenizer(name: str, folder: Path | None = None):
    """The tokenizer `name`; a trained 'bpe:<vocab>' is read from `folder`/tokenizer.json."""
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    if name.startswith("bpe:"):
        if folder is None:
            raise ValueError(f"tokenizer {name!r} is trained on a corpus: use load_corpus(..., tokenizer={name!r})")
        tokenizer = BPETokenizer.load(folder / TOKENIZER_FILE)
        if tokenizer.vocab_size != parse_bpe_vocab(name):
            raise ValueError(f"{folder / TOKENIZER_FILE} holds {tokenizer.vocab_size} tokens, not {name!r}")
        return tokenizer
    raise ValueError(f"tokenizer {name!r} is unknown: allowed values are {', '.join(TOKENIZERS)}")


def tokenizer_vocab_size(name: str) -> int:
    """The vocabulary size a model needs for tokenizer `name`, without building it."""
    if name.startswith("bpe:"):
        return parse_bpe_vocab(name)
    if name not in TOKENIZERS:
        raise ValueError(f"tokenizer {name!r} is unknown: allowed values are {', '.join(TOKENIZERS)}")
    return {"byte": ByteTokenizer.vocab_size, "gpt2": GPT2Tokenizer.vocab_size}[name]
