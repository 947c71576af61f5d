"""QK-norm's 1/rms: what treating it as 1 leaves out. A_h (`headlab.analysis.layer_weights`) drops
QK-norm's per-head, per-token scale; `norm_scale_effect` measures how far putting it back moves
the effective rank."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from headlab.analysis.gram import normalised_gram
from headlab.analysis.heads import load_heads
from headlab.analysis.inputs import run_forward
from headlab.analysis.spectrum import cosine_similarity, similarity_spectrum
from headlab.model.gpt import eval_mode
from headlab.model.ops import QK_NORM_EPS
from headlab.schema import KINDS

NORM_MEASURES = ("weights", "weights, median 1/rms per head", "token scores", "token scores with 1/rms")


@torch.no_grad()
def norm_scale_effect(model, tokens: torch.Tensor, label: str | None = None) -> pd.DataFrame:
    """How far QK-norm's per-head, per-token 1/rms moves the effective rank, on `tokens` (B, T).

    A_h treats 1/rms as 1 (see `headlab.analysis.layer_weights`); the model scores xᵀ A_h y · a_h(x) b_h(y) with
    a_h(x) = 1/rms(x W_Q,h), b_h(y) = 1/rms(y W_K,h), x and y the attention inputs. Per layer
    and kind, the effective rank (% of H) of four similarity matrices:

      weights                          cos⟨A_i, A_j⟩_F, as `analyze` computes it
      weights, median 1/rms per head   A_h · median_x a_h(x) · median_y b_h(y) (a constant per head)
      token scores                     cosine of the heads' score vectors s_h = (xᵀ A_h y) over all
                                       pairs (x, y) of positions in one window
      token scores with 1/rms          the same with s_h = (xᵀ A_h y · a_h(x) b_h(y)): the model's
                                       pre-softmax scores at RoPE offset 0

    The first two agree exactly (a constant per head cancels in a cosine); the last two differ
    only by the token-dependent part of 1/rms. Columns: model, layer, kind, measure,
    effective_rank_pct_of_heads, median_inv_rms_min, median_inv_rms_max (over heads, queries and keys).
    """
    config = getattr(model, "config", None)
    if not getattr(config, "qk_norm", False):
        raise ValueError(f"norm_scale_effect needs a headlab GPT with QK-norm; "
                         f"{getattr(config, 'label', type(model).__name__)} has none")
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0].detach()))
             for block in model.blocks]
    try:
        with eval_mode(model):
            run_forward(model, tokens)
    finally:
        for hook in hooks:
            hook.remove()
    heads = load_heads(model, label)
    rows = []
    for layer, x in enumerate(inputs):
        left, right = heads.layer(layer).factors("qk")
        x = x.double()  # (B, T, d), where the model ran: the score arrays below are B·H·T² numbers
        q = torch.einsum("btd,hde->hbte", x, torch.from_numpy(left.heads()).to(x.device))
        k = torch.einsum("btd,hde->hbte", x, torch.from_numpy(right.heads()).to(x.device))
        inv_q, inv_k = (torch.rsqrt(t.square().mean(-1) + QK_NORM_EPS) for t in (q, k))  # (H, B, T)
        median_q = np.median(inv_q.reshape(len(q), -1).cpu().numpy(), axis=1)
        median_k = np.median(inv_k.reshape(len(k), -1).cpu().numpy(), axis=1)
        raw, live = normalised_gram(left, right)  # each form × a power of two: a constant per head too
        scores = q @ k.transpose(-1, -2)  # (H, B, T, T)
        token_scores = _score_gram(scores)
        scores *= inv_q[..., :, None] * inv_k[..., None, :]  # in place: one T² array per layer, not two
        matrices = {
            NORM_MEASURES[0]: cosine_similarity(raw, live),
            NORM_MEASURES[1]: cosine_similarity(raw * np.outer(median_q * median_k, median_q * median_k), live),
            NORM_MEASURES[2]: cosine_similarity(token_scores),
            NORM_MEASURES[3]: cosine_similarity(_score_gram(scores)),
        }
        medians = np.concatenate([median_q, median_k])
        for measure, similarity in matrices.items():
            for kind in KINDS:
                rank = similarity_spectrum(similarity, kind).effective_rank_pct_of_heads
                rows.append({"model": heads.label, "layer": layer, "kind": kind, "measure": measure,
                             "effective_rank_pct_of_heads": rank,
                             "median_inv_rms_min": medians.min(), "median_inv_rms_max": medians.max()})
    return pd.DataFrame(rows)


def _score_gram(scores: torch.Tensor) -> np.ndarray:
    """G_raw[i, j] = ⟨s_i, s_j⟩ of the heads' flattened score arrays (H, ...)."""
    flat = scores.reshape(len(scores), -1)
    return (flat @ flat.T).cpu().numpy()
