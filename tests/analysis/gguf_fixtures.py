"""Small GGUF files the tests write themselves (gguf.GGUFWriter), from tiny random `transformers`
models, converted the way llama.cpp's convert_hf_to_gguf.py converts them: tensor names, W_Q / W_K
rows permuted to interleaved RoPE pairs (llama), every norm gain stored as 1 + w (Gemma 3). And
the independent float64 recomputation of a layer's head similarity from explicit d × d forms."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

HIDDEN = 64  # a multiple of 32, the block length of Q8_0 and Q4_0
LLAMA = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=HIDDEN, head_dim=16,
             intermediate_size=96, vocab_size=300, rms_norm_eps=1e-6, rope_theta=50_000.0,
             max_position_embeddings=256, tie_word_embeddings=True)
# six layers so that layer 5 is global and the others local (llama.cpp's pattern), a window shorter than the test's
# sequences, and the RoPE bases llama.cpp assumes (local 10 000, global from the file)
GEMMA3 = dict(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, hidden_size=HIDDEN, head_dim=32,
              intermediate_size=96, vocab_size=300, rms_norm_eps=1e-6, max_position_embeddings=256,
              sliding_window=4, query_pre_attn_scalar=32, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
              sliding_window_pattern=6, tie_word_embeddings=True,
              layer_types=["sliding_attention"] * 5 + ["full_attention"])
BLOCK_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm"}
LLAMA_NAMES = {**BLOCK_NAMES, "post_attention_layernorm": "ffn_norm"}
GEMMA3_NAMES = {**BLOCK_NAMES, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
                "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def random_model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A tiny `transformers` base model (LlamaModel or Gemma3TextModel) with every weight, norm
    gains included, perturbed away from its initialisation, in float64."""
    torch.manual_seed(seed)
    config = (transformers.LlamaConfig(**LLAMA) if kind == "llama" else transformers.Gemma3TextConfig(**GEMMA3))
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model.double().eval()


def llama_cpp_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half pairs to interleaved pairs."""
    return (weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_tensors(model: torch.nn.Module, kind: str) -> dict[str, np.ndarray]:
    """The model's state dict under GGUF names, as llama.cpp's converter writes it (float32)."""
    config = model.config
    names = LLAMA_NAMES if kind == "llama" else GEMMA3_NAMES
    out = {}
    for name, value in model.state_dict().items():
        array = value.double().numpy()
        if kind == "gemma3" and name.endswith("norm.weight"):
            array = array + 1.0
        if name == "embed_tokens.weight":
            out["token_embd.weight"] = array
        elif name == "norm.weight":
            out["output_norm.weight"] = array
        else:
            _, layer, rest = name.split(".", 2)  # layers.<i>.<module>.weight
            module = rest.rsplit(".", 1)[0]
            if kind == "llama" and module == "self_attn.q_proj":
                array = llama_cpp_permute(array, config.num_attention_heads)
            if kind == "llama" and module == "self_attn.k_proj":
                array = llama_cpp_permute(array, config.num_key_value_heads)
            out[f"blk.{layer}.{names[module]}.weight"] = array
    return {name: array.astype(np.float32) for name, array in out.items()}


def write_gguf(path: Path, model: torch.nn.Module, kind: str, quantised: dict | None = None,
               architecture: str | None = None, leave_out: tuple[str, ...] = (),
               vocabulary: dict | None = None) -> Path:
    """Write `model` as a GGUF file: metadata as llama.cpp writes it for the architecture, the
    tensors named in `quantised` (GGUF name -> type) quantised with gguf.quants, the others F32;
    `leave_out` drops tensors, `architecture` overrides general.architecture, `vocabulary`
    (tokens, merges) adds a byte-level BPE tokenizer."""
    config = model.config
    arch = architecture or kind
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    if kind == "llama":
        writer.add_rope_freq_base(LLAMA["rope_theta"])
        writer.add_rope_dimension_count(config.head_dim)
    else:
        writer.add_rope_freq_base(GEMMA3["rope_theta"])
        writer.add_sliding_window(config.sliding_window)
    if vocabulary is not None:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(vocabulary["tokens"])
        writer.add_token_merges(vocabulary["merges"])
        writer.add_token_types([gguf.TokenType.NORMAL] * len(vocabulary["tokens"]))
        writer.add_bos_token_id(vocabulary["bos"])
        writer.add_eos_token_id(vocabulary["bos"])
    for name, array in gguf_tensors(model, kind).items():
        if name in leave_out:
            continue
        if name in (quantised or {}):
            qtype = quantised[name]
            try:
                data = gguf.quants.quantize(array, qtype)
            except NotImplementedError:  # a type gguf cannot write (nor read): zero bytes of its size
                data = np.zeros(gguf.quant_shape_to_byte_shape(array.shape, qtype), dtype=np.uint8)
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def head_forms(wq: np.ndarray, wk: np.ndarray, n_heads: int, n_kv: int, q_gain=None, k_gain=None) -> np.ndarray:
    """Every head's explicit d × d QK form A_h = W_Q,hᵀ diag(γ_q ⊙ γ_k) W_K,g(h) (float64), from
    PyTorch-layout (out, in) weights: (H, d, d). Built here, never in the library."""
    e = wq.shape[0] // n_heads
    gain = np.ones(e) if q_gain is None else np.asarray(q_gain) * np.asarray(k_gain)
    group = n_heads // n_kv
    return np.stack([wq[h * e:(h + 1) * e].T @ (gain[:, None] * wk[(h // group) * e:(h // group + 1) * e])
                     for h in range(n_heads)])


def form_spectrum(forms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cosine similarity of flattened forms and its uncentered eigenvalues, largest first."""
    flat = forms.reshape(len(forms), -1)
    unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    similarity = unit @ unit.T
    return similarity, np.linalg.eigvalsh(similarity)[::-1]


def layer_forms(state: dict, config: dict, layer: int, gain_offset: float = 0.0) -> np.ndarray:
    """`head_forms` of one layer of a Hugging Face-layout state dict (float64 arrays)."""
    p = f"layers.{layer}.self_attn."
    gains = {}
    if p + "q_norm.weight" in state:
        gains = dict(q_gain=gain_offset + state[p + "q_norm.weight"], k_gain=gain_offset + state[p + "k_norm.weight"])
    return head_forms(state[p + "q_proj.weight"], state[p + "k_proj.weight"], config["num_attention_heads"],
                      config["num_key_value_heads"], **gains)
