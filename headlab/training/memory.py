"""Memory per device of training a model, and on disk of its checkpoint, from its config.

Memory per device (bytes; P parameters, the model is kept in fp32 and autocast to bf16):

    weights 4·P + gradients 4·P + optimizer state (AdamW: 8 B per parameter, exp_avg and
    exp_avg_sq; Muon: 4 B of momentum per Muon matrix, AdamW's 8 B for the rest)
    DDP  (world > 1): every rank holds the weights and gradients; the gradients are views into
         DDP's all-reduce buckets (gradient_as_bucket_view=True, zeroed in place), so the buckets
         add nothing (torch's default would keep a second 4·P copy). The optimizer step is
         sharded (`headlab.training.sharding`): each rank holds the state of its own share of
         the parameters; counted is the busiest rank's (the deal of `sharding.owners`)
    the optimizer step's temporaries, once the backward has freed the activations (so a device
    holds the larger of the two, not both):
        Muon        8 B per parameter of the largest stack of one shape a rank orthogonalises:
                    the fp32 stacks of its gradients and momenta, alive together before the
                    Newton–Schulz iteration, and for square matrices the iteration's bf16
                    iterate, Gram matrix, its square and next iterate (less for others);
                    `muon_step` lets one shape's go before the next
        exchange    (sharded) 4 B per parameter of the largest share: the buffer in which each
                    rank in turn broadcasts its updated parameters
        AdamW       nothing (torch's fused kernel updates in place)
    held to what a step allocates, counted op by op, by tests/training/test_optimizer_memory.py
    FSDP (fully_shard per block and at the root): weights, gradients and optimizer state / W,
         plus the unsharded working set: the root's parameters (embedding, head, final norm)
         and two blocks (the one running and the one prefetched), 4 B weight + 4 B gradient each
    activations of one micro-batch of b sequences of T tokens, as the eager step holds them at
    its peak (the start of backward), e the autocast element size (2 for bf16, 4 for fp32):
        activations = b·T·(n_layer · per layer + head)
    per layer and token:
        norms       2·(4·d + 4)   the fp32 residual stream and its 1/rms, saved by both norms
        inputs      e·d·k   the normed input as each of the k projections that read it saves it:
                    under bf16 autocast every projection casts its own copy (k = 3 for MHA's
                    W_Q, W_K, W_V; 5 for LRKV's W_Q, shared K/V and U_K, U_V; 2 for MLA's W_Q
                    and W_DKV; 1 for the MLP, 2 for swiglu); in fp32 they share one (k = 1)
        attention   e·(what attention saves) + 4·(its per-head fp32 statistics), by family
                    (`attention_activation_values`): the rotated, QK-normed queries and keys,
                    the values, the kernel's output and its copy for the output projection,
                    LRKV's latents, MLA's latent and RoPE parts; QK-norm's 1/rms and the
                    softmax's log-sum-exp per head
        mlp         e·2·F (relu2, gelu: the hidden before and after its nonlinearity);
                    e·4·F for swiglu (both hidden halves, the gate's silu, their product)
    per token at the head: 4·d + 4 + e·d (the final norm and the head's input as above) and
        V·(e + 12) under bf16: the logits, their fp32 copy for the loss, the saved log-softmax
        and its gradient, all alive at once when backward starts (V·16 in fp32: the logits
        themselves are the fp32 copy, and the logits' gradient is born before the
        log-softmax's gradient dies)
    The per-token bytes are held within 10 % of torch's profiler on an eager CPU step of every
    family (tests/training/test_memory_measured.py). A compiled step fuses the elementwise
    glue and saves less: inductor's CPU step of the tiny MHA peaked at 0.70 of these bytes
    (measured once; compiling each family takes about a minute on a CPU, too long for the
    tests), and gpu_check's memory row holds a compiled GPU run to them. The plan keeps the
    eager bytes although a GPU run compiles by default (headlab.training.compiling): a compile
    that fails at the first step falls back to the eager step, which must then fit.

A device is counted as holding `USABLE_MEMORY_FRACTION` of its memory (CUDA context, allocator
fragmentation). These are estimates for planning, not measurements.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from headlab.model.config import ModelConfig
from headlab.model.gpt import meta_model
from headlab.training.config import PARALLEL
from headlab.training.flops import parameter_counts
from headlab.training.optimizers import is_muon_matrix
from headlab.training.sharding import owners

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
    transient: float = 0.0  # the optimizer step's temporaries, after the activations are freed

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.buffers + max(self.activations, self.transient)


@functools.lru_cache(maxsize=64)
def _parameter_groups(config: ModelConfig) -> dict[str, int]:
    """Parameter counts the memory model needs: total, Muon matrices, one block, the root unit."""
    model = meta_model(config)
    total = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return {"total": total, "muon": sum(p.numel() for n, p in model.named_parameters() if is_muon_matrix(n, p)),
            "block": block, "root": total - config.n_layer * block}


MUON_STACK_BYTES = 4 + 4  # per parameter of one shape's stack: its fp32 gradients and momenta (muon_step)
EXCHANGE_BYTES = 4  # per parameter of a share: the fp32 buffer a sharded step broadcasts it in


@functools.lru_cache(maxsize=64)
def rank_shares(config: ModelConfig, ranks: int, optimizer: str) -> tuple[dict[str, int], ...]:
    """Per rank of a sharded DDP step (one rank: the whole step) under `optimizer`: the bytes of
    optimizer state it holds, the parameters it steps, and the parameters of the largest stack
    of one shape it orthogonalises (`headlab.training.sharding.owners`; Muon's matrices as the
    memory model counts them, `is_muon_matrix`)."""
    model = meta_model(config)
    named = list(model.named_parameters())
    matrices = [p for n, p in named if optimizer == "muon" and is_muon_matrix(n, p)]
    orthogonalised = {id(p) for p in matrices}
    owner = owners(matrices, [p for _, p in named if id(p) not in orthogonalised], ranks)
    shares = []
    for rank in range(ranks):
        mine = [p for _, p in named if owner[id(p)] == rank]
        stacks: dict[tuple, int] = {}
        for p in mine:
            if id(p) in orthogonalised:
                stacks[tuple(p.shape)] = stacks.get(tuple(p.shape), 0) + p.numel()
        shares.append({"state": sum((4 if id(p) in orthogonalised else 8) * p.numel() for p in mine),
                       "params": sum(p.numel() for p in mine), "stack": max(stacks.values(), default=0)})
    return tuple(shares)


def step_transient_bytes(config: ModelConfig, ranks: int, optimizer: str) -> float:
    """The optimizer step's temporaries on the busiest of `ranks` DDP ranks (module docstring)."""
    shares = rank_shares(config, ranks, optimizer)
    exchange = EXCHANGE_BYTES * max(share["params"] for share in shares) if ranks > 1 else 0
    return float(max(exchange, max(MUON_STACK_BYTES * share["stack"] for share in shares)))


def optimizer_state_bytes(config: ModelConfig, optimizer: str) -> int:
    """AdamW: 8 B per parameter; Muon: 4 B per Muon matrix parameter, 8 B for the others."""
    groups = _parameter_groups(config)
    if optimizer == "muon":
        return 4 * groups["muon"] + 8 * (groups["total"] - groups["muon"])
    return 8 * groups["total"]


def attention_activation_values(config: ModelConfig) -> tuple[int, int, int]:
    """Per layer and token, what the attention block saves for backward beyond its normed input:
    (projections reading the normed input, values at the autocast width, fp32 values), from
    each family's forward (headlab.model.attention). H heads of width d_h, H_kv key/value heads."""
    h, dh = config.n_head, config.head_dim
    if config.attention == "lrkv":  # per-head q, k, v, output, copy; the rank-r latents of K and V
        return 5, 5 * h * dh + 2 * h * config.kv_rank, 3 * h
    if config.attention == "mla":
        dr, dc, dq = config.rope_head_dim, config.kv_latent_dim, config.q_latent_dim
        width = dh + dr  # queries, keys and the padded values as the kernel reads them
        values = (4 * h * width + h * dh  # q, k, padded v, the output, its copy
                  + (dc + dr) + dc  # W_DKV's output (the latent norm's input) and the normed latent
                  + h * dr + dr  # the rotated RoPE parts of the queries and the shared key
                  + 2 * dq)  # with a query latent: W_DQ's output and its normed copy
        return 2, values, 3 * h + 2 + (dq > 0)  # W_Q (or W_DQ) and W_DKV read the normed input
    kv = config.kv_heads
    return 3, 3 * h * dh + 2 * kv * dh, 2 * h + kv  # q, output, copy; k, v


def activation_bytes(config: ModelConfig, micro_batch: int, dtype: str = "bfloat16") -> float:
    """Saved activations of one micro-batch (formula in the module docstring)."""
    e = 2 if dtype == "bfloat16" else 4
    copies = (lambda readers: readers) if e == 2 else (lambda readers: 1)  # autocast: a cast per projection
    d = config.d_model
    reading, values, statistics = attention_activation_values(config)
    swiglu = config.mlp == "swiglu"
    hidden = config.mlp_ratio * d
    mlp = e * d * copies(2 if swiglu else 1) + e * hidden * (4 if swiglu else 2)
    per_layer = 2 * (4 * d + 4) + e * d * copies(reading) + e * values + 4 * statistics + mlp
    head = 4 * d + 4 + e * d + config.vocab_size * (e + 12 if e == 2 else 16)
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
    if strategy == "ddp":  # the gradients are the buckets; the step is sharded
        busiest = max(share["state"] for share in rank_shares(config, world_size, optimizer))
        return Memory(**{**states, "optimizer": float(busiest)}, buffers=0.0, activations=activations,
                      transient=step_transient_bytes(config, world_size, optimizer))
    unsharded = 8.0 * (groups["root"] + 2 * groups["block"])
    return Memory(**{k: v / world_size for k, v in states.items()}, buffers=unsharded, activations=activations)


def checkpoint_bytes(config: ModelConfig, optimizer: str) -> int:
    """model.safetensors (fp32 weights) + state.pt (optimizer state) of one run."""
    return 4 * parameter_counts(config)["total"] + optimizer_state_bytes(config, optimizer)

