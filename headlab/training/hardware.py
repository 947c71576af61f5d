"""What the devices can do: their data-sheet peaks, the peak this machine measures, and one
training step timed here (what a plan's wall time on this machine is made of)."""

from __future__ import annotations

import functools
import gc
import math
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from headlab.data.shards import random_windows
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT
from headlab.training.compiling import compile_backend, compiled_forward
from headlab.training.distributed import training_device
from headlab.training.flops import rank_training_flops
from headlab.training.gpus import GPU_PEAKS, gpu_peak
from headlab.training.memory import USABLE_MEMORY_FRACTION, GiB, PlanError, memory_per_device, micro_batch_size
from headlab.training.optimizers import make_optimizers
from headlab.training.processes import Processes, launched_processes
from headlab.training.sharding import OptimizerStep
from headlab.training.trainer import collecting_only_what_is_made_within, on_device


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


def parse_devices(spec: str, peak_tflops: float | None = None, dtype: str = "bfloat16") -> Devices:
    """Devices from a spec like '8xH100', 'H200' or '4xA100-SXM4-40GB' (GPU_PEAKS names), for
    planning a machine this one is not, at their peak in the training `dtype`."""
    count_text, separator, name = spec.partition("x")
    if not separator or not count_text.isdigit():
        count_text, name = "1", spec
    known = gpu_peak(name, dtype)
    if known is None:
        raise PlanError(f"devices = {spec!r} is invalid: write [N x]GPU, e.g. 8xH100, with GPU one of "
                        f"{', '.join(row[0] for row in GPU_PEAKS)}")
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


@functools.cache
def cpu_peak_flops(dtype: torch.dtype, threads: int) -> float:
    """`measure_peak_flops` of this CPU in `dtype` on `threads` torch threads, measured once per
    process: a session that plans many studies (a notebook, the CLI called in-process) would
    otherwise spend a second re-measuring the same peak for each."""
    return measure_peak_flops("cpu", dtype)


def visible_devices(peak_tflops: float | None = None, dtype: str = "bfloat16") -> Devices:
    """The GPUs torch sees (their table peak unless `peak_tflops` is stated), or this CPU with
    its measured matmul peak in the training dtype (or the stated one) and its RAM."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
        known = gpu_peak(name, dtype)
        if peak_tflops:
            return Devices(name, count, memory, peak_tflops * 1e12, "stated")
        if known is None:
            raise PlanError(f"GPU {name!r} has no entry in headlab.training.gpus.GPU_PEAKS: state its dense "
                            f"{'bf16' if dtype == 'bfloat16' else 'fp32 (TF32)'} peak with --plan-peak-tflops")
        return Devices(name, count, memory, known[1] * 1e12, "table")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if peak_tflops:
        return Devices("cpu", 1, memory, peak_tflops * 1e12, "stated")
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    return Devices("cpu", 1, memory, cpu_peak_flops(torch_dtype, torch.get_num_threads()), "measured")


@dataclass(frozen=True)
class StepTime:
    """One model's training step measured here: `seconds`, the median of the repeats; `spread`,
    (slowest − fastest) / median, how steady the machine was while measuring; `eval_seconds`,
    one evaluation batch (forward only); `threads`, the torch threads it ran on."""

    seconds: float
    spread: float
    eval_seconds: float
    threads: int


WARMUP_STEPS = 2  # steps `measure_step` runs before it times any
TIMED_STEPS = 5  # steps it times by default, after the warm-up
TIMING_STEPS = WARMUP_STEPS + TIMED_STEPS  # steps a default timing trains in all


@collecting_only_what_is_made_within()
def measure_step(config: ModelConfig, train_config, threads: int | None = None, repeats: int = TIMED_STEPS,
                 processes: Processes | None = None) -> StepTime:
    """Time one rank's step of the trainer for `config` at `train_config`'s optimizer and dtype on
    that rank's device (`training_device` of its LOCAL_RANK: CPU unless CUDA is asked for or
    `auto` finds one): `grad_accum` forwards and backwards of the per-rank micro-batch,
    batch_size / (world_size · grad_accum) random windows each, then gradient clipping and the
    optimizer update, `repeats` times after `WARMUP_STEPS` warm-up steps, with `threads` torch threads
    (default: the current count; a study's workers use cpu_count / jobs). The evaluation batch is
    the rank's share, batch_size / world_size. `processes` defaults to torchrun's environment.
    Gradient exchange between ranks is not timed. The model and its optimizer state are freed
    (and, on a GPU, the allocator's cache emptied) before this returns, so training finds the
    device's memory as it was. The step is compiled as training compiles it
    (`headlab.training.compiling`: a backend that fails here is not tried again in training):
    the warm-up steps take the compile, which the timing leaves out; one process reuses these
    graphs in training, while under torchrun's DDP they are compiled apart from those of the
    DDP step (`_compiles_as_training`). This is what a plan's wall time on this machine is made of."""
    processes = processes or launched_processes()
    micro = micro_batch_size(train_config.batch_size, processes.world_size, train_config.grad_accum)
    local_batch = train_config.batch_size // processes.world_size
    device = training_device(train_config.device, processes.local_rank)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    model = forward = optimizers = step_optimizers = None
    try:
        model = GPT(config).to(device)
        backend, not_compiled = compile_backend(train_config.compile, device, train_config.dtype,
                                                rank_training_flops(config, train_config, processes.world_size))
        if not_compiled:
            print(not_compiled)
        forward = compiled_forward(model if _compiles_as_training(processes, train_config) else _apart(model),
                                   train_config.compile, backend, print)
        optimizers = make_optimizers(model, train_config)
        step_optimizers = OptimizerStep(model, optimizers)  # one rank's whole step (a sharded rank steps 1/ranks)
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
                    loss = forward(micro_x, micro_y, loss_only=True)
                (loss / train_config.grad_accum).backward()
            step_optimizers(train_config.grad_clip)
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)

        @torch.no_grad()
        def eval_step(x, y):
            with autocast:
                model(x, y)

        steps = [timed(train_step, micro * train_config.grad_accum)
                 for _ in range(WARMUP_STEPS + repeats)][WARMUP_STEPS:]
        evals = [timed(eval_step, local_batch) for _ in range(3)][1:]
    finally:
        torch.set_num_threads(previous)
        del model, forward, optimizers, step_optimizers
        gc.collect()
        torch.cuda.empty_cache()  # a no-op unless CUDA was used
    median = statistics.median(steps)
    return StepTime(median, (max(steps) - min(steps)) / median, statistics.median(evals), threads or previous)


def _compiles_as_training(processes: Processes, train_config) -> bool:
    """Whether training compiles the plain model as `measure_step` would: one process, or FSDP
    (which compiles each block apart). Under DDP it compiles the DDP-wrapped model, and dynamo
    splits that graph at DDP's all-reduce buckets (DDPOptimizer) only when it compiles
    `GPT.forward` inside DDP's forward. A graph compiled here for `GPT.forward` would sit in
    dynamo's cache of that function, be served to the DDP step unsplit, and every gradient
    all-reduce would wait for the whole backward."""
    return processes.world_size == 1 or train_config.parallel == "fsdp"


def _apart(model: torch.nn.Module):
    """`model` called through a function of its own, whose compiled graphs dynamo keeps with
    that function, not with `GPT.forward` (inlined into them)."""

    def timed(*args, **kwargs):
        return model(*args, **kwargs)
    return timed


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
