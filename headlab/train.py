"""The trainer: `train(model_config, train_config, data, out=...)`.

AdamW (decay on matrices only), or the paper's Muon + AdamW split; linear warmup then cosine
decay; gradient clipping; bf16 autocast and optional torch.compile on GPU; periodic validation
in nats/token and bits per byte; runs that never lose work (see `headlab.runs`); and
DistributedDataParallel under `torchrun` (NCCL on GPUs, gloo on CPU) with one global batch
split across ranks, so N processes follow the single-process loss curve.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from .config import ModelConfig
from .data import Corpus, load_corpus, random_windows
from .model import GPT
from .runs import MetricsLog, Run, load_checkpoint, save_checkpoint, write_run_config

OPTIMIZERS = ("adamw", "muon")
DTYPES = ("float32", "bfloat16")


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run folder keeps the last good checkpoint."""


@dataclass(frozen=True)
class TrainConfig:
    """How to train. `batch_size` is the global batch in sequences (split across ranks)."""

    steps: int = 350
    batch_size: int = 16
    optimizer: str = "adamw"
    lr: float = 3e-3  # AdamW: every parameter
    matrix_lr: float = 0.02  # Muon: 2-D weights inside the blocks
    embedding_lr: float = 0.2  # Muon split: AdamW on the embedding
    unembedding_lr: float = 0.004  # Muon split: AdamW on the output head
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 16
    checkpoint_every: int = 100
    log_every: int = 10
    dtype: str = "float32"
    compile: bool = False
    device: str = "auto"
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_batches", "checkpoint_every", "log_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} = {getattr(self, name)!r} is invalid: must be a positive integer")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer = {self.optimizer!r} is invalid: allowed values are {', '.join(OPTIMIZERS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"TrainConfig.dtype = {self.dtype!r} is invalid: allowed values are {', '.join(DTYPES)}")
        for name in ("lr", "matrix_lr", "embedding_lr", "unembedding_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TrainConfig.{name} = {getattr(self, name)!r} is invalid: must be positive")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"TrainConfig.min_lr_ratio = {self.min_lr_ratio!r} is invalid: must be in [0, 1]")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("TrainConfig.warmup_steps, weight_decay and grad_clip must be >= 0")

    def replace(self, **changes) -> "TrainConfig":
        return TrainConfig(**{**asdict(self), **changes})

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TrainConfig has no field(s) {unknown}; allowed fields are {sorted(known)}")
        return cls(**data)


# Training settings that go with the model presets. The paper's (§3.2-3.3): context 2048,
# 32 sequences per step, warmup 2000, Muon for matrices (lr 0.02) + AdamW for the embedding
# (0.2) and head (0.004), wd 0.1, clip 1.0, bf16.
TRAIN_PRESETS: dict[str, TrainConfig] = {
    "tiny": TrainConfig(steps=40, batch_size=8, warmup_steps=5, eval_every=20, eval_batches=2,
                        checkpoint_every=20, log_every=5),
    "cpu-small": TrainConfig(),
    **{name: TrainConfig(steps=50_000, batch_size=32, optimizer="muon", warmup_steps=2000, weight_decay=0.1,
                         grad_clip=1.0, dtype="bfloat16", eval_every=1000, eval_batches=50, checkpoint_every=1000,
                         log_every=50)
       for name in ("paper-128m", "paper-1.2b", "paper-2.5b", "paper-6.3b")},
}


def train_preset(name: str, **overrides) -> TrainConfig:
    if name not in TRAIN_PRESETS:
        raise ValueError(f"preset {name!r} is unknown: allowed presets are {', '.join(TRAIN_PRESETS)}")
    return TRAIN_PRESETS[name].replace(**overrides)


def learning_rate_factor(step: int, config: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to `min_lr_ratio` at the last step."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizers(model: GPT, config: TrainConfig) -> list[torch.optim.Optimizer]:
    """AdamW with weight decay on matrices only; or Muon on the blocks' 2-D weights with AdamW
    for embedding, head, norms and LRKV's 3-D B tensors (torch's Muon takes 2-D only).

    AdamW is torch's fused kernel (CPU and CUDA since torch 2.4): one pass over all parameters
    instead of a dozen per tensor, about 4 ms less per `cpu-small` step."""
    betas = (0.9, 0.95)
    if config.optimizer == "adamw":
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        return [torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=config.lr, betas=betas,
                                  fused=True)]
    muon = [p for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2]
    muon_ids = {id(p) for p in muon}
    other = [p for n, p in model.named_parameters()
             if id(p) not in muon_ids and not n.startswith(("wte.", "lm_head."))]
    adam_groups = [
        {"params": list(model.wte.parameters()), "lr": config.embedding_lr, "weight_decay": 0.0},
        {"params": list(model.lm_head.parameters()), "lr": config.unembedding_lr, "weight_decay": 0.0},
        {"params": other, "lr": config.lr, "weight_decay": 0.0},
    ]
    return [torch.optim.Muon(muon, lr=config.matrix_lr, weight_decay=config.weight_decay),
            torch.optim.AdamW(adam_groups, betas=betas, fused=True)]


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_cpu_memory() -> bool:
    """Let glibc's malloc keep freed activation buffers mapped instead of returning them to the OS.

    By default glibc serves blocks above its mmap threshold (128 KiB, adapting up to 32 MiB)
    with fresh pages and gives the heap's top back above the trim threshold, so every CPU
    training step page-faults its activations anew (1,000 to 7,000 faults per `cpu-small`
    forward and backward). Raising both thresholds keeps those pages: once the heap has grown
    to a step's high-water mark, about one fault per step, and steps roughly 10 % faster.
    Process-wide and idempotent; returns False where the C library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def _set_learning_rates(optimizers, factor: float) -> None:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group.setdefault("base_lr", group["lr"])
            group["lr"] = group["base_lr"] * factor


@dataclass
class _Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _setup_distributed(device_type: str) -> _Distributed:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return _Distributed()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return _Distributed(dist.get_rank(), world_size, int(os.environ.get("LOCAL_RANK", "0")))


def _resolve_device(config: TrainConfig, local_rank: int) -> torch.device:
    if config.device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(config.device)


@torch.no_grad()
def evaluate(model: torch.nn.Module, shards: list[np.ndarray], batch_size: int, seq_len: int,
             n_batches: int, device, autocast=nullcontext(), rows: slice = slice(None), seed: int = 1234) -> float:
    """Mean cross-entropy (nats/token) over `n_batches` seeded random windows (the same
    windows every time, so evaluations are comparable across steps and runs). Under DDP each
    rank scores its `rows` of every batch."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(n_batches):
        x, y = random_windows(shards, batch_size, seq_len, generator)
        with autocast:
            total += model(x[rows].to(device), y[rows].to(device))[1].item()
    model.train(was_training)
    return total / n_batches


def train(model_config: ModelConfig, train_config: TrainConfig | None = None, data: Corpus | str = "synthetic",
          out: str | Path | None = None, resume: bool = False, progress: bool = True) -> Run:
    """Train a GPT and return the `Run` (model, configs, metrics).

    With `out`, the run folder receives config.json, then checkpoints (model.safetensors and
    state.pt) every `checkpoint_every` steps and at the end, and metrics.jsonl as it goes.
    `resume=True` continues from the folder's last checkpoint; on CPU the resumed loss curve
    equals the uninterrupted one exactly. A NaN/inf loss raises `TrainingDiverged` and
    leaves the last good checkpoint in place.
    """
    train_config = train_config or TrainConfig()
    corpus = load_corpus(data) if isinstance(data, str) else data
    if corpus.vocab_size > model_config.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size = {model_config.vocab_size} is smaller than the "
                         f"{corpus.tokenizer_name} tokenizer's vocabulary ({corpus.vocab_size})")
    device = _resolve_device(train_config, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cpu":
        keep_freed_cpu_memory()
    ddp = _setup_distributed(device.type)
    if train_config.batch_size % ddp.world_size:
        raise ValueError(f"TrainConfig.batch_size = {train_config.batch_size} must be divisible by the "
                         f"number of processes ({ddp.world_size})")
    run_dir = Path(out) if out is not None else None

    torch.manual_seed(train_config.seed)
    model = GPT(model_config).to(device)
    optimizers = make_optimizers(model, train_config)
    generator = torch.Generator().manual_seed(train_config.seed)
    start_step = 0
    metrics = MetricsLog(run_dir / "metrics.jsonl" if run_dir is not None and ddp.is_main else None)
    if run_dir is not None and resume and (run_dir / "state.pt").exists():
        start_step = load_checkpoint(run_dir, model, optimizers, generator, model_config, train_config)
        metrics.truncate_after(start_step)
    elif run_dir is not None and ddp.is_main:
        if (run_dir / "model.safetensors").exists() and not resume:
            raise FileExistsError(f"{run_dir} already holds a run: resume it (resume=True, --resume) or choose another folder")
        write_run_config(run_dir, model_config, train_config, corpus)
        metrics.reset()

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if train_config.dtype == "bfloat16"
                else nullcontext())
    step_model = model
    if ddp.world_size > 1:
        step_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if train_config.compile and device.type == "cuda":
        step_model = torch.compile(step_model)

    local_batch = train_config.batch_size // ddp.world_size
    tokens_per_step = train_config.batch_size * model_config.seq_len
    bar = tqdm(range(start_step, train_config.steps), initial=start_step, total=train_config.steps,
               desc=model_config.label, disable=not (progress and ddp.is_main), dynamic_ncols=True)
    started, last_log = time.perf_counter(), time.perf_counter()
    step = start_step
    for step in bar:
        _set_learning_rates(optimizers, learning_rate_factor(step, train_config))
        x, y = random_windows(corpus.train, train_config.batch_size, model_config.seq_len, generator)
        rows = slice(ddp.rank * local_batch, (ddp.rank + 1) * local_batch)
        with autocast:
            _, loss = step_model(x[rows].to(device), y[rows].to(device))
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
        loss_value = _global_mean(loss.detach(), ddp)
        if not math.isfinite(loss_value):
            raise TrainingDiverged(
                f"loss is {loss_value} at step {step}; the run folder keeps the checkpoint from before it"
                if run_dir is not None else f"loss is {loss_value} at step {step}")
        for optimizer in optimizers:
            optimizer.step()
        done = step + 1
        if done % train_config.log_every == 0 or done == train_config.steps:
            now = time.perf_counter()
            tokens_per_s = tokens_per_step * min(train_config.log_every, done - start_step) / (now - last_log)
            last_log = now
            metrics.append({"step": done, "tokens": done * tokens_per_step, "train_loss": loss_value,
                            "lr_factor": learning_rate_factor(step, train_config), "tokens_per_s": tokens_per_s,
                            "elapsed_s": now - started})
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        if done % train_config.eval_every == 0 or done == train_config.steps:
            val_loss = evaluate(model, corpus.val, train_config.batch_size, model_config.seq_len,
                                train_config.eval_batches, device, autocast, rows)
            val_loss = _global_mean(torch.tensor(val_loss, device=device), ddp)
            metrics.append({"step": done, "tokens": done * tokens_per_step, "val_loss": val_loss,
                            "val_bpb": val_loss / math.log(2) / corpus.bytes_per_token})
        if run_dir is not None and ddp.is_main and (done % train_config.checkpoint_every == 0 or done == train_config.steps):
            save_checkpoint(run_dir, model, optimizers, generator, done)
    bar.close()
    if ddp.world_size > 1:
        dist.barrier()
    return Run(model=model.eval(), model_config=model_config, train_config=train_config,
               step=train_config.steps, metrics=metrics.records, path=run_dir)


def _global_mean(value: torch.Tensor, ddp: _Distributed) -> float:
    if ddp.world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= ddp.world_size
    return value.item()
