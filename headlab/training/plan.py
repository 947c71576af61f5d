"""A plan before the bill: what a training job will cost, computed without training.

For every variant: parameters, tokens, training FLOPs, wall time at a stated MFU on the given
devices, checkpoint disk, and memory per device under DDP and under FSDP. A setup that cannot
fit is refused in one line that says what would fit.

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

The optimizer's own FLOPs (Muon's Newton–Schulz iterations, `muon_flops_per_step`) are
counted per rank in the wall time at the same MFU, apart from the model FLOPs that MFU is of.

A device is counted as holding `USABLE_MEMORY_FRACTION` of its memory (CUDA context, allocator
fragmentation). These are estimates for planning (expect ±30 % on activations), not
measurements.
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import math
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from headlab.data.shards import random_windows
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT, count_parameters
from headlab.training.config import PARALLEL
from headlab.training.distributed import Processes, launched_processes, training_device
from headlab.training.optimizers import is_muon_matrix, make_optimizers
from headlab.training.trainer import on_device

STRATEGIES = PARALLEL  # TrainConfig.parallel
USABLE_MEMORY_FRACTION = 0.9
MAX_SUGGESTED_DEVICES = 1024
GiB = 1024 ** 3
# Parameter counts build a model on the meta device (a fraction of a second); plans ask often.
_counts = functools.lru_cache(maxsize=64)(count_parameters)

# Dense (no sparsity) bf16 tensor-core peaks in TFLOPS and memory as marketed, from the
# vendors' data sheets (USABLE_MEMORY_FRACTION leaves room for what the driver reserves).
# Matched in order as substrings of torch.cuda.get_device_name(), so the more specific names
# come first. The T4 has no bf16 tensor cores: its fp16 peak is given.
GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("B200", 2250.0, 180.0),
    ("H100 PCIe", 756.5, 80.0),
    ("H100 NVL", 835.5, 94.0),
    ("H200 NVL", 835.5, 141.0),
    ("H200", 989.4, 141.0),
    ("H100", 989.4, 80.0),
    ("A100-SXM4-40GB", 312.0, 40.0),
    ("A100-PCIE-40GB", 312.0, 40.0),
    ("A100", 312.0, 80.0),
    ("L40S", 362.0, 48.0),
    ("L4", 121.0, 24.0),
    ("T4", 65.0, 16.0),
)


class PlanError(ValueError):
    """The setup cannot run as asked (it does not fit, or its batch does not divide)."""


@dataclass(frozen=True)
class Devices:
    """`count` identical devices, each with `memory_bytes` and a `peak_flops` (FLOP/s) whose
    origin `peak_source` is 'table' (GPU_PEAKS), 'measured' or 'stated'."""

    name: str
    count: int
    memory_bytes: int
    peak_flops: float
    peak_source: str

    def __post_init__(self):
        if self.count < 1:
            raise PlanError(f"device count = {self.count} is invalid: must be at least 1")
        if not self.peak_flops > 0:
            raise PlanError(f"peak FLOP/s = {self.peak_flops} for {self.name} is invalid: must be positive")

    @property
    def usable_bytes(self) -> float:
        return USABLE_MEMORY_FRACTION * self.memory_bytes


def gpu_peak(name: str) -> tuple[str, float, float] | None:
    """(table key, bf16 dense TFLOPS, GiB) of the first GPU_PEAKS entry found in `name`."""
    for key, tflops, gib in GPU_PEAKS:
        if key.lower() in name.lower():
            return key, tflops, gib
    return None


def parse_devices(spec: str, peak_tflops: float | None = None) -> Devices:
    """Devices from a spec like '8xH100', 'H200' or '4xA100-SXM4-40GB' (GPU_PEAKS names), for
    planning a machine this one is not."""
    count_text, separator, name = spec.partition("x")
    if not separator or not count_text.isdigit():
        count_text, name = "1", spec
    known = gpu_peak(name)
    if known is None:
        raise PlanError(f"devices = {spec!r} is invalid: write [N x]GPU, e.g. 8xH100, with GPU one of "
                        f"{', '.join(key for key, _, _ in GPU_PEAKS)}")
    key, tflops, gib = known
    peak, source = (peak_tflops, "stated") if peak_tflops else (tflops, "table")
    return Devices(key, int(count_text), int(gib * GiB), peak * 1e12, source)


def measure_peak_flops(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                       size: int = 1024, seconds: float = 1.0) -> float:
    """FLOP/s of the fastest of repeated (size x size) @ (size x size) matmuls on `device`,
    2·size³ FLOPs each: the peak this device actually reaches for dense `dtype` matmuls."""
    device = torch.device(device)
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best, deadline = math.inf, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - start) / 10)
    return 2 * size ** 3 / best


def visible_devices(peak_tflops: float | None = None, dtype: str = "bfloat16") -> Devices:
    """The GPUs torch sees (their table peak unless `peak_tflops` is stated), or this CPU with
    its measured matmul peak in the training dtype (or the stated one) and its RAM."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
        known = gpu_peak(name)
        if peak_tflops:
            return Devices(name, count, memory, peak_tflops * 1e12, "stated")
        if known is None:
            raise PlanError(f"GPU {name!r} has no entry in headlab.training.plan.GPU_PEAKS: state its dense bf16 peak "
                            "with --plan-peak-tflops")
        return Devices(name, count, memory, known[1] * 1e12, "table")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if peak_tflops:
        return Devices("cpu", 1, memory, peak_tflops * 1e12, "stated")
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    return Devices("cpu", 1, memory, measure_peak_flops("cpu", torch_dtype), "measured")


# ---- FLOPs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTime:
    """One model's training step measured here: `seconds`, the median of the repeats; `spread`,
    (slowest − fastest) / median, how steady the machine was while measuring; `eval_seconds`,
    one evaluation batch (forward only); `threads`, the torch threads it ran on."""

    seconds: float
    spread: float
    eval_seconds: float
    threads: int


def measure_step(config: ModelConfig, train_config, threads: int | None = None, repeats: int = 5,
                 processes: Processes | None = None) -> StepTime:
    """Time one rank's step of the trainer for `config` at `train_config`'s optimizer and dtype on
    that rank's device (`training_device` of its LOCAL_RANK: CPU unless CUDA is asked for or
    `auto` finds one): `grad_accum` forwards and backwards of the per-rank micro-batch,
    batch_size / (world_size · grad_accum) random windows each, then gradient clipping and the
    optimizer update, `repeats` times after two warm-up steps, with `threads` torch threads
    (default: the current count; a study's workers use cpu_count / jobs). The evaluation batch is
    the rank's share, batch_size / world_size. `processes` defaults to torchrun's environment.
    Gradient exchange between ranks is not timed. The model and its optimizer state are freed
    (and, on a GPU, the allocator's cache emptied) before this returns, so training finds the
    device's memory as it was. This is what a plan's wall time on this machine is made of."""
    processes = processes or launched_processes()
    micro = micro_batch_size(train_config.batch_size, processes.world_size, train_config.grad_accum)
    local_batch = train_config.batch_size // processes.world_size
    device = training_device(train_config.device, processes.local_rank)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    model = optimizers = None
    try:
        model = GPT(config).to(device)
        optimizers = make_optimizers(model, train_config)
        corpus = [np.random.default_rng(0).integers(0, config.vocab_size, 64 * config.seq_len * local_batch)]
        generator = torch.Generator().manual_seed(0)
        autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if train_config.dtype == "bfloat16"
                    else nullcontext())

        def timed(step, batch: int) -> float:
            x, y = random_windows(corpus, batch, config.seq_len, generator)
            sync()
            start = time.perf_counter()
            step(on_device(x, device), on_device(y, device))
            sync()
            return time.perf_counter() - start

        def train_step(x, y):
            for micro_x, micro_y in zip(x.chunk(train_config.grad_accum), y.chunk(train_config.grad_accum)):
                with autocast:
                    _, loss = model(micro_x, micro_y)
                (loss / train_config.grad_accum).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        @torch.no_grad()
        def eval_step(x, y):
            with autocast:
                model(x, y)

        steps = [timed(train_step, micro * train_config.grad_accum) for _ in range(repeats + 2)][2:]
        evals = [timed(eval_step, local_batch) for _ in range(3)][1:]
    finally:
        torch.set_num_threads(previous)
        del model, optimizers
        gc.collect()
        torch.cuda.empty_cache()  # a no-op unless CUDA was used
    median = statistics.median(steps)
    return StepTime(median, (max(steps) - min(steps)) / median, statistics.median(evals), threads or previous)


def step_fits(config: ModelConfig, train_config, device: torch.device, processes: Processes | None = None) -> bool:
    """Whether `measure_step` can time `config` on `device`: on a GPU, whether one whole replica
    with its gradients, optimizer state and the per-rank micro-batch's activations
    (`memory_per_device` of one device) fits its usable memory. An FSDP run may train a model
    whose unsharded step does not fit; the CPU's memory is not checked."""
    if device.type != "cuda":
        return True
    processes = processes or launched_processes()
    micro = micro_batch_size(train_config.batch_size, processes.world_size, train_config.grad_accum)
    needed = memory_per_device(config, micro, 1, "ddp", train_config.optimizer, train_config.dtype).total
    return needed <= USABLE_MEMORY_FRACTION * torch.cuda.get_device_properties(device).total_memory


# Torch threads of every run a study trains on a CPU, however many run at once: a matmul's
# reduction order (and so a run's last bits) depends on its thread count, so a study fixed to one
# thread per run gives the same numbers under any `jobs`; two one-thread runs also keep two cores
# ~12% busier than one two-thread run.
RUN_THREADS = 1


def evaluations(train_config, steps: int) -> int:
    """How many evaluations a run of `steps` makes: every eval_every steps and at the last."""
    return len(set(range(train_config.eval_every, steps + 1, train_config.eval_every)) | {steps})


def run_seconds(step: StepTime, train_config, steps: int) -> float:
    """Wall seconds of a run of `steps` from a measured step: steps · step + evaluations ·
    eval_batches · one evaluation batch."""
    return steps * step.seconds + evaluations(train_config, steps) * train_config.eval_batches * step.eval_seconds


def load_note() -> str:
    """This machine's 1-minute load average against its cores, for a timing measured now: other
    work running at the same time makes every measured step slower than on a quiet machine."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    busy = " (other work is running: expect the figure to be high)" if load > 0.5 else ""
    return f"load average {load:.1f} on {cores} core(s){busy}"


def matmul_parameters(config: ModelConfig) -> int:
    """N of the 6·N·D rule: every parameter but the input embedding (see the module docstring)."""
    counts = _counts(config)
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
    benchmarks/gpu_check.py share (a plan at an assumed MFU inverts it)."""
    return tokens_per_second * training_flops(config, 1)["total"] / peak_flops


@functools.lru_cache(maxsize=64)
def muon_flops_per_step(config: ModelConfig) -> float:
    """FLOPs of torch.optim.Muon's Newton–Schulz orthogonalisation in one optimizer step: for each
    Muon matrix, m x n with m <= n (transposed if taller), each of ns_steps iterations computes
    A = X·Xᵀ (2·m²·n), B = b·A + c·A·A (2·m³) and X = a·X + B·X (2·m²·n):

        ns_steps · Σ (4·m²·n + 2·m³)

    Every DDP rank orthogonalises every matrix (the update is not sharded), so this is per rank,
    however many ranks share the batch."""
    ns_steps = inspect.signature(torch.optim.Muon).parameters["ns_steps"].default
    with torch.device("meta"):
        model = GPT(config)
    total = 0
    for name, parameter in model.named_parameters():
        if is_muon_matrix(name, parameter):
            m, n = sorted(parameter.shape)
            total += 4 * m * m * n + 2 * m ** 3
    return float(ns_steps * total)


def training_flops(config: ModelConfig, tokens: int) -> dict[str, float]:
    """FLOPs of training on `tokens` tokens: the 6·N·D term, the attention term, their total."""
    weights = 6 * matmul_parameters(config) * tokens
    attention = attention_flops_per_token(config) * tokens
    return {"6ND": float(weights), "attention": float(attention), "total": float(weights + attention)}


# ---- memory -----------------------------------------------------------------------------------

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
    return 4 * _counts(config)["total"] + optimizer_state_bytes(config, optimizer)


# ---- plans ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VariantPlan:
    label: str
    params: int
    matmul_params: int
    steps: int
    tokens: int
    flops: dict[str, float]
    wall_s: float
    checkpoint_bytes: int
    memory: dict[str, Memory]  # by strategy, per device
    fits: bool  # under the plan's strategy
    mfu: float  # the assumed one, or the one a measured step implies
    step: StepTime | None = None  # measured here, or None (wall time from FLOPs at an assumed MFU)


@dataclass(frozen=True)
class StudyPlan:
    variants: list[VariantPlan]
    devices: Devices
    strategy: str
    mfu: float
    batch_size: int
    micro_batch: int
    grad_accum: int
    seq_len: int
    seeds: int
    optimizer: str
    dtype: str
    suggestions: list[str] = field(default_factory=list)
    jobs: int = 1  # runs trained at once (each a model in memory)
    timing_note: str = ""  # the machine's state when steps were measured

    @property
    def measured(self) -> bool:
        return all(v.step is not None for v in self.variants)

    @property
    def total_flops(self) -> float:
        return self.seeds * sum(v.flops["total"] for v in self.variants)

    @property
    def total_wall_s(self) -> float:
        """Every run's wall time, `jobs` of them at a time."""
        return self.seeds * sum(v.wall_s for v in self.variants) / self.jobs

    @property
    def total_checkpoint_bytes(self) -> int:
        return self.seeds * sum(v.checkpoint_bytes for v in self.variants)

    @property
    def fits(self) -> bool:
        return all(v.fits for v in self.variants)


def micro_batch_size(batch_size: int, world_size: int, grad_accum: int) -> int:
    """Sequences per device per forward pass: the global batch over devices and accumulation."""
    if grad_accum < 1 or batch_size % (world_size * grad_accum):
        raise PlanError(f"batch_size = {batch_size} is not divisible by devices x grad_accum = "
                        f"{world_size} x {grad_accum}")
    return batch_size // (world_size * grad_accum)


def study_plan(variants: list[ModelConfig], train_config, devices: Devices, *, tokens: int | None = None,
               grad_accum: int = 1, strategy: str = "ddp", mfu: float = 0.4, seeds: int = 1,
               check: bool = True, step_times: dict[str, StepTime] | None = None, jobs: int = 1,
               timing_note: str = "") -> StudyPlan:
    """Plan training every config in `variants` (`seeds` runs each) with `train_config`
    (steps, global batch_size, optimizer, dtype) on `devices`; `tokens` replaces the step count
    with ceil(tokens / (batch_size · seq_len)) steps. With `check`, a plan whose largest variant
    does not fit raises PlanError naming the setups that would.

    Wall time: from `step_times` (label -> a step measured here: `run_seconds`, evaluations
    included) when given, else FLOPs / (devices · peak · mfu). `jobs` runs train at once: the
    total divides by it and memory multiplies by it (every model a study keeps in memory)."""
    if not 0 < mfu <= 1:
        raise PlanError(f"mfu = {mfu} is invalid: must be in (0, 1]")
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy = {strategy!r} is invalid: allowed values are {', '.join(STRATEGIES)}")
    seq_len = variants[0].seq_len
    if any(config.seq_len != seq_len for config in variants):
        raise PlanError(f"variants have different seq_len ({sorted({c.seq_len for c in variants})}): plan them "
                        "separately")
    tokens_per_step = train_config.batch_size * seq_len
    steps = math.ceil(tokens / tokens_per_step) if tokens is not None else train_config.steps
    micro = micro_batch_size(train_config.batch_size, devices.count, grad_accum)
    plans = []
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise PlanError(f"jobs = {jobs!r} is invalid: must be a positive integer")
    for config in variants:
        flops = training_flops(config, steps * tokens_per_step)
        # the optimizer's own FLOPs, per rank (not in "total": MFU counts the model's FLOPs alone)
        flops["optimizer"] = steps * muon_flops_per_step(config) if train_config.optimizer == "muon" else 0.0
        memory = {s: memory_per_device(config, micro, devices.count, s, train_config.optimizer, train_config.dtype)
                  for s in STRATEGIES}
        step = (step_times or {}).get(config.label)
        wall_s = (run_seconds(step, train_config, steps) if step  # a measured step includes the optimizer's
                  else (flops["total"] / devices.count + flops["optimizer"]) / (devices.peak_flops * mfu))
        plans.append(VariantPlan(
            label=config.label, params=_counts(config)["total"], matmul_params=matmul_parameters(config),
            steps=steps, tokens=steps * tokens_per_step, flops=flops, wall_s=wall_s,
            checkpoint_bytes=checkpoint_bytes(config, train_config.optimizer), memory=memory,
            fits=jobs * memory[strategy].total <= devices.usable_bytes,
            mfu=model_flops_utilization(config, tokens_per_step / step.seconds, devices.count * devices.peak_flops)
            if step else mfu, step=step))
    plan = StudyPlan(plans, devices, strategy, mfu, train_config.batch_size, micro, grad_accum, seq_len, seeds,
                     train_config.optimizer, train_config.dtype, jobs=jobs, timing_note=timing_note)
    if plan.fits:
        return plan
    largest = max(variants, key=lambda c: memory_per_device(c, micro, devices.count, strategy,
                                                            train_config.optimizer, train_config.dtype).total)
    plan = replace(plan, suggestions=fitting_setups(largest, plan))
    if check:
        needed = max(v.memory[strategy].total for v in plans)
        raise PlanError(
            f"{largest.label} needs {needed / GiB:.1f} GiB per device with {strategy.upper()} on {devices.count} x "
            f"{devices.name} ({devices.usable_bytes / GiB:.1f} GiB usable each); would fit: "
            + _would_fit(plan.suggestions))
    return plan


def fitting_setups(config: ModelConfig, plan: StudyPlan) -> list[str]:
    """Setups under which `config` fits, each with the command-line options that choose it (of
    `headlab train` and `headlab reproduce` alike): the other strategy on the same devices, a
    smaller micro-batch with more gradient accumulation (same global batch), and the fewest
    devices that fit with FSDP (which trains with AdamW: Muon needs whole matrices)."""
    def fits(micro: int, world: int, strategy: str) -> bool:
        optimizer = "adamw" if strategy == "fsdp" else plan.optimizer
        return memory_per_device(config, micro, world, strategy, optimizer,
                                 plan.dtype).total <= plan.devices.usable_bytes

    with_adamw = " with AdamW" if plan.optimizer != "adamw" else ""

    def options(strategy: str, grad_accum: int) -> str:
        chosen = [f"--parallel {strategy}"] + (["--optimizer adamw"] if strategy == "fsdp" and with_adamw else [])
        return " ".join(chosen + [f"--grad-accum {grad_accum}"])

    found = []
    n, batch = plan.devices.count, plan.batch_size
    if plan.strategy == "ddp" and n > 1 and fits(plan.micro_batch, n, "fsdp"):
        found.append(f"FSDP{with_adamw} on the same {n} devices ({options('fsdp', plan.grad_accum)})")
    micro = plan.micro_batch // 2
    while micro >= 1 and not (batch % (n * micro) == 0 and fits(micro, n, plan.strategy)):
        micro //= 2
    if micro >= 1:
        found.append(f"micro-batch {micro} with gradient accumulation {batch // (n * micro)} "
                     f"({plan.strategy.upper()} on {n} devices: {options(plan.strategy, batch // (n * micro))})")
    for world in range(n + 1, min(batch, MAX_SUGGESTED_DEVICES) + 1):
        if batch % world:
            continue
        micro = max((m for m in range(1, min(plan.micro_batch, batch // world) + 1) if (batch // world) % m == 0))
        if fits(micro, world, "fsdp"):
            found.append(f"FSDP{with_adamw} on {world} x {plan.devices.name} (micro-batch {micro}, "
                         f"gradient accumulation {batch // (world * micro)}: {world} processes, "
                         f"{options('fsdp', batch // (world * micro))})")
            break
    return found


def _would_fit(suggestions: list[str]) -> str:
    return "; ".join(suggestions) or f"nothing up to {MAX_SUGGESTED_DEVICES} devices"


# ---- text ------------------------------------------------------------------------------------

def _si(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} "


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def format_bytes(n: float) -> str:
    """A byte count for a person: '512 B', '1.5 KiB', ... '72.0 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def format_plan(plan: StudyPlan) -> str:
    """The plan as a text table, one row per variant, with totals and the formulas used."""
    d = plan.devices
    first = plan.variants[0]
    if plan.measured:
        timing = (f"wall time from a step of each variant measured here on {first.step.threads} thread(s), "
                  f"{plan.jobs} run(s) at once, evaluations included; MFU is what that step implies")
    else:
        timing = f"wall time at an assumed {100 * plan.mfu:.0f}% MFU"
    lines = [
        f"plan: {len(plan.variants)} variant(s) x {plan.seeds} seed(s) on {d.count} x {d.name} "
        f"({format_bytes(d.memory_bytes)}, peak {_si(d.peak_flops)}FLOP/s {d.peak_source}), "
        f"{plan.strategy.upper()}, {plan.optimizer}, {plan.dtype}",
        f"budget per run: {first.steps:,} steps x {plan.batch_size} sequences x {plan.seq_len} tokens = "
        f"{_si(first.tokens)} tokens; micro-batch {plan.micro_batch} per device, gradient accumulation "
        f"{plan.grad_accum}",
        "FLOPs = 6·N·D + 6·L·H·(d_qk+d_v)·(T/2)·D, N = parameters without the input embedding; " + timing,
    ]
    if first.flops["optimizer"]:
        share = max(v.flops["optimizer"] / (v.flops["total"] / d.count) for v in plan.variants)
        lines.append(f"Muon's Newton–Schulz orthogonalisation: every rank runs it on every matrix, up to "
                     f"+{100 * share:.0f}% of a rank's model FLOPs; counted in the wall time, not in MFU")
    lines.append("")
    step_column = f"{'ms/step':>9}" if plan.measured else ""
    header = (f"{'variant':<20}{'params':>11}{'N':>11}{'6·N·D':>11}{'+attn':>7}{'FLOPs':>11}{step_column}{'MFU':>6}"
              f"{'wall':>9}{'checkpoint':>12}{'DDP/dev':>10}{'FSDP/dev':>10}  fits")
    lines += [header, "-" * len(header)]
    for v in plan.variants:
        step = f"{1000 * v.step.seconds:>9.1f}" if plan.measured else ""
        lines.append(
            f"{v.label:<20}{_si(v.params):>11}{_si(v.matmul_params):>11}{v.flops['6ND']:>11.3g}"
            f"{100 * v.flops['attention'] / v.flops['6ND']:>6.1f}%{v.flops['total']:>11.3g}{step}{100 * v.mfu:>5.0f}%"
            f"{_duration(v.wall_s):>9}{format_bytes(v.checkpoint_bytes):>12}{format_bytes(v.memory['ddp'].total):>10}"
            f"{format_bytes(v.memory['fsdp'].total):>10}  {'yes' if v.fits else 'NO'}")
    at_once = f" ({plan.jobs} runs at once: {plan.jobs} models in memory)" if plan.jobs > 1 else ""
    lines += ["", f"total: {plan.total_flops:.3g} FLOPs, {_duration(plan.total_wall_s)} of training{at_once}, "
              f"{format_bytes(plan.total_checkpoint_bytes)} of checkpoints; {format_bytes(d.usable_bytes)} usable "
              "per device"]
    if plan.measured:
        spread = max(v.step.spread for v in plan.variants)
        lines.append(f"measured with {plan.timing_note}; repeated steps differed by up to {100 * spread:.0f}%")
    if not plan.fits:
        lines.append("does not fit; would fit: " + _would_fit(plan.suggestions))
    return "\n".join(lines)


# ---- command line -----------------------------------------------------------------------------

def _positive(kind):
    """An argparse type: a finite number of `kind` above 0."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (math.isfinite(value) and 0 < value < 2 ** 62):
            raise argparse.ArgumentTypeError(f"{text} is invalid: must be a finite number above 0")
        return value
    return parse


def add_plan_arguments(parser, tokens: bool = True) -> None:
    """The --plan options of `headlab train` (and, without --plan-tokens since it has --tokens,
    `headlab reproduce`)."""
    parser.add_argument("--plan", action="store_true", help="print parameters, FLOPs, wall time, checkpoint "
                        "disk and memory per device, then exit without training")
    parser.add_argument("--plan-gpus", metavar="NxGPU",
                        help="plan for these GPUs instead of the visible devices, e.g. 8xH100")
    parser.add_argument("--plan-mfu", type=_positive(float), default=0.4, metavar="F",
                        help="assumed model FLOPs utilisation (default: %(default)s)")
    parser.add_argument("--plan-peak-tflops", type=_positive(float), metavar="TFLOPS",
                        help="peak TFLOP/s per device (default: the data-sheet table, or measured)")
    if tokens:
        parser.add_argument("--plan-tokens", type=_positive(int), metavar="N",
                            help="training tokens per run (default: the preset's steps x batch x context)")


def plan_for_args(args, variants: list[ModelConfig], train_config, seeds: int = 1, check: bool = True,
                  jobs: int = 1) -> StudyPlan:
    """The plan for parsed `add_plan_arguments` options under the training's own `parallel`
    strategy and `grad_accum` (with `check`, raises PlanError if it cannot fit). Planning this
    CPU (no --plan-gpus, no GPU), the wall time comes from a measured step of every variant on
    the `RUN_THREADS` each of `jobs` runs gets; planning GPUs, from FLOPs at --plan-mfu."""
    devices = (parse_devices(args.plan_gpus, args.plan_peak_tflops) if args.plan_gpus
               else visible_devices(args.plan_peak_tflops, train_config.dtype))
    step_times, note = None, ""
    if devices.name == "cpu" and not args.plan_peak_tflops:
        note = load_note()
        step_times = {config.label: measure_step(config, train_config.replace(device="cpu"), RUN_THREADS)
                      for config in variants}
    return study_plan(variants, train_config, devices, tokens=getattr(args, "plan_tokens", None),
                      grad_accum=train_config.grad_accum, strategy=train_config.parallel, mfu=args.plan_mfu,
                      seeds=seeds, check=check, step_times=step_times, jobs=jobs, timing_note=note)


def plan_from_args(args, variants: list[ModelConfig], train_config, seeds: int = 1) -> str:
    """The formatted plan for parsed `add_plan_arguments` options (raises PlanError if it cannot fit)."""
    return format_plan(plan_for_args(args, variants, train_config, seeds))
