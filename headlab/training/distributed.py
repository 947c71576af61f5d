"""The processes of a torchrun job: which device each rank trains on, joining and leaving the
process group, and failing together.

A rank that raises while the others wait in a collective would leave them waiting (until the
group's timeout, 30 minutes by default). So the steps where ranks can diverge (rank 0 opening
or writing a run folder, local rank 0 preparing and verifying token shards) run inside `together(processes)`:
every rank learns whether any rank failed there and raises, the failing rank its own error and
the others `FailedOnAnotherRank` carrying its message, so every process exits with the error
printed once (by rank 0). An error anywhere else ends its process at once (`abandon`), and
torchrun then stops the other ranks. Which process this is: headlab.training.processes.
"""

from __future__ import annotations

import atexit
import time
import warnings
from contextlib import contextmanager
from datetime import timedelta
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from headlab.training.processes import (
    FailedOnAnotherRank,
    Processes,
    in_process_group,
    launched_processes,
    node_processes,
)

# How long a rank waits for local rank 0 to prepare a corpus: tokenizing billions of tokens
# takes far longer than the group's default 30-minute timeout on a collective.
PREPARATION_TIMEOUT = timedelta(hours=24)

T = TypeVar("T")


def use_tf32_matmuls(device: torch.device) -> None:
    """fp32 matmuls on TF32 tensor cores (fp32 range, 10-bit mantissa inputs, fp32 sums) on
    Ampere and later GPUs: about 8x the fp32 CUDA cores, and the rate `--plan` prices fp32
    training at (headlab.training.gpus.GPU_PEAKS). Process-wide; bf16 autocast's matmuls are
    unaffected."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0):
        allow_tf32_matmuls()


def allow_tf32_matmuls() -> None:
    """TF32 for CUDA fp32 matmuls through the switch every reader in this torch accepts.

    torch 2.9 added a per-backend switch (`torch.backends.cuda.matmul.fp32_precision`); once it is
    set, the legacy getters (`torch.backends.cuda.matmul.allow_tf32`,
    `torch.get_float32_matmul_precision()`) raise ("mix of the legacy and new APIs"), and inductor
    reads them while it compiles (throughout before 2.13, its autotuning cache in 2.13: pytorch#166387),
    so a compile fails and "auto" trains eager. The legacy switch sets the new one too, leaving
    both readable: it is used wherever it exists and both then read TF32; a torch without it (or
    where it no longer sets the new one) gets the new switch."""
    matmul = torch.backends.cuda.matmul
    try:
        with warnings.catch_warnings():  # torch 2.9's notice that the legacy switch will be deprecated
            warnings.simplefilter("ignore", UserWarning)
            matmul.allow_tf32 = True
            if matmul.fp32_precision == "tf32" and torch.get_float32_matmul_precision() != "highest":
                return
    except (AttributeError, RuntimeError):
        pass
    matmul.fp32_precision = "tf32"


def training_device(requested: str, local_rank: int) -> torch.device:
    """The device a rank trains on: `auto` is CUDA when there is one, else the CPU; a CUDA device
    without an index is the rank's own GPU, cuda:LOCAL_RANK (torchrun starts one process per GPU),
    or cuda:0 when the process sees a single GPU and torchrun did not start several processes on
    this node (LOCAL_WORLD_SIZE): a scheduler that gives each task its own GPU (SLURM's
    --gpus-per-task) makes that GPU the only visible one, whatever the task's local rank."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"TrainConfig.device = {requested!r} is unavailable: this torch build or machine has "
                         "no CUDA device; use cpu or auto")
    if device.index is None:
        own_gpu = torch.cuda.device_count() == 1 and node_processes() == 1
        device = torch.device("cuda", 0 if own_gpu else local_rank)
    if device.index >= torch.cuda.device_count():
        raise ValueError(f"device {device} does not exist: this machine has {torch.cuda.device_count()} GPU(s); "
                         "start at most one process per GPU (torchrun --nproc_per_node)")
    return device


def join_process_group(device: torch.device) -> Processes:
    """Join the job's process group (once) when torchrun launched several processes. On a GPU the
    rank first makes `device` its current one, so NCCL, FSDP and every `cuda` tensor without an
    index use that GPU rather than GPU 0."""
    processes = launched_processes()
    if processes.world_size == 1:
        return processes
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        cuda = device.type == "cuda"
        # gloo beside NCCL: the small CPU collectives of `together` need no GPU memory
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo", device_id=device if cuda else None)
        # Gloo's worker threads abort the process (SIGABRT) when a group is still alive at
        # interpreter shutdown, so a script that calls train() under torchrun and simply ends
        # must still leave the group while Python is fully alive.
        atexit.register(leave_process_group)
    return Processes(dist.get_rank(), dist.get_world_size(), processes.local_rank)


def leave_process_group() -> None:
    """Leave the process group, if one is joined, once every rank has got here.

    torch keeps a gloo group that DDP or FSDP used alive to the end of the process, with its
    worker threads. A worker drops each finished collective after the caller has moved on, and
    dropping one that holds tensors takes the GIL: at interpreter shutdown that aborts the
    process (SIGABRT). So the workers are first given the GIL to drop what they hold, then the
    barrier (which keeps whatever is still in progress until it is dropped itself) finds nothing
    holding tensors, and they get the GIL once more before Python goes on to shut down."""
    if in_process_group():
        time.sleep(_WORKER_DRAIN_S)
        if not _failed:
            dist.barrier()
        dist.destroy_process_group()
        time.sleep(_WORKER_DRAIN_S)


_WORKER_DRAIN_S = 0.1  # the workers need microseconds once scheduled; this is for a busy machine
_failed = False


@contextmanager
def failing_alone():
    """If the body raises, this rank leaves the process group at exit without the barrier: its
    peers may be waiting in another collective (a gradient all-reduce) and would never reach it,
    so the rank would wait there until the group's timeout (30 minutes) instead of ending, and
    torchrun stops the other ranks only once one has ended."""
    global _failed
    try:
        yield
    except BaseException:
        _failed = True
        raise


@contextmanager
def together(processes: Processes, group=None):
    """Run the body on every rank, then agree: if it raised on any rank, it raises on every rank
    (the failing rank's own error; `FailedOnAnotherRank` with the first failure's message on the
    others). Some ranks may do nothing in the body; all must enter it."""
    try:
        yield
    except Exception as error:
        _share_failure(processes, error, group)
        raise
    _share_failure(processes, None, group)


def _share_failure(processes: Processes, error: Exception | None, group) -> None:
    if processes.world_size == 1 or not in_process_group():
        return
    messages = [None] * processes.world_size
    dist.all_gather_object(messages, None if error is None else str(error), group=group)
    failed = [(rank, message) for rank, message in enumerate(messages) if message is not None]
    if failed and error is None:
        rank, message = failed[0]
        raise FailedOnAnotherRank(f"{message} (on rank {rank})")


def as_rank_0_decided(decision: bool, processes: Processes) -> bool:
    """Rank 0's `decision`, on every rank (one broadcast of a byte through gloo, no GPU sync): for a
    choice made from something each rank reads for itself, such as its clock, which the ranks must
    take alike (a checkpoint every rank joins)."""
    if processes.world_size == 1 or not in_process_group():
        return decision
    shared = torch.tensor([decision], dtype=torch.uint8)
    dist.broadcast(shared, src=0)
    return bool(shared.item())


def on_local_main(processes: Processes, work: Callable[[], T]) -> T:
    """`work()` on local rank 0 of each node (e.g. tokenizing a corpus into the node's cache and
    verifying it) while the node's other ranks wait; every rank returns its node's result (picklable),
    and a failure on a local rank 0 raises on every rank (`together`). torchrun numbers a node's
    ranks consecutively, so a node's local rank 0 is global rank `rank - local_rank`."""
    if processes.world_size == 1 or not in_process_group():
        return work()
    waiting = dist.new_group(backend="gloo", timeout=PREPARATION_TIMEOUT)
    result = None
    with together(processes, waiting):
        if processes.local_rank == 0:
            result = work()
    results = [None] * processes.world_size
    dist.all_gather_object(results, result, group=waiting)
    return results[processes.rank - processes.local_rank]
