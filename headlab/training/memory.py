"""Memory per device of training a model, and on disk of its checkpoint, from its config.

Memory per device (bytes; P parameters, the model is kept in fp32 and autocast to bf16):

    weights 4·P + gradients 4·P + optimizer state (AdamW: 8 B per parameter, exp_avg and
    exp_avg_sq; Muon: 4 B of momentum per Muon matrix, AdamW's 8 B for the rest)
    DDP  (world > 1): every rank holds all of it; the gradients are views into DDP's
         all-reduce buckets (gradient_as_bucket_view=True, zeroed in place), so the buckets
         add nothing (torch's default would keep a second 4·P copy)
    FSDP (fully_shard per block and at the root): weights, gradients and optimizer state / W,
         plus the unsharded working set: the root's parameters (embedding, head, final norm)
         and two blocks (the one running and the one prefetched), 4 B weight + 4 B gradient each
    activations of one micro-batch of b sequences of T tokens, e the autocast element size
    (2 for bf16, 4 for fp32), d = d_model, A = n_head·(d_qk + d_v) (queries and keys at d_qk,
    values and attention output at d_v, all at full head count: an upper bound for the
    shared-K/V families), F the MLP hidden width (mlp_ratio·d; twice for swiglu's gate):
        per layer and token  8·d  (the fp32 residual stream saved by both norms)
                           + e·(2·d + 2·A + 2·F)  (normed inputs, Q/K/V/attention output, MLP
                             hidden before and after its nonlinearity)
        per token at the head  V·(e + 4 + 4)  (logits, their fp32 copy and the saved
                             log-softmax; V·(4 + 4) in fp32)
        activations = b·T·(n_layer · per layer + head)

A device is counted as holding `USABLE_MEMORY_FRACTION` of its memory (CUDA context, allocator
fragmentation). These are estimates for planning (expect ±30 % on activations), not
measurements.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT
from headlab.training.config import PARALLEL
from headlab.training.flops import attention_widths, parameter_counts
from headlab.training.optimizers import is_muon_matrix

STRATEGIES = PARALLEL  # TrainConfig.parallel
USABLE_MEMORY_FRACTION = 0.9
GiB = 1024 ** 3


class PlanError(ValueError):
    """The setup cannot run as asked (it does not fit, or its batch does not divide)."""


def micro_batch_size(batch_size: int, world_size: int, grad_accum: int) -> int:
    """Sequences per device per forward pass: the global batch over devices and accumulation."""
    if grad_accum < 1 or batch_size % (world_size * grad_accum):
        raise PlanError(f"batch_size = {batch_size} is not divisible by devices x grad_accum = "
                        f"{world_size} x {grad_accum}")
    return batch_size // (world_size * grad_accum)


@dataclass(frozen=True)
class Memory:
    """Bytes per device, by what holds them."""

    weights: float
    gradients: float
    optimizer: float
    buffers: float  # FSDP's unsharded working set (DDP's buckets hold the gradients themselves)
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.buffers + self.activations


@functools.lru_cache(maxsize=64)
def _parameter_groups(config: ModelConfig) -> dict[str, int]:
    """Parameter counts the memory model needs: total, Muon matrices, one block, the root unit."""

    with torch.device("meta"):
        model = GPT(config)
    total = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return {"total": total, "muon": sum(p.numel() for n, p in model.named_parameters() if is_muon_matrix(n, p)),
            "block": block, "root": total - config.n_layer * block}


def optimizer_state_bytes(config: ModelConfig, optimizer: str) -> int:
    """AdamW: 8 B per parameter; Muon: 4 B per Muon matrix parameter, 8 B for the others."""
    groups = _parameter_groups(config)
    if optimizer == "muon":
        return 4 * groups["muon"] + 8 * (groups["total"] - groups["muon"])
    return 8 * groups["total"]


def activation_bytes(config: ModelConfig, micro_batch: int, dtype: str = "bfloat16") -> float:
    """Saved activations of one micro-batch (formula in the module docstring)."""
    e = 2 if dtype == "bfloat16" else 4
    d = config.d_model
    d_qk, d_v = attention_widths(config)
    attention_width = config.n_head * (d_qk + d_v)  # Q and K at d_qk, V and the output at d_v
    hidden = config.mlp_ratio * d * (2 if config.mlp == "swiglu" else 1)
    per_layer = 8 * d + e * (2 * d + 2 * attention_width + 2 * hidden)
    head = config.vocab_size * ((e + 8) if e == 2 else 8)
    return micro_batch * config.seq_len * (config.n_layer * per_layer + head)


def memory_per_device(config: ModelConfig, micro_batch: int, world_size: int, strategy: str,
                      optimizer: str = "adamw", dtype: str = "bfloat16") -> Memory:
    """Memory each of `world_size` devices needs under `strategy` ('ddp' or 'fsdp')."""
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy = {strategy!r} is invalid: allowed values are {', '.join(STRATEGIES)}")
    groups = _parameter_groups(config)
    states = {"weights": 4.0 * groups["total"], "gradients": 4.0 * groups["total"],
              "optimizer": float(optimizer_state_bytes(config, optimizer))}
    activations = activation_bytes(config, micro_batch, dtype)
    if strategy == "ddp":
        return Memory(**states, buffers=0.0, activations=activations)  # the gradients are the buckets
    unsharded = 8.0 * (groups["root"] + 2 * groups["block"])
    return Memory(**{k: v / world_size for k, v in states.items()}, buffers=unsharded, activations=activations)


def checkpoint_bytes(config: ModelConfig, optimizer: str) -> int:
    """model.safetensors (fp32 weights) + state.pt (optimizer state) of one run."""
    return 4 * parameter_counts(config)["total"] + optimizer_state_bytes(config, optimizer)

