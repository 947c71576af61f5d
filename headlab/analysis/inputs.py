"""Second moments of the inputs each attention layer reads, for the data-aware head similarity
(`analyze(..., measure="data", inputs=...)`, formula in `headlab.analysis.spectrum.data_gram`).

    moments = input_moments(source, encode_text(source, text))
    Σ_q[l] = E_t[x_t x_tᵀ],  x_t = what layer l's query projection reads at token t (Σ_k: key)

The expectation runs over every token position of the text's windows, uniformly. It is a second
moment, not a covariance: the mean is kept, since a score xᵀ A y sees it like any direction.

Where x is taken:
  * headlab GPT: the attention module's input, i.e. the residual stream after the block's
    pre-norm RMSNorm, gain included. Every family's projections (W_Q, W_K, W_V; MLA's W_dq,
    W_dkv, W_kr; LRKV's shared and U factors) read this one vector, so Σ_q = Σ_k.
  * BERT / RoBERTa checkpoints (post-norm): what `attention.self.query` and `.key` read, the
    layer's input hidden state (the embedding LayerNorm's output for layer 0, else the previous
    layer's output LayerNorm). Windows are [CLS] text-piece [SEP], no padding.
  * GPT-2, Llama-style (Llama, Mistral, Qwen2/3), Gemma 3 and DeepSeek (MLA) checkpoints, and GGUF
    files (run as the Hugging Face model they came from, `headlab.analysis.gguf_models`) (pre-norm): what
    the query and key projections read (GPT-2's fused c_attn; DeepSeek's q_a_proj or q_proj and
    kv_a_proj_with_mqa), the block's input norm output, gain included. Windows are HF_WINDOW tokens,
    the first one the tokenizer's BOS where it has one. Read through forward pre-hooks on the
    modules `headlab.analysis.hf_layouts.HF_ATTENTION_INPUTS` names, so any checkpoint is
    measured where its own forward pass feeds the projections.
In self-attention both sides read the same tokens, so Σ_q = Σ_k and the value side is the
same Σ too; they are kept apart so the inner product stays general.

Which text: whatever the caller passes (`headlab analyze --text FILE`); headlab ships none. The
tests measure MiniLM on generated text (`data.synthetic_texts`, made-up words that WordPiece
splits into known pieces), so they run offline; for English, pass English, e.g. the final 10 %
of the Shakespeare corpus (`data.shakespeare_texts`), which is what headlab models validate on.

Not captured (outside the bilinear form, as in `headlab.analysis.layer_weights`): RoPE (the form is taken at
relative offset 0); headlab's per-head QK-norm, applied after the projection, whose 1/rms(q_h),
1/rms(k_h) vary per token and head; MLA's latent norms' 1/rms; biases (BERT); the softmax.
And E[(x_qᵀ A_i x_k)(x_qᵀ A_j x_k)] treats the query and key tokens as independent draws,
while the model scores pairs of tokens from one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from headlab.analysis.gguf_models import gguf_model, gguf_tokenizer
from headlab.analysis.gguf_sources import is_gguf_source
from headlab.analysis.hf_models import attention_input_modules, check_runnable, load_hf_model, transformers_module
from headlab.analysis.hub import local_path
from headlab.data.tokenizers import get_tokenizer
from headlab.io.places import checkpoint_place
from headlab.model.config import ModelConfig
from headlab.model.gpt import eval_mode
from headlab.runs.folder import load_weights
from headlab.runs.layout import read_config

HF_WINDOW = 128  # tokens per checkpoint window, special tokens included (MiniLM was tuned on ≤ 256)
MAX_TOKENS = 16384  # default cap on the tokens read from a text


@dataclass(frozen=True)
class InputMoments:
    """Per layer, the second moments of the query-side and key-side attention inputs."""

    query: np.ndarray  # (n_layers, d, d), Σ_q per layer
    key: np.ndarray  # (n_layers, d, d), Σ_k per layer
    n_tokens: int  # token positions averaged over
    text: str = ""  # what the moments were measured on, for the record

    def __post_init__(self):
        query, key = (np.asarray(m, dtype=np.float64) for m in (self.query, self.key))
        if query.ndim != 3 or query.shape[1] != query.shape[2] or query.shape != key.shape:
            raise ValueError(f"InputMoments.query and .key must both be (n_layers, d, d); got {query.shape} "
                             f"and {key.shape}")
        if self.n_tokens < 1:
            raise ValueError(f"InputMoments.n_tokens = {self.n_tokens}: moments need at least one token")
        object.__setattr__(self, "query", query)
        object.__setattr__(self, "key", key)

    @property
    def n_layers(self) -> int:
        return self.query.shape[0]

    @property
    def dim(self) -> int:
        return self.query.shape[1]

    def roots(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """R_q, R_k with RᵀR = Σ_q, Σ_k of `layer` (one factorisation when the two are equal)."""
        query = second_moment_root(self.query[layer])
        same = np.array_equal(self.query[layer], self.key[layer])
        return query, query if same else second_moment_root(self.key[layer])


def second_moment_root(moment: np.ndarray) -> np.ndarray:
    """R (d × d) with RᵀR = Σ for a second-moment matrix Σ = E[x xᵀ] (symmetric, PSD): the
    transposed Cholesky factor, or Λ^½ Vᵀ when Σ is singular (inputs confined to a subspace).
    Refuses anything not square, not symmetric, or with an eigenvalue below −1e-9 · its largest.

    Factorised by torch's LAPACK: numpy's (OpenBLAS) Cholesky of a 768 × 768 Σ right after a
    torch forward pass took ~2 s instead of ~0.07 s on two shared cores (threads fighting)."""
    sigma = np.asarray(moment, dtype=np.float64)
    if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1]:
        raise ValueError(f"a second-moment matrix must be square; got shape {sigma.shape}")
    if not np.allclose(sigma, sigma.T, rtol=0.0, atol=1e-12 * np.abs(sigma).max(initial=0.0)):
        raise ValueError("a second-moment matrix must be symmetric; this one is not")
    sigma = torch.from_numpy((sigma + sigma.T) / 2)
    lower, info = torch.linalg.cholesky_ex(sigma)
    if info == 0:
        return lower.T.numpy()
    lam, v = torch.linalg.eigh(sigma)
    if lam[0] < -1e-9 * max(float(lam[-1]), 0.0):
        raise ValueError(f"a second-moment matrix must be positive semi-definite; this one has eigenvalue "
                         f"{float(lam[0]):.3g}")
    return (lam.clamp(min=0.0).sqrt()[:, None] * v.T).numpy()


@dataclass(frozen=True)
class LoadedModel:
    """A source loaded once to run forward (`load_forward_model`): a caller that measures it in
    several ways (input moments, attention maps) passes this instead of the source, and the
    checkpoint is read, and a GGUF file dequantised, once."""

    module: torch.nn.Module
    kind: str  # "headlab" or the checkpoint's model_type
    source: object  # what it was loaded from


def load_forward_model(source) -> LoadedModel:
    """`forward_model(source)`, kept for several measurements."""
    return source if isinstance(source, LoadedModel) else LoadedModel(*forward_model(source), source)


def forward_model(source) -> tuple[torch.nn.Module, str]:
    """A module that can run `source` (a headlab GPT, run folder, Hugging Face checkpoint folder,
    hf:ORG/NAME, GGUF checkpoint, or a `LoadedModel` of one) forward, and its kind ("headlab" or
    the checkpoint's model_type)."""
    if isinstance(source, LoadedModel):
        return source.module, source.kind
    if isinstance(getattr(source, "config", None), ModelConfig):
        return source, "headlab"
    if not isinstance(source, (str, Path)):
        raise TypeError(f"input moments need a model to run forward: pass a headlab GPT, a run folder or a "
                        f"Hugging Face checkpoint folder, not a {type(source).__name__}")
    if is_gguf_source(local_path(source)):
        return gguf_model(local_path(source))
    folder = source_folder(source)
    cfg = _config_json(folder)
    if "model_type" not in cfg:
        return load_weights(folder).model(), "headlab"
    return load_hf_model(folder, cfg["model_type"], "input moments"), cfg["model_type"]


def source_folder(source: str | Path) -> Path:
    """The folder holding the config.json of a source path (a folder, a file in it, or hf:ORG/NAME),
    once every entry of it is found to be a file it may be read through (`headlab.io.places`)."""
    path = local_path(source)
    return checkpoint_place(path if path.is_dir() else path.parent).folder


def _config_json(folder: Path) -> dict:
    place = checkpoint_place(folder)
    if not place.exists("config.json"):
        raise ValueError(f"{folder} has no config.json: it is neither a headlab run nor a Hugging Face checkpoint")
    cfg = place.read_json("config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{folder / 'config.json'} holds a JSON {type(cfg).__name__}, not a model config object")
    return cfg


def _projection_inputs(model: torch.nn.Module, kind: str) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """Per layer, the modules whose first input is the query-side and the key-side input."""
    if kind == "headlab":
        return [(block.attn, block.attn) for block in model.blocks]
    return attention_input_modules(model, kind)


def run_forward(model: torch.nn.Module, tokens: torch.Tensor):
    """model(tokens) with the tokens moved to the model's device: a study's models stay on the
    device they trained on (a GPU after `reproduce` there), while its token windows are on the CPU."""
    return model(torch.as_tensor(tokens).to(next(model.parameters()).device))


@torch.no_grad()
def input_moments(source, tokens: torch.Tensor, text: str = "") -> InputMoments:
    """Σ_q, Σ_k of every layer of `source` (a headlab GPT, run folder, Hugging Face checkpoint
    folder, hf:ORG/NAME, or a `LoadedModel` of one), averaged over all positions of `tokens`
    (B, T) (from `encode_text`), in float64."""
    model, kind = forward_model(source)
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2 or tokens.numel() == 0:
        raise ValueError(f"tokens must be a non-empty (batch, time) array; got shape {tuple(tokens.shape)}")
    sums: dict[int, torch.Tensor] = {}

    def accumulate(module, args):
        x = args[0].detach().reshape(-1, args[0].size(-1)).double()
        sums[id(module)] = sums.get(id(module), 0) + x.T @ x

    layers = _projection_inputs(model, kind)
    hooks = [m.register_forward_pre_hook(accumulate) for m in {id(m): m for pair in layers for m in pair}.values()]
    try:
        with eval_mode(model):
            for batch in tokens.split(8):
                run_forward(model, batch.long())
    finally:
        for hook in hooks:
            hook.remove()
    n = tokens.numel()
    query, key = (np.stack([sums[id(pair[side])].cpu().numpy() / n for pair in layers]) for side in (0, 1))
    return InputMoments(query, key, n, text)


def encode_text(source, text: str, tokenizer: str | None = None, max_tokens: int = MAX_TOKENS) -> torch.Tensor:
    """The first `max_tokens` tokens of `text` as (B, T) windows `source` can read: its
    training sequence length for headlab models (tokenizer from the run's config.json, or
    `tokenizer` = "byte" / "gpt2" for a GPT object); for a Hugging Face checkpoint, windows of
    HF_WINDOW tokens of its tokenizer: [CLS] piece [SEP] where it has both (BERT, RoBERTa), else
    BOS piece where it has a BOS, else the piece alone; for a GGUF checkpoint, its own tokenizer's,
    BOS first where the file says llama.cpp adds one (`gguf_models.gguf_tokenizer`). A short text
    gives one shorter window; a partial last window is dropped, so no window is padded."""
    if isinstance(getattr(source, "config", None), ModelConfig):
        if tokenizer is None:
            raise ValueError("encode_text of a GPT object needs tokenizer = 'byte' or 'gpt2' (a run folder names "
                             "its own)")
        return _windows(get_tokenizer(tokenizer).encode(text)[:max_tokens], source.config.seq_len)
    if is_gguf_source(local_path(source)):
        tokens, bos = gguf_tokenizer(local_path(source))
        return _hf_windows(tokens, text, max_tokens, bos)
    folder = source_folder(source)
    cfg = _config_json(folder)
    if "model_type" not in cfg:
        cfg = read_config(folder)  # a headlab run's, as its manifest verifies it
        name = tokenizer or cfg.get("data", {}).get("tokenizer")
        if name is None:
            raise ValueError(f"{folder / 'config.json'} names no tokenizer (data.tokenizer): pass tokenizer = "
                             "'byte' or 'gpt2'")
        seq_len = ModelConfig.from_dict(cfg["model"]).seq_len
        return _windows(get_tokenizer(name, folder).encode(text)[:max_tokens], seq_len)  # a trained BPE: the run's copy
    check_runnable(cfg["model_type"], "token windows")
    return _hf_windows(transformers_module().AutoTokenizer.from_pretrained(str(folder)), text, max_tokens)


def _hf_windows(hf, text: str, max_tokens: int, bos: int | None = -1) -> torch.Tensor:
    """Windows of HF_WINDOW tokens of a `transformers` tokenizer (see `encode_text`); `bos`, where
    given (a token or None), is what each window starts with instead of the tokenizer's BOS."""
    # verbose=False: the text is cut into windows below, so a text longer than the model's context is expected
    ids = np.asarray(hf(text, add_special_tokens=False, verbose=False)["input_ids"][:max_tokens])
    if hf.cls_token_id is not None and hf.sep_token_id is not None:
        before, after = [hf.cls_token_id], [hf.sep_token_id]
    else:
        bos = hf.bos_token_id if bos == -1 else bos
        before, after = ([bos] if bos is not None else []), []
    pieces = _windows(ids, HF_WINDOW - len(before) - len(after))
    return torch.cat([torch.full((len(pieces), 1), token, dtype=torch.long) for token in before] + [pieces] +
                     [torch.full((len(pieces), 1), token, dtype=torch.long) for token in after], dim=1)


def _windows(ids: np.ndarray, length: int) -> torch.Tensor:
    """Consecutive non-overlapping windows of `length` tokens (one shorter one if that is all)."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    if ids.numel() == 0:
        raise ValueError("the text has no tokens: input moments need some text")
    if ids.numel() < length:
        return ids[None]
    return ids[: ids.numel() // length * length].view(-1, length)
