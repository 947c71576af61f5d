"""The five attention families. `build_attention(config)` picks one by `config.attention`."""

from headlab.model.attention.common import (
    AttentionCore,
    KVCache,
    LayerCache,
    apply_rope,
    attend,
    attention_backend,
    rope_tables,
)
from headlab.model.attention.grouped import GroupedQueryAttention
from headlab.model.attention.lrkv import LowRankKVAttention
from headlab.model.attention.mla import MultiHeadLatentAttention
from headlab.model.config import ModelConfig

ATTENTION_CLASSES = {
    "mha": GroupedQueryAttention,
    "mqa": GroupedQueryAttention,
    "gqa": GroupedQueryAttention,
    "lrkv": LowRankKVAttention,
    "mla": MultiHeadLatentAttention,
}


def build_attention(config: ModelConfig):
    return ATTENTION_CLASSES[config.attention](config)


__all__ = [
    "ATTENTION_CLASSES", "AttentionCore", "GroupedQueryAttention", "KVCache", "LayerCache", "LowRankKVAttention",
    "MultiHeadLatentAttention", "apply_rope", "attend", "attention_backend", "build_attention",
    "rope_tables",
]
