"""A resume reads its checkpoint in bounded pieces: the host memory it takes beyond the state it
restores stays near one tensor and one hashing chunk, however large the checkpoint (at 6.3B every
rank used to hold state.pt and model.safetensors whole and a parsed copy of each: ~110 GB).

Measured from outside: the resuming process is forked, and this process samples its anonymous
resident memory (/proc/PID/statm: resident less file-backed pages; a memory-mapped checkpoint's
pages are the page cache, shared by a node's ranks and given back under pressure) while it loads."""

import ctypes
import gc
import os
import sys
import time

import pytest
import torch

from headlab import GPT, preset
from headlab.io import Manifest
from headlab.io import files as io_files
from headlab.runs.checkpoints import current_checkpoint, gather_training_state, load_checkpoint, save_checkpoint
from headlab.runs.layout import MANIFEST, RUN
from headlab.runs.metrics import MetricsLog
from headlab.training.config import TrainConfig
from headlab.training.optimizers import make_optimizers

MiB = 1 << 20
CHUNK = MiB  # the hashing chunk here (16 MiB in use), far smaller than the checkpoint
# 8 blocks of d_model 256: 6.4M parameters in tensors of at most 1 MiB (25 MiB of weights, 51 MiB of AdamW state)
CONFIG = preset("tiny", "mha").replace(n_layer=8, d_model=256, head_dim=64)
RECIPE = TrainConfig(optimizer="adamw")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _model_and_optimizers():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    return model, make_optimizers(model, RECIPE)


def _checkpointed_run(folder) -> None:
    """A run folder whose checkpoint holds the model after one AdamW step (every state filled)."""
    model, optimizers = _model_and_optimizers()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    for optimizer in optimizers:
        optimizer.step()
    folder.mkdir()
    Manifest.claim(folder, MANIFEST, RUN)
    weights, states = gather_training_state(model, optimizers)
    save_checkpoint(folder, weights, states, torch.Generator(), step=1, metrics=MetricsLog(None))


def _anonymous_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        _, resident, file_backed = map(int, statm.read().split()[:3])
    return (resident - file_backed) * PAGE


def _resume_peak(folder) -> int:
    """Peak anonymous memory a forked process adds while it resumes `folder` into a fresh model
    and optimizers (built before the sampling starts)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            io_files.CHUNK = CHUNK
            model, optimizers = _model_and_optimizers()
            gc.collect()
            # give back the heap this process inherited free from its parent, which the resume
            # would otherwise reuse unseen
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            os.write(ready_w, b"r")
            os.read(go_r, 1)
            load_checkpoint(current_checkpoint(folder), model, optimizers, torch.Generator())
            status = 0
        finally:
            os._exit(status)
    os.read(ready_r, 1)
    baseline = peak = _anonymous_bytes(pid)
    os.write(go_w, b"g")
    deadline = time.monotonic() + 60
    while not os.waitpid(pid, os.WNOHANG)[0]:
        try:
            peak = max(peak, _anonymous_bytes(pid))
        except (FileNotFoundError, ValueError, ProcessLookupError):  # ended between the two calls
            pass
        if time.monotonic() > deadline:
            os.kill(pid, 9)
        time.sleep(0.0005)
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)
    return peak - baseline


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_a_resume_holds_one_tensor_beyond_the_state_it_restores_not_the_checkpoint(tmp_path):
    """Beyond the restored optimizer state and the zero gradients torch's state-dict loader gives
    the optimizers to initialise their state (a gradient per parameter: the weights' size), a
    resume may add a few of the largest tensor (1 MiB here) and a hashing chunk, not the 77 MiB
    checkpoint, once or twice over."""
    _checkpointed_run(tmp_path / "run")
    n = sum(p.numel() for p in GPT(CONFIG).parameters())
    restored = 8 * n + 4 * n  # AdamW's two moments, and the gradients to initialise them
    extra = _resume_peak(tmp_path / "run") - restored
    assert extra < 8 * MiB, f"{extra / MiB:.1f} MiB beyond the restored state"
