"""Local document corpora as people download them (.parquet, .jsonl, .jsonl.gz, .jsonl.zst):
streamed, one end-of-text token per document, every 10th document validation, the same tokens
whatever the number of tokenizing processes, and trained on end to end."""

import gzip
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from headlab.cli.main import main
from headlab.data import encoding
from headlab.data.bpe import BPETokenizer
from headlab.data.corpus import load_corpus
from headlab.data.encoding import BATCH_BYTES
from headlab.data.tokenizers import ByteTokenizer
from headlab.training.config import train_preset
from headlab.training.trainer import repetition_note


def _documents(n: int, seed: int = 0) -> list[str]:
    generator = random.Random(seed)
    words = ["".join(generator.choices("abcdefghijklmnopé", k=generator.randint(2, 7))) for _ in range(400)]
    return [f"Document {i}. " + " ".join(generator.choices(words, k=generator.randint(100, 600))) for i in range(n)]


@pytest.fixture
def corpus_folder(tmp_path, monkeypatch):
    """1,500 documents (> 1 MiB: several tokenizing batches) in a parquet file and a .jsonl.gz."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    documents = _documents(1500)
    folder = tmp_path / "corpus"
    folder.mkdir()
    pq.write_table(pa.table({"id": list(range(1000)), "body": documents[:1000]}), folder / "part-0.parquet",
                   row_group_size=128)
    with gzip.open(folder / "part-1.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"body": text, "url": "x"}) + "\n" for text in documents[1000:])
    assert sum(len(d.encode()) for d in documents) > 2 * BATCH_BYTES
    return folder, documents


def test_documents_end_with_the_end_of_text_token_and_every_tenth_is_validation(corpus_folder):
    folder, documents = corpus_folder
    corpus = load_corpus(str(folder), "byte", workers=1, text_field="body")
    train, val = np.concatenate(corpus.train), np.concatenate(corpus.val)
    expected_val = [d for i, d in enumerate(documents) if i % 10 == 9]
    expected_train = [d for i, d in enumerate(documents) if i % 10 != 9]
    assert val.tobytes() == b"".join(d.encode() + b"\0" for d in expected_val)
    assert train.tobytes() == b"".join(d.encode() + b"\0" for d in expected_train)


@pytest.mark.parametrize("tokenizer", ["byte", "bpe:400"])
def test_the_tokens_do_not_depend_on_the_number_of_workers(corpus_folder, tmp_path, monkeypatch, tokenizer):
    folder, documents = corpus_folder
    shards = {}
    for workers in (1, 2):
        monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / f"cache-{workers}"))
        corpus = load_corpus(str(folder), tokenizer, workers=workers, text_field="body")
        shards[workers] = (np.concatenate(corpus.train), np.concatenate(corpus.val), corpus.sha256)
        end = corpus.tokenizer.end_of_text
        assert (shards[workers][0] == end).sum() + (shards[workers][1] == end).sum() == len(documents)
    assert np.array_equal(shards[1][0], shards[2][0]) and np.array_equal(shards[1][1], shards[2][1])
    assert shards[1][2] == shards[2][2]


def test_jsonl_zst_and_plain_jsonl_read_the_same_documents(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    lines = "".join(json.dumps({"text": d}) + "\n" for d in _documents(200))
    (tmp_path / "plain").mkdir(), (tmp_path / "zst").mkdir()
    (tmp_path / "plain" / "a.jsonl").write_text(lines, encoding="utf-8")
    (tmp_path / "zst" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    plain, packed = (load_corpus(str(tmp_path / kind), "byte", workers=1) for kind in ("plain", "zst"))
    assert plain.sha256 == packed.sha256 and plain.n_train_tokens > 0
    with pytest.raises(ValueError, match="has no text field 'body'"):
        load_corpus(str(tmp_path / "plain"), "byte", workers=1, text_field="body")


@pytest.mark.parametrize("pattern", ["corpus", "corpus/*.parquet"])
def test_a_document_corpus_trains_end_to_end(corpus_folder, tmp_path, capsys, pattern):
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--corpus", str(tmp_path / pattern), "--text-field", "body",
                 "--tokenizer", "bpe:400", "--steps", "4", "--eval-every", "2", "--no-progress", "--out",
                 str(out)]) == 0
    assert "final validation loss" in capsys.readouterr().out
    saved = json.loads((out / "config.json").read_text())["data"]
    assert saved["tokenizer"] == "bpe:400" and saved["name"] == str(tmp_path / pattern)


def test_a_budget_beyond_the_corpus_is_told_in_epochs(corpus_folder):
    folder, _ = corpus_folder
    corpus = load_corpus(str(folder), "byte", workers=1, text_field="body")
    config = train_preset("tiny", steps=100_000)
    note = repetition_note(config, 32, corpus)
    assert f"{100_000 * 8 * 32 / corpus.n_train_tokens:.1f} epochs" in note
    assert repetition_note(config.replace(steps=10), 32, corpus) is None


def test_worker_processes_start_only_for_a_tokenizer_that_gains_from_them(monkeypatch):
    """Byte tokens are a copy of the text: shipping it to workers costs more than encoding it."""
    started = []

    class RecordingPool(encoding.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            started.append(True)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(encoding, "ProcessPoolExecutor", RecordingPool)
    monkeypatch.setattr(encoding, "BATCH_BYTES", 64)
    texts = [f"document {i} " * 20 for i in range(40)]
    bpe = BPETokenizer.train(texts, 300, end_of_text=True)
    for tokenizer, expected in ((ByteTokenizer(), []), (bpe, [True])):
        started.clear()
        parallel = b"".join(tokens for tokens, _ in encoding.encode_texts(texts, tokenizer, workers=2, documents=True))
        assert started == expected
        assert parallel == b"".join(tokens for tokens, _ in encoding.encode_texts(texts, tokenizer, documents=True))
