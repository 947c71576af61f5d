"""The byte-level BPE trained on the corpus: lossless, exact vocabulary, deterministic, cached by
vocabulary size and training text, trained on the training split only."""

import numpy as np
import pytest

from headlab import data
from headlab.data import sources
from headlab.data.bpe import BPETokenizer, split_at_character, utf8_texts
from headlab.data.corpus import load_corpus
from headlab.io import ScratchFolder

TEXTS = ["To be, or not to be: that is the question.\n", "Wherefore art thou Roméo? — Ü 你好\n"] * 50


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_bpe_round_trips_any_text_with_exactly_the_chosen_vocabulary(tmp_path):
    tokenizer = BPETokenizer.train(TEXTS, 300)
    assert tokenizer.vocab_size == 300 and tokenizer.name == "bpe:300" and tokenizer.dtype == np.uint16
    unseen = "Émoji 🙂, tabs\tand  double  spaces,\n\nnew lines — and Ω."
    for text in (TEXTS[1], unseen):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text and ids.max() < 300
    assert len(tokenizer.encode(TEXTS[0])) < len(TEXTS[0]) / 2  # merges learned from the text
    with ScratchFolder(tmp_path / "bpe") as folder:
        tokenizer.save(folder)
    reloaded = BPETokenizer.load(tmp_path / "bpe" / "tokenizer.json")
    assert reloaded.vocab_size == 300 and np.array_equal(reloaded.encode(unseen), tokenizer.encode(unseen))
    with pytest.raises(ValueError, match="the training text yields only .* distinct tokens"):
        BPETokenizer.train(TEXTS, 5000)


def test_bpe_training_is_deterministic():
    texts = list(data.synthetic_texts(n_chars=20_000))  # many merges tie in count
    assert BPETokenizer.train(texts, 600).to_json() == BPETokenizer.train(iter(texts), 600).to_json()


def test_utf8_stream_is_cut_only_between_characters():
    text = "ab\ncdé" * 3 + "中文" * 700_000  # past one 1 MiB chunk, with no line break after the first
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    pieces = [raw[:6], raw[6:8], raw[8:]]  # "ab\ncd" and the first byte of "é", then the rest
    assert "".join(utf8_texts(pieces)) == text
    train, val = split_at_character([raw[:6]], [raw[6:]])  # a cut inside "é"
    assert bytes(train[0]).decode() == "ab\ncd" and bytes(np.concatenate(val)).decode() == text[5:]


def test_bpe_corpus_keeps_the_byte_split_and_is_cached_by_vocab_and_text(isolated_cache):
    corpus = load_corpus("synthetic", tokenizer="bpe:400", n_chars=20_000)
    assert corpus.vocab_size == 400 and corpus.tokenizer_name == "bpe:400"
    assert (corpus.folder / "tokenizer.json").exists()
    tokenizer = corpus.tokenizer
    text = "".join(data.synthetic_texts(n_chars=20_000))
    train_text = tokenizer.decode(np.concatenate(corpus.train))
    assert train_text + tokenizer.decode(np.concatenate(corpus.val)) == text
    byte_corpus = load_corpus("synthetic", n_chars=20_000)  # built on the way, shares its cut
    assert train_text.encode() == bytes(np.concatenate(byte_corpus.train))
    trained_on_train_split = BPETokenizer.train(utf8_texts(byte_corpus.train), 400)  # never on validation
    assert np.array_equal(trained_on_train_split.encode(text), tokenizer.encode(text))
    assert corpus.bytes_per_token == pytest.approx(len(text.encode()) / (corpus.n_train_tokens + corpus.n_val_tokens))

    other_vocab = load_corpus("synthetic", tokenizer="bpe:380", n_chars=20_000)
    other_text = load_corpus("synthetic", tokenizer="bpe:400", n_chars=20_000, seed=1)
    folders = {corpus.folder, other_vocab.folder, other_text.folder}
    assert len(folders) == 3 and all("bpe" in f.name for f in folders)
    assert (other_text.folder / "tokenizer.json").read_bytes() != (corpus.folder / "tokenizer.json").read_bytes()
    again = load_corpus("synthetic", tokenizer="bpe:400", n_chars=20_000)
    assert again.folder == corpus.folder and np.array_equal(again.train[0], corpus.train[0])


def test_bad_bpe_names_are_refused_in_one_line(isolated_cache):
    for name in ("bpe:12", "bpe:many"):
        with pytest.raises(ValueError, match=f"tokenizer '{name}' is invalid: write bpe:<vocab size>"):
            load_corpus("synthetic", tokenizer=name, n_chars=20_000)
    with pytest.raises(ValueError, match="is trained on a corpus"):
        data.get_tokenizer("bpe:400")
