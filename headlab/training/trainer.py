"""The trainer: `train(model_config, train_config, data, out=...)`.

AdamW (decay on matrices only), or the paper's Muon + AdamW split (`headlab.training.optimizers`);
linear warmup then cosine decay; gradient clipping; bf16 autocast; torch.compile where it can
run (`headlab.training.compiling`); periodic validation in nats/token and bits per byte; runs
that never lose work (see `headlab.runs.folder`); and under `torchrun` (NCCL on GPUs, gloo on
CPU) DistributedDataParallel or, for models that do not fit one device, FSDP2 (`fully_shard`
per block). One global batch is split across ranks and then into `grad_accum` micro-batches,
so every setting follows the single-process loss curve.
"""

from __future__ import annotations

import ctypes
import gc
import math
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from headlab.data.corpus import load_corpus
from headlab.data.shards import Corpus, random_windows, read_shards
from headlab.model.config import ModelConfig
from headlab.model.gpt import GPT, build_for_loading, eval_mode, initial_model
from headlab.runs.checkpoints import gather_training_state, is_fsdp_module
from headlab.runs.divergence import Divergence, is_diverged
from headlab.runs.folder import RunFolder
from headlab.training.compiling import compile_backend, compiled_forward, first_step_compiling
from headlab.training.config import TrainConfig
from headlab.training.distributed import (
    as_rank_0_decided,
    failing_alone,
    join_process_group,
    on_local_main,
    together,
    training_device,
    use_tf32_matmuls,
)
from headlab.training.flops import rank_training_flops
from headlab.training.optimizers import make_optimizers
from headlab.training.processes import Processes, launched_processes
from headlab.training.runs import Run
from headlab.training.sharding import OptimizerStep


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run folder keeps its last good checkpoint (if any) and
    its manifest records the divergence (`headlab.runs.divergence`)."""


def learning_rate_factor(step: int, config: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to `min_lr_ratio` at the last step."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_cpu_memory() -> bool:
    """Let glibc's malloc keep freed activation buffers mapped instead of returning them to the OS.

    By default glibc serves blocks above its mmap threshold (128 KiB, adapting up to 32 MiB)
    with fresh pages and gives the heap's top back above the trim threshold, so every CPU
    training step page-faults its activations anew (1,000 to 7,000 faults per `cpu-small`
    forward and backward). Raising both thresholds keeps those pages: once the heap has grown
    to a step's high-water mark, about one fault per step, and steps roughly 10 % faster.
    Process-wide and idempotent, so it is opt-in: `headlab.study.Study.train` and the command line
    call it; a plain `train()` leaves the process's allocator alone. Returns False where the C
    library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


GC_PASSES = 4  # collections at most, until one finds nothing


def free_finished_run() -> None:
    """Free what a finished run's dropped references leave behind before the next run builds
    its model: objects in reference cycles (an FSDP-sharded module and its FSDP state refer to
    each other, so without the cyclic collector each run would keep its shards, 6.4 GiB per rank
    at 6.3B), then CUDA's cached blocks, returned to the driver for the next run's differently
    sized tensors (only where this process has used CUDA). A collection can leave new garbage
    (after an FSDP run a second pass found ~1,100 more objects, and the model), hence the passes."""
    for _ in range(GC_PASSES):
        if not gc.collect():
            break
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_collecting_within = 0  # how many collecting_only_what_is_made_within blocks this process is inside


@contextmanager
def collecting_only_what_is_made_within():
    """Within it (a `with` block or a decorator), the cyclic collector passes over every object
    that was alive on entry (`gc.freeze`): garbage that the models trained or timed within leave
    can only be among the objects made since. A process that has imported torch, pandas and
    matplotlib (a notebook's kernel, the command line) holds about a million objects, and each full
    collection that frees a model (`free_finished_run`, `measure_step`) scanned them all, 0.1-0.2 s
    apiece: a quarter of a small study's training time in a notebook, most of a `--plan`. When the
    outermost block ends, every frozen object goes back to the collector (a freeze made before it
    too: `gc` cannot tell which objects that froze without counting them all, 0.06 s)."""
    global _collecting_within
    _collecting_within += 1
    gc.freeze()
    try:
        yield
    finally:
        _collecting_within -= 1
        if not _collecting_within:
            gc.unfreeze()


def _set_learning_rates(optimizers, factor: float) -> None:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor


def on_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`batch` on `device`. To a GPU through page-locked memory without blocking: the copy is
    queued behind the kernels already launched, so the host runs ahead to the next step. A
    strided view is made contiguous first: pinning keeps its strides, so it would lock all the
    memory the view spans and copy it to the GPU as a strided (slower) transfer."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.contiguous().pin_memory().to(device, non_blocking=True)


@torch.no_grad()
def evaluate(model: torch.nn.Module, shards: list[np.ndarray], batch_size: int, seq_len: int,
             n_batches: int, device, autocast=nullcontext(), rows: slice = slice(None), seed: int = 1234) -> float:
    """Mean cross-entropy (nats/token) over `n_batches` seeded random windows (the same
    windows every time, so evaluations are comparable across steps and runs). Under DDP each
    rank scores its `rows` of every batch."""
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    with eval_mode(model):
        for _ in range(n_batches):
            x, y = random_windows(shards, batch_size, seq_len, generator)
            with autocast:
                total += model(on_device(x[rows], device), on_device(y[rows], device))[1].item()
    return total / n_batches


def prepared_corpus(load: Callable[[], Corpus], device: str = "auto") -> Corpus:
    """`load()`, under torchrun once per node: local rank 0 tokenizes the corpus into the node's
    cache (or finds it there) and verifies every shard against its SHA-256 while the node's other
    ranks wait; they then memory-map the same shards without hashing them again (a 100B-token
    cache is 200 GB). A damaged cache ends every rank with local rank 0's one-line error."""
    processes = join_process_group(training_device(device, launched_processes().local_rank))
    loaded = []

    def load_and_locate() -> tuple[Path | None, str]:
        loaded.append(load())
        return loaded[0].folder, loaded[0].name

    folder, name = on_local_main(processes, load_and_locate)
    if loaded:
        return loaded[0]
    return read_shards(folder, name, verified_by_peer=True) if folder is not None else load()


def repetition_note(train_config: TrainConfig, seq_len: int, corpus: Corpus) -> str | None:
    """What to tell before training when the run reads more tokens than the corpus's training
    split holds (windows repeat); None when it does not."""
    trained = train_config.steps * train_config.batch_size * seq_len
    if trained <= corpus.n_train_tokens:
        return None
    return (f"note: each run trains on {trained:,} tokens, {trained / corpus.n_train_tokens:.1f} epochs of the "
            f"{corpus.n_train_tokens:,} unique training tokens of corpus {corpus.name!r}: windows repeat")


def train(model_config: ModelConfig, train_config: TrainConfig | None = None, data: Corpus | str = "synthetic",
          out: str | Path | None = None, resume: bool = False, progress: bool = True,
          observe: Callable[[torch.nn.Module, int], None] | None = None) -> Run:
    """Train a GPT and return the `Run` (model, configs, metrics).

    With `out`, the run folder receives config.json, metrics.jsonl as it goes, and a checkpoint
    every `checkpoint_every` steps or `checkpoint_minutes`, and at the end (see `headlab.runs.folder`);
    the folder is locked against a second trainer while this one runs. `resume=True` continues from the folder's
    last checkpoint (or from step 0 if it has none) after checking that the model, training and
    data settings match the saved run; on CPU the resumed loss curve equals the uninterrupted one
    exactly. A NaN/inf loss raises `TrainingDiverged` and leaves the last good checkpoint in place;
    a final validation loss worse than a uniform guess makes `Run.diverged` say so. Either is
    recorded in the run folder's manifest (`headlab.runs.divergence`).

    `observe(model, step)`, if given, is called on the main process at each snapshot step s (the
    weights after s updates, `TrainConfig.snapshot_every`) of the steps this call trains, in eval
    mode under no_grad: a probe that measures what snapshots do not keep (the whole model at s).
    It must neither change the model nor draw random numbers; training goes on exactly as without it.
    """
    train_config = train_config or TrainConfig()
    corpus = load_corpus(data) if isinstance(data, str) else data
    if corpus.vocab_size > model_config.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size = {model_config.vocab_size} is smaller than the "
                         f"{corpus.tokenizer_name} tokenizer's vocabulary ({corpus.vocab_size})")
    for split, shards in (("training", corpus.train), ("validation", corpus.val)):
        if max(len(shard) for shard in shards) <= model_config.seq_len:
            raise ValueError(f"ModelConfig.seq_len = {model_config.seq_len} is too long for corpus "
                             f"{corpus.name!r}: its "
                             f"{split} split has no window of {model_config.seq_len + 1} tokens; use a shorter "
                             "seq_len or a larger corpus")
    launched = launched_processes()
    if train_config.batch_size % (launched.world_size * train_config.grad_accum):
        raise ValueError(f"TrainConfig.batch_size = {train_config.batch_size} must be divisible by the number of "
                         f"processes x TrainConfig.grad_accum = {launched.world_size} x {train_config.grad_accum}")
    device = training_device(train_config.device, launched.local_rank)
    use_tf32_matmuls(device)
    ddp = join_process_group(device)
    with failing_alone(), RunFolder.open(out, model_config, train_config, corpus, resume, owner=ddp.is_main,
                                         together=lambda: together(ddp),
                                         decided=lambda choice: as_rank_0_decided(choice, ddp),
                                         verifies=ddp.local_rank == 0) as folder:
        return _train(model_config, train_config, corpus, device, ddp, folder, progress, observe)


def shard_per_block(model: GPT, train_config: TrainConfig, backend: str | None = None) -> None:
    """FSDP2: each block is one unit of parameters gathered for its forward and backward, the
    root (embedding, head) another. Under bf16 the gathered parameters are bf16 and gradients
    are reduced in fp32. With a compile `backend`, each block is compiled on its own."""

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # its DTensor imports: ~0.7 CPU-s

    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if train_config.dtype == "bfloat16" else MixedPrecisionPolicy())
    for block in model.blocks:
        if backend is not None:
            block.compile(backend=backend)
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def compiled_bucket_cap_mb(model: GPT) -> float:
    """DDP's all-reduce bucket under torch.compile: one block's gradients (MiB). DDPOptimizer
    splits the compiled graph at every bucket boundary, so torch's default 25 MiB buckets cut a
    2.5B model's graph ~400 times (each piece compiled and launched apart, fusions stopping at
    every cut); a block per bucket cuts it once per block, where FSDP's per-block compile cuts
    too, and each block's all-reduce still overlaps the backward of the blocks below it. At least
    DDP's first bucket (1 MiB): DDPOptimizer refuses buckets smaller than that one."""
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
    return max(block_bytes, dist._DEFAULT_FIRST_BUCKET_BYTES) / 2 ** 20


def _train(model_config: ModelConfig, train_config: TrainConfig, corpus: Corpus, device: torch.device,
           ddp: Processes, folder: RunFolder, progress: bool,
           observe: Callable[[torch.nn.Module, int], None] | None = None) -> Run:
    model = initial_model(model_config, train_config.seed).to(device)  # the same on every rank, whatever their number
    sharded = ddp.world_size > 1 and train_config.parallel == "fsdp"
    say = print if ddp.is_main else (lambda message: None)
    backend, not_compiled = compile_backend(train_config.compile, device, train_config.dtype,
                                            rank_training_flops(model_config, train_config, ddp.world_size))
    if not_compiled:
        say(not_compiled)
    if sharded:
        shard_per_block(model, train_config, backend)
    replicated = ddp.world_size > 1 and not sharded
    optimizers = make_optimizers(model, train_config)
    # DDP replicas hold the same gradients: each steps its share of the parameters (ZeRO-1)
    step_optimizers = OptimizerStep(model, optimizers, dist.group.WORLD if replicated else None)
    generator = torch.Generator().manual_seed(train_config.seed)
    start_step = folder.start(model, optimizers, generator, ddp.world_size, device)

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if train_config.dtype == "bfloat16"
                else nullcontext())
    step_model = model
    if replicated:
        # the only buffers are RoPE tables: nothing to broadcast. The gradients live in DDP's
        # all-reduce buckets (zeroed in place below, so they stay there): no second 4 B per parameter.
        buckets = {"bucket_cap_mb": compiled_bucket_cap_mb(model)} if backend is not None else {}
        step_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False,
            gradient_as_bucket_view=True, **buckets)
    synchronizing = _gradient_sync(step_model)
    # FSDP compiles each block (shard_per_block): its first step is compiled as compiled_forward's is
    forward = (FirstStep(step_model) if sharded and backend else step_model if sharded
               else compiled_forward(step_model, train_config.compile, backend, say))

    local_batch = train_config.batch_size // ddp.world_size
    n_micro = train_config.grad_accum
    tokens_per_step = train_config.batch_size * model_config.seq_len
    steps = range(start_step, train_config.steps)
    bar = (tqdm(steps, initial=start_step, total=train_config.steps, desc=model_config.label, dynamic_ncols=True)
           if progress and ddp.is_main else _HiddenBar(steps))
    started, last_log = time.perf_counter(), time.perf_counter()
    step = start_step
    # The first step whose (global mean) loss is not finite, and that loss, kept on the device and
    # read (one host sync) only before anything is logged, evaluated or saved: no sync per step.
    divergence = torch.full((2,), math.nan, device=device)

    def stop_if_diverged() -> None:
        bad_step, bad_loss = divergence.tolist()
        if not math.isnan(bad_step):
            folder.mark_diverged(Divergence(int(bad_step), bad_loss, corpus.vocab_size))
            raise TrainingDiverged(f"loss is {bad_loss} at step {int(bad_step)}{folder.kept()}")

    for step in bar:
        if folder.snapshot_due(step):
            stop_if_diverged()
        folder.snapshot(model, step)
        if observe is not None and ddp.is_main and folder.snapshot_due(step):
            with eval_mode(model), torch.no_grad():
                observe(model, step)
        _set_learning_rates(optimizers, learning_rate_factor(step, train_config))
        x, y = random_windows(corpus.train, train_config.batch_size, model_config.seq_len, generator)
        rows = slice(ddp.rank * local_batch, (ddp.rank + 1) * local_batch)
        for optimizer in optimizers:  # DDP's gradients are views of its buckets: zeroed, not dropped
            optimizer.zero_grad(set_to_none=not replicated)
        loss = torch.zeros((), device=device)
        x, y = on_device(x[rows], device), on_device(y[rows], device)
        for micro, (micro_x, micro_y) in enumerate(zip(x.chunk(n_micro), y.chunk(n_micro))):
            with synchronizing(micro == n_micro - 1):  # ranks exchange gradients once, after the last
                with autocast:
                    micro_loss = forward(micro_x, micro_y, loss_only=True)  # no logits kept (GPT.forward)
                (micro_loss / n_micro).backward()
            loss += micro_loss.detach() / n_micro
        loss = _global_mean(loss, ddp)
        divergence = torch.where(divergence[0].isnan() & ~loss.isfinite(),
                                 torch.stack((torch.full_like(loss, step), loss)), divergence)
        step_optimizers(train_config.grad_clip)
        done = step + 1
        checkpoint_due = folder.checkpoint_due(done)
        if (done % train_config.log_every == 0 or done % train_config.eval_every == 0 or done == train_config.steps
                or checkpoint_due):
            stop_if_diverged()
        if done % train_config.log_every == 0 or done == train_config.steps:
            loss_value = loss.item()
            now = time.perf_counter()
            tokens_per_s = tokens_per_step * min(train_config.log_every, done - start_step) / (now - last_log)
            last_log = now
            folder.log({"step": done, "tokens": done * tokens_per_step, "train_loss": loss_value,
                        "lr_factor": learning_rate_factor(step, train_config), "tokens_per_s": tokens_per_s,
                        "elapsed_s": now - started})
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        if done % train_config.eval_every == 0 or done == train_config.steps:
            val_loss = evaluate(model, corpus.val, train_config.batch_size, model_config.seq_len,
                                train_config.eval_batches, device, autocast, rows)
            val_loss = _global_mean(torch.tensor(val_loss, device=device), ddp).item()
            folder.log({"step": done, "tokens": done * tokens_per_step, "val_loss": val_loss,
                        "val_bpb": val_loss / math.log(2) / corpus.bytes_per_token})
            if done == train_config.steps and is_diverged(val_loss, corpus.vocab_size):
                folder.mark_diverged(Divergence(done, val_loss, corpus.vocab_size))  # before the final checkpoint
        if checkpoint_due:
            folder.checkpoint(model, optimizers, generator, done)
    bar.close()
    if ddp.world_size > 1:
        dist.barrier()
    if sharded:
        model = _whole_model_on_main(model, model_config, ddp, device)
    run = Run(model=model.eval() if model is not None else None, model_config=model_config,
              train_config=train_config, step=train_config.steps, metrics=folder.records, path=folder.path)
    if run.final_val_loss is not None and is_diverged(run.final_val_loss, corpus.vocab_size):
        run.diverged = Divergence(run.step, run.final_val_loss, corpus.vocab_size)
    return run


class FirstStep:
    """`module`, its first call under `first_step_compiling` (FSDP's per-block compiles: a failure
    there raises rather than leaving a block eager unseen)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.first = module, True

    def __call__(self, *args, **kwargs):
        if not self.first:
            return self.module(*args, **kwargs)
        self.first = False
        with first_step_compiling():
            return self.module(*args, **kwargs)


class _HiddenBar:
    """The steps without tqdm: a disabled tqdm bar still takes tqdm's lock, a semaphore shared
    across fork, and a forked trainer killed while holding it would freeze its parent's next bar."""

    def __init__(self, steps: range):
        self.steps = steps

    def __iter__(self):
        return iter(self.steps)

    def set_postfix(self, **values) -> None:
        pass

    def close(self) -> None:
        pass


def _gradient_sync(step_model: torch.nn.Module):
    """A context factory: `with synchronizing(False)` keeps this backward's gradients local (the
    ranks add them up on the next synchronized backward), `synchronizing(True)` exchanges them."""

    def synchronizing(sync: bool):
        if isinstance(step_model, torch.nn.parallel.DistributedDataParallel):
            return nullcontext() if sync else step_model.no_sync()
        if is_fsdp_module(step_model):  # keeps unsharded gradients until the synchronized backward
            step_model.set_requires_gradient_sync(sync)
        return nullcontext()
    return synchronizing


def _whole_model_on_main(model: torch.nn.Module, model_config: ModelConfig, ddp: Processes,
                         device: torch.device) -> GPT | None:
    """The FSDP-trained weights gathered into a plain model on rank 0's own `device` (None on the
    other ranks): what the caller analyses next runs there, not on a CPU that torchrun gave one
    thread (OMP_NUM_THREADS=1)."""
    weights, _ = gather_training_state(model, optimizers=[])
    if not ddp.is_main:
        return None
    with torch.device(device):
        whole = build_for_loading(model_config)
    whole.load_state_dict(weights)  # strict: every weight
    return whole


def _global_mean(value: torch.Tensor, ddp: Processes) -> torch.Tensor:
    if ddp.world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= ddp.world_size
    return value
