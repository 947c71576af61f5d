"""Hugging Face checkpoints run forward with `transformers` (imported only when one is run): the
model, the modules whose inputs each layer's attention reads (`headlab.analysis.inputs`), and each
layer's attention maps (`headlab.analysis.attention_maps`), for every layout of
`headlab.analysis.hf_layouts`."""

from __future__ import annotations

from pathlib import Path

import torch

from headlab.analysis.hf_layouts import HF_ATTENTION_INPUTS


def check_runnable(model_type: str, what: str) -> None:
    """Refuse, in one line, a checkpoint whose layout headlab cannot run forward."""
    if model_type not in HF_ATTENTION_INPUTS:
        raise ValueError(f"{what} of model_type = {model_type!r} are not supported: headlab runs the forward pass of "
                         f"headlab models and of model_type {', '.join(sorted(HF_ATTENTION_INPUTS))}")


def transformers_module():
    try:
        import transformers
    except ImportError as error:
        raise RuntimeError("running Hugging Face checkpoints needs transformers: pip install 'headlab[hf]'") from error
    return transformers


def load_hf_model(folder: Path, model_type: str, what: str) -> torch.nn.Module:
    """The checkpoint in `folder` as a `transformers` base model (no head), in eval mode."""
    check_runnable(model_type, what)
    return transformers_module().AutoModel.from_pretrained(str(folder)).eval()


def attention_input_modules(model: torch.nn.Module, model_type: str) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """Per layer, the modules whose first input is what the query side and the key side read."""
    layers, query, key = HF_ATTENTION_INPUTS[model_type]
    alternatives = (query,) if isinstance(query, str) else query

    def first_present(layer: torch.nn.Module) -> torch.nn.Module:
        for path in alternatives:
            try:
                return layer.get_submodule(path)
            except AttributeError:
                continue
        raise ValueError(f"this {model_type} model has none of the query-side modules {', '.join(alternatives)}")
    return [(first_present(layer), layer.get_submodule(key)) for layer in model.get_submodule(layers)]


def hf_attention_maps(model: torch.nn.Module, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention maps (B, H, T, T), rows summing to 1, of a model from `load_hf_model`
    reading `tokens` (B, T): the probabilities the model itself computes (masks, RoPE and biases
    included), returned by `output_attentions=True`, which needs the eager attention
    implementation (fused kernels never form the maps): the model is switched to it."""
    model.set_attn_implementation("eager")
    device = next(model.parameters()).device
    return list(model(torch.as_tensor(tokens).long().to(device), output_attentions=True).attentions)
