"""The data layer: tokenizers, raw text sources, token shards and tokenized corpora (cached)."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.data.corpus": ("load_corpus",),
    "headlab.data.shards": ("Corpus", "random_windows"),
    "headlab.data.sources": ("cache_dir", "synthetic_texts"),
    "headlab.data.tokenizers": ("PADDED_GPT2_VOCAB", "ByteTokenizer", "get_tokenizer", "tokenizer_vocab_size"),
})
