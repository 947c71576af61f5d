"""The data layer: tokenizers, raw text sources, token shards and tokenized corpora (cached)."""

from headlab.data.corpus import load_corpus
from headlab.data.shards import Corpus, random_windows
from headlab.data.sources import cache_dir, synthetic_texts
from headlab.data.tokenizers import PADDED_GPT2_VOCAB, ByteTokenizer, get_tokenizer, tokenizer_vocab_size

__all__ = ["ByteTokenizer", "Corpus", "PADDED_GPT2_VOCAB", "cache_dir", "get_tokenizer", "load_corpus",
           "random_windows", "synthetic_texts", "tokenizer_vocab_size"]
