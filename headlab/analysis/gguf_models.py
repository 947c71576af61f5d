"""GGUF checkpoints (`headlab.analysis.gguf_sources`) in the three views: their heads for the
weights view, and, for the forward-based views (input moments, attention maps), the `transformers`
base model of their Hugging Face layout, built from the config and tensors that
`headlab.analysis.gguf_layouts` derives from the file, and the file's own tokenizer.

    heads = gguf_heads(path)                  # ModelHeads, layers read (and dequantised) on demand
    model, model_type = gguf_model(path)      # transformers LlamaModel / Gemma3TextModel, eval mode
    tokenizer = gguf_tokenizer(path)          # transformers' tokenizer from the file's vocabulary

The model holds the weights dequantised to float32 (what `transformers` runs), so its forward
pass is that of the quantised checkpoint up to float32 rounding. Gemma 3's own forward pieces
(the embedding scaled by √d, the sandwich norms, GeGLU, query_pre_attn_scalar, local
sliding-window layers and global layers with their two RoPE bases) are those of transformers'
Gemma3TextModel, set from the config derived in `gguf_layouts`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from headlab.analysis.gguf_files import open_gguf
from headlab.analysis.gguf_layouts import hf_config, hf_tensors
from headlab.analysis.gguf_sources import gguf_path
from headlab.analysis.hf_layouts import from_hf
from headlab.analysis.hf_models import check_runnable, transformers_module
from headlab.analysis.layer_weights import ModelHeads


def gguf_label(path: Path) -> str:
    """A GGUF model's default label: its file name without .gguf (e.g. SmolLM2-135M-Instruct.Q4_1)."""
    return Path(path).name.removesuffix(".gguf")


def gguf_heads(source, label: str | None = None) -> ModelHeads:
    """The heads of the GGUF checkpoint `source` names, through its Hugging Face layout."""
    path = gguf_path(source)
    checkpoint = open_gguf(path)
    named = Path(source) if Path(source).suffix == ".gguf" else path  # not its blob, in a Hub cache
    return from_hf(hf_config(checkpoint), hf_tensors(checkpoint), label or gguf_label(named))


def _model_config(config: dict):
    transformers = transformers_module()
    settings = {key: value for key, value in config.items() if key != "model_type"}
    return transformers.AutoConfig.for_model(config["model_type"], **settings)


@functools.lru_cache(maxsize=1)
def _built(path: str, modified: int) -> torch.nn.Module:
    checkpoint = open_gguf(path)
    config = hf_config(checkpoint)
    check_runnable(config["model_type"], "forward passes")
    model = transformers_module().AutoModel.from_config(_model_config(config))
    tensors = hf_tensors(checkpoint)
    with torch.no_grad():
        for name, parameter in model.state_dict().items():  # a tensor the file lacks: the line naming it
            value = tensors.native(name)  # F32 tensors are read-only views of the file: copied
            value = torch.from_numpy(value if value.flags.writeable else value.copy())
            if tuple(value.shape) != tuple(parameter.shape):
                raise ValueError(f"{path}: tensor {name} has shape {tuple(value.shape)}, but the metadata gives the "
                                 f"model {tuple(parameter.shape)}: the metadata does not describe these weights")
            parameter.copy_(value)
    return model.eval()


def gguf_model(source) -> tuple[torch.nn.Module, str]:
    """The `transformers` base model (no LM head) of the GGUF checkpoint `source` names, in eval
    mode, and its model_type; built once per process for the last file asked for."""
    path = gguf_path(source)
    return _built(str(path), path.stat().st_mtime_ns), hf_config(open_gguf(path))["model_type"]


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str, modified: int):
    path = Path(path)
    return transformers_module().AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def gguf_tokenizer(source) -> tuple[object, int | None]:
    """The tokenizer stored in the GGUF checkpoint `source` names, as `transformers` rebuilds it
    from the file's vocabulary (tokenizer.ggml.*), and the token llama.cpp starts a text with:
    the BOS where tokenizer.ggml.add_bos_token says so (absent: as llama.cpp defaults, yes for
    SentencePiece vocabularies, no for byte-level BPE), else None."""
    path = gguf_path(source)
    checkpoint = open_gguf(path)
    metadata = checkpoint.metadata
    if "tokenizer.ggml.tokens" not in checkpoint.array_lengths and "tokenizer.ggml.tokens" not in metadata:
        raise ValueError(f"{path} holds no tokenizer (tokenizer.ggml.tokens): headlab cannot encode text for it")
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", metadata.get("tokenizer.ggml.model") == "llama")
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return _tokenizer(str(path), path.stat().st_mtime_ns), bos if add_bos else None
