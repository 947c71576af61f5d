"""A GGUF file as the Hugging Face checkpoint it was converted from: llama.cpp's converter
(convert_hf_to_gguf.py) renames the tensors, reorders rows and offsets norm gains, and this module
undoes each step, so the three views of a GGUF model are those of its Hugging Face layout
(`headlab.analysis.hf_layouts`) and its forward pass is that of `transformers`
(`headlab.analysis.gguf_models`).

    checkpoint = open_gguf(path)
    config = hf_config(checkpoint)         # config.json's keys, from the GGUF metadata
    tensors = hf_tensors(checkpoint)       # a TensorStore under Hugging Face names, read lazily

What the converter did, per architecture (general.architecture):

  llama    (Llama, SmolLM, Mistral-style)  W_Q's and W_K's rows are permuted within each head,
           from Hugging Face's rotate-half RoPE order (pairs (i, i + e/2)) to llama.cpp's
           interleaved order (pairs (2i, 2i + 1)): rows (h, s, i) -> (h, i, s) for s in {0, 1},
           i < e/2, over n_head heads for W_Q and n_head_kv KV heads for W_K. Undone here with
           the same head counts. The permutation acts alike on a head's query and key rows, so
           A_h = W_Q,hᵀ W_K,g(h) does not change; the forward pass needs the pairs back.
  gemma3   (Gemma 3 text)  no row permutation (llama.cpp runs Gemma with rotate-half RoPE); every
           RMSNorm gain (names ending in norm.weight: the block's four sandwich norms, the
           per-head QK-norms, the final norm) is stored as 1 + w, where Hugging Face stores w and
           computes x ⊙ (1 + w): 1 is subtracted here, in float64. MQA or GQA with head_dim =
           attention.key_length (256), the QK-norm gains folded into A_h as for Qwen3.
           What GGUF does not store is taken as llama.cpp takes it: every 6th layer global (the
           others sliding-window local, window attention.sliding_window), the local layers' RoPE
           base 10 000 (rope.freq_base_swa where the file has one), the global layers'
           rope.freq_base, and queries scaled by 1/√head_dim, or 1/√(d/H) for the 62-layer 27B.

An architecture not listed, a per-layer head count, or a tensor that is missing is one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from headlab.analysis.gguf_files import GGUFCheckpoint
from headlab.analysis.tensors import TensorStore

# GGUF's per-block tensor names -> Hugging Face's (under layers.<i>.)
_ATTENTION = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj"}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


@dataclass(frozen=True)
class GGUFArchitecture:
    """How llama.cpp's converter wrote one architecture: the Hugging Face model_type it came
    from, its block tensors' Hugging Face names, whether W_Q / W_K rows were permuted, and what
    was added to every norm gain."""

    model_type: str
    block_names: dict[str, str]
    permuted_qk: bool
    norm_offset: float


ARCHITECTURES = {
    "llama": GGUFArchitecture("llama", {**_ATTENTION, **_MLP, "attn_norm": "input_layernorm",
                                        "ffn_norm": "post_attention_layernorm"}, permuted_qk=True, norm_offset=0.0),
    "gemma3": GGUFArchitecture("gemma3_text", {**_ATTENTION, **_MLP, "attn_norm": "input_layernorm",
                                               "post_attention_norm": "post_attention_layernorm",
                                               "ffn_norm": "pre_feedforward_layernorm",
                                               "post_ffw_norm": "post_feedforward_layernorm",
                                               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
                               permuted_qk=False, norm_offset=1.0),
}
_TOP_LEVEL = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight"}
_IGNORED = {"output.weight"}  # the LM head: the views read the base model (no head), as for checkpoint folders
GEMMA3_GLOBAL_EVERY = 6  # llama.cpp's swa pattern for gemma3: layers 5, 11, 17, ... attend globally
GEMMA3_LOCAL_ROPE_BASE = 10_000.0
GEMMA3_27B_LAYERS = 62
SUPPORTED_ARCHITECTURES = ", ".join(sorted(ARCHITECTURES))


def architecture_of(checkpoint: GGUFCheckpoint) -> GGUFArchitecture:
    if checkpoint.architecture not in ARCHITECTURES:
        raise ValueError(f"{checkpoint.path}: GGUF architecture {checkpoint.architecture!r} is not supported: "
                         f"headlab reads GGUF architectures {SUPPORTED_ARCHITECTURES}")
    return ARCHITECTURES[checkpoint.architecture]


def _count(checkpoint: GGUFCheckpoint, key: str, default=None) -> int:
    value = checkpoint.value(key, default) if default is not None else checkpoint.required(key)
    if isinstance(value, list):
        raise ValueError(f"{checkpoint.path}: {checkpoint.architecture}.{key} differs between layers ({value[:4]}...): "
                         "headlab reads models whose layers all have one shape")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{checkpoint.path}: {checkpoint.architecture}.{key} = {value!r} is invalid: must be a "
                         "positive integer")
    return value


def hf_config(checkpoint: GGUFCheckpoint) -> dict:
    """The Hugging Face config.json (as a dict) the file was converted from, from its metadata."""
    arch = architecture_of(checkpoint)
    n_heads = _count(checkpoint, "attention.head_count")
    d_model = _count(checkpoint, "embedding_length")
    head_dim = _count(checkpoint, "attention.key_length", d_model // n_heads)
    n_layers = _count(checkpoint, "block_count")
    embedding = checkpoint.tensors.get("token_embd.weight")
    if embedding is None:
        raise ValueError(f"{checkpoint.path} has no tensor 'token_embd.weight': not a complete language model file")
    config = {
        "model_type": arch.model_type, "num_hidden_layers": n_layers, "num_attention_heads": n_heads,
        "num_key_value_heads": _count(checkpoint, "attention.head_count_kv", n_heads), "hidden_size": d_model,
        "head_dim": head_dim, "intermediate_size": _count(checkpoint, "feed_forward_length"),
        "vocab_size": embedding.shape[0],
        "rms_norm_eps": float(checkpoint.required("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(checkpoint.value("rope.freq_base", 10_000.0)),
        "max_position_embeddings": _count(checkpoint, "context_length", 2048),
        "tie_word_embeddings": "output.weight" not in checkpoint.tensors, "attention_bias": False,
    }
    if checkpoint.architecture == "gemma3":
        pattern = [(i + 1) % GEMMA3_GLOBAL_EVERY == 0 for i in range(n_layers)]
        config.update(
            sliding_window=_count(checkpoint, "attention.sliding_window"),
            layer_types=["full_attention" if is_global else "sliding_attention" for is_global in pattern],
            sliding_window_pattern=GEMMA3_GLOBAL_EVERY,
            rope_local_base_freq=float(checkpoint.value("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
            query_pre_attn_scalar=d_model // n_heads if n_layers == GEMMA3_27B_LAYERS else head_dim,
            final_logit_softcapping=checkpoint.value("final_logit_softcapping"),
            attn_logit_softcapping=checkpoint.value("attn_logit_softcapping"),
            hidden_activation="gelu_pytorch_tanh")
    return config


def unpermute_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's interleaved-pair row order back to Hugging Face's rotate-half order: within
    each of `n_heads` blocks of e rows, row 2i + s goes to row s·e/2 + i (s ∈ {0, 1}); the
    inverse of the converter's `permute`."""
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of an even width: cannot undo llama.cpp's "
                         "RoPE row order")
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_names(checkpoint: GGUFCheckpoint) -> dict[str, str]:
    """Hugging Face name -> GGUF name of every tensor the base model reads, those the file lacks
    included (reading one is then the line naming it); a tensor of another kind (a RoPE frequency
    table, a vision tower) or of a block beyond block_count is refused in one line."""
    arch = architecture_of(checkpoint)
    n_layers = _count(checkpoint, "block_count")
    expected = {hf: gguf for gguf, hf in _TOP_LEVEL.items()}
    for layer in range(n_layers):
        expected.update({f"layers.{layer}.{hf}.weight": f"blk.{layer}.{gguf}.weight"
                         for gguf, hf in arch.block_names.items()})
    known = set(expected.values()) | _IGNORED
    for name in checkpoint.tensors:
        if name not in known:
            block = re.fullmatch(r"blk\.(\d+)\..*", name)
            why = (f"the metadata says {n_layers} blocks" if block and int(block.group(1)) >= n_layers else
                   "a variant it does not read: RoPE scaling tables, biases, other towers")
            raise ValueError(f"{checkpoint.path}: tensor {name} has no place in headlab's {checkpoint.architecture} "
                             f"layout ({why})")
    return expected


def hf_tensors(checkpoint: GGUFCheckpoint) -> TensorStore:
    """The file's tensors under their Hugging Face names, in Hugging Face row order and norm
    convention (see the module docstring), read one at a time when asked for: float32 for the
    weight matrices, float64 for the norm gains (whose offset is undone exactly)."""
    arch = architecture_of(checkpoint)
    config = hf_config(checkpoint)
    names = hf_names(checkpoint)
    heads = {"self_attn.q_proj": config["num_attention_heads"], "self_attn.k_proj": config["num_key_value_heads"]}

    def read(hf_name: str) -> np.ndarray:
        array = checkpoint.tensor(names[hf_name])
        if hf_name.endswith("norm.weight"):
            return array.astype(np.float64) - arch.norm_offset
        module = hf_name.split(".", 2)[-1].rsplit(".", 1)[0]
        if arch.permuted_qk and module in heads:
            return unpermute_rows(array, heads[module])
        return array

    return TensorStore(names, read, str(checkpoint.path))
