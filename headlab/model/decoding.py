"""Decoding measurements as tidy tables: cache bytes against the formula, generation with and
without the cache, the cost of one cached step as the context grows, and what rebuilding LRKV's
keys costs per token (the paper's RoPE claim, C1).

Timings run under `torch.inference_mode()` in eval mode on whatever threads torch has; they are
noisy on a shared machine, so compare ratios and trends rather than milliseconds.
"""

from __future__ import annotations

import timeit

import pandas as pd
import torch
from torch.utils.benchmark import Timer

from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT, count_parameters


def cache_bytes_table(models: dict[str, GPT], context: int) -> pd.DataFrame:
    """Bytes of a batch-1 `context`-token cache against kv_values/token · n_layer · context ·
    element size; MLA twice (latent cache, and the naive cache of decompressed K/V)."""
    rows = []
    for label, model in models.items():
        config = model.config
        for absorb in (True, False) if config.attention == "mla" else (True,):
            cache = model.new_cache(1, context, mla_absorb=absorb)
            formula = config.kv_cache_bytes(context, cache.tensors()[0].element_size(), mla_absorb=absorb)
            rows.append({"variant": label + ("" if absorb else ", naive cache"),
                         "cache tensors (bytes)": cache.nbytes(), "formula (bytes)": formula,
                         "agree": cache.nbytes() == formula})
    table = pd.DataFrame(rows).set_index("variant")
    table["% of MHA"] = 100 * table["cache tensors (bytes)"] / table["cache tensors (bytes)"].iloc[0]
    return table


@torch.inference_mode()
def generation_speed(models: dict[str, GPT], prompt: torch.Tensor, new_tokens: int, repeats: int = 3) -> pd.DataFrame:
    """Greedy generation of `new_tokens` after `prompt` (1, T), with and without the cache: ms per
    token (fastest of `repeats`), the speed-up, and whether both produce the same tokens."""
    rows = []
    for label, model in models.items():
        model.eval()
        on_cuda = model.lm_head.weight.is_cuda  # generate() moves the prompt to the model's device
        sync = torch.cuda.synchronize if on_cuda else (lambda: None)  # CUDA runs ahead of Python
        same = torch.equal(model.generate(prompt, new_tokens, temperature=0),
                           model.generate(prompt, new_tokens, temperature=0, use_cache=False))
        seconds = {use_cache: min(timeit.repeat(
            lambda use_cache=use_cache: (model.generate(prompt, new_tokens, temperature=0, use_cache=use_cache),
                                         sync()),
            number=1, repeat=repeats)) for use_cache in (True, False)}
        rows.append({"variant": label, "with cache (ms/token)": 1e3 * seconds[True] / new_tokens,
                     "without cache (ms/token)": 1e3 * seconds[False] / new_tokens,
                     "speed-up": seconds[False] / seconds[True], "same tokens": same})
    return pd.DataFrame(rows).set_index("variant")


@torch.inference_mode()
def step_latency(models: dict[str, GPT], contexts: list[int], min_run_time: float = 1.0, seed: int = 0) -> pd.DataFrame:
    """Milliseconds of one cached decoding step with `context` tokens already cached (the median
    of torch.utils.benchmark's blocked autorange); tidy: model, context, ms."""
    rows = []
    for context in contexts:
        tokens = torch.randint(0, min(m.config.vocab_size for m in models.values()), (1, context + 1),
                               generator=torch.Generator().manual_seed(seed + context))
        for label, model in models.items():
            model.eval()
            device = model.lm_head.weight.device
            cache = model.new_cache(1, context + 1)
            model(tokens[:, :context].to(device), cache=cache)
            # Each timed step writes position `context` and rewinds, so every step sees the same cache.
            step = Timer("model(token, cache=cache); cache.pos -= 1",
                         globals={"model": model, "token": tokens[:, context:].to(device), "cache": cache})
            rows.append({"model": label, "context": context,
                         "ms": 1e3 * step.blocked_autorange(min_run_time=min_run_time).median})
    return pd.DataFrame(rows)


def lrkv_key_rebuild_macs(configs: list[ModelConfig], contexts: list[int]) -> pd.DataFrame:
    """Per generated token, LRKV's cost of rebuilding every cached key from the shared key and the
    rank-r residual factors, L·T·H·r·d_h multiply-adds (RoPE rotates whole keys, so they cannot
    be absorbed into the query), beside the attention scores (L·T·H·d_h) and the block's
    weight matmuls (one MAC per non-embedding parameter)."""
    rows = []
    for config in configs:
        if config.attention != "lrkv":
            continue
        block_macs = count_parameters(config)["non_embedding"]
        for context in contexts:
            heads = config.n_layer * context * config.n_head
            rows.append({"variant": config.label, "context T": context,
                         "key rebuild (MACs/token)": heads * config.kv_rank * config.head_dim,
                         "attention scores (MACs/token)": heads * config.head_dim,
                         "block weight matmuls (MACs/token)": block_macs})
    return pd.DataFrame(rows)
