"""The five attention families. `build_attention(config)` picks one by `config.attention`."""

from ..config import ModelConfig
from .common import KVCache, LayerCache, apply_rope, attend, attention_backend, rope_tables
from .grouped import GroupedQueryAttention
from .lrkv import LowRankKVAttention
from .mla import MultiHeadLatentAttention

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
    "ATTENTION_CLASSES", "GroupedQueryAttention", "KVCache", "LayerCache", "LowRankKVAttention",
    "MultiHeadLatentAttention", "apply_rope", "attend", "attention_backend", "build_attention",
    "rope_tables",
]
