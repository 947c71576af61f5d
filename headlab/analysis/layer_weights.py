"""One layer's attention weights per family, as the factors of every head's bilinear form, and a
model's heads: each layer's weights read on demand.

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
    bilinear form can hold it. `analysis.qk_norm.norm_scale_effect` measures both on real text.
  * Biases (BERT, GPT-2, Qwen2, optional in DeepSeek) add terms linear in x or y, not bilinear.
  * Constant scales (1/√e, MLA's 1/√(d_h + d_R), DeepSeek's YaRN mscale) are the same for all heads.

Heads are numbered from 0, like layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from headlab.analysis.gram import Factors
from headlab.schema import CIRCUITS, FAMILIES, MLA_ROPE, check


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
        query_matrix, query_base = self._queries()
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

    def rope_factors(self) -> tuple[Factors, Factors]:
        """The (L, R) factors of the decoupled RoPE part of each head's QK form, A_h^RoPE =
        W^QR_h W_krᵀ (each head's last d_R query columns, and the RoPE key that all heads share):
        exactly A_h with mla_rope "included" minus A_h with "excluded"."""
        h, d_c = self.n_heads, self.kv_gain.size
        d_rope = self.wkv_a.shape[0] - d_c
        query_matrix, query_base = self._queries()
        e = query_matrix.shape[1] // h
        rope = query_matrix.reshape(query_matrix.shape[0], h, e)[:, :, e - d_rope:].reshape(-1, h * d_rope)
        return (Factors.per_head(rope, d_rope, base=query_base),
                Factors.grouped(self.wkv_a[d_c:].T, d_rope, n_heads=h))

    def _queries(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Every head's query columns [nope | rope] (m, H·(d_n + d_R)) and the base they act
        through: None for uncompressed queries, else W_dq diag(γ_q) (d × d_c')."""
        if self.wq is not None:
            return self.wq.T, None
        return self.wq_b.T, self.wq_a.T * self.q_gain


LayerWeights = Union[GroupedWeights, LRKVWeights, MLAWeights]



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


