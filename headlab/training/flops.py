"""FLOPs of training a model, counted from its config (no weights allocated).

FLOPs per trained token (forward + backward = 3 x forward, 2 FLOPs per multiply-add):

    6 · N                                  every weight matmul
  + 6 · n_layer · n_head · (d_qk + d_v) · T/2    causal attention: scores and weighted values

N is every parameter except the input embedding: an embedding is a table lookup with no
multiply-adds, while the untied output head is a d_model x vocab matmul per token and counts.
(Kaplan et al.'s N also drops the head; at vocab 50304 it is a third of paper-128m's N, so it
has to count here.) Low-rank factors (LRKV's A·B, MLA's down/up projections) are applied one
after the other, so their multiply-adds equal their parameters. T/2 is the mean causal context
of a length-T sequence (a flash kernel skips the masked half; PaLM's 12·L·H·d_h·T counts it).
d_qk = d_v = head_dim, except MLA whose queries and keys are head_dim + rope_head_dim wide and
whose values are zero-padded to that width so one attention kernel serves both.

The optimizer's own FLOPs (Muon's Newton–Schulz iterations, `muon_flops_per_step`) are apart
from the model FLOPs that MFU is of.
"""

from __future__ import annotations

import functools
import inspect

import torch

from headlab.model.config import ModelConfig
from headlab.model.gpt import count_parameters, meta_model
from headlab.training.optimizers import is_muon_matrix
from headlab.training.sharding import owners

# Parameter counts build a model on the meta device (a fraction of a second); plans ask often.
parameter_counts = functools.lru_cache(maxsize=64)(count_parameters)


def matmul_parameters(config: ModelConfig) -> int:
    """N of the 6·N·D rule: every parameter but the input embedding (see the module docstring)."""
    counts = parameter_counts(config)
    return counts["total"] - counts["embedding"]


def attention_widths(config: ModelConfig) -> tuple[int, int]:
    """(d_qk, d_v) per head as the attention kernel runs them."""
    width = config.head_dim + config.rope_head_dim if config.attention == "mla" else config.head_dim
    return width, width


def attention_flops_per_token(config: ModelConfig) -> float:
    """6 · n_layer · n_head · (d_qk + d_v) · T/2: causal scores and weighted values, trained."""
    d_qk, d_v = attention_widths(config)
    return 6 * config.n_layer * config.n_head * (d_qk + d_v) * config.seq_len / 2


def model_flops_utilization(config: ModelConfig, tokens_per_second: float, peak_flops: float) -> float:
    """MFU: the model FLOP/s achieved, tokens/s · `training_flops` per token, over the device's
    peak FLOP/s. The one definition `--plan`, benchmarks/train_throughput.py and
    tools/gpu_check.py share (a plan at an assumed MFU inverts it)."""
    return tokens_per_second * training_flops(config, 1)["total"] / peak_flops


def newton_schulz_by_rank(matrices: list[torch.Tensor], ranks: int) -> tuple[list[int], dict[int, int]]:
    """FLOPs of one Newton–Schulz iteration of each rank's matrices, 4·m²·n + 2·m³ per m x n
    matrix (m <= n), as a sharded step deals them (`headlab.training.sharding.owners`), and that deal."""
    owner = owners(matrices, [], ranks)
    per_rank = [0] * ranks
    for p in matrices:
        m, n = sorted(p.shape)
        per_rank[owner[id(p)]] += 4 * m * m * n + 2 * m ** 3
    return per_rank, owner


@functools.lru_cache(maxsize=64)
def muon_flops_per_step(config: ModelConfig, ranks: int = 1) -> float:
    """FLOPs of Muon's Newton–Schulz orthogonalisation in one optimizer step, on the busiest of
    `ranks` DDP ranks: for each Muon matrix, m x n with m <= n (transposed if taller), each of
    ns_steps iterations computes A = X·Xᵀ (2·m²·n), B = b·A + c·A·A (2·m³) and X = a·X + B·X (2·m²·n):

        ns_steps · max over ranks of Σ_(the rank's matrices) (4·m²·n + 2·m³)

    where each rank orthogonalises the matrices a sharded step deals it
    (`newton_schulz_by_rank`: each shape's k matrices dealt round-robin, ⌊k / ranks⌋ or ⌈k / ranks⌉
    to a rank)."""
    ns_steps = inspect.signature(torch.optim.Muon).parameters["ns_steps"].default
    model = meta_model(config)
    per_rank, _ = newton_schulz_by_rank([p for n, p in model.named_parameters() if is_muon_matrix(n, p)], ranks)
    return float(ns_steps * max(per_rank))


def training_flops(config: ModelConfig, tokens: int) -> dict[str, float]:
    """FLOPs of training on `tokens` tokens: the 6·N·D term, the attention term, their total."""
    weights = 6 * matmul_parameters(config) * tokens
    attention = attention_flops_per_token(config) * tokens
    return {"6ND": float(weights), "attention": float(attention), "total": float(weights + attention)}



def rank_training_flops(config: ModelConfig, train_config, world_size: int = 1) -> float:
    """FLOPs one of `world_size` ranks does in a whole run of `train_config` (every step, all ranks alike)."""
    tokens = train_config.steps * train_config.batch_size * config.seq_len
    return training_flops(config, tokens)["total"] / world_size
