"""The memory model's optimizer step (headlab.training.memory: the state each rank holds and the
step's temporaries) against what a step allocates, counted op by op: a dispatch mode adds the
bytes of every tensor an operation returns in fresh memory and takes them off when that memory
is freed, so the peak is exact, on one process and on each of 2 gloo ranks of a sharded step."""

import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from headlab import GPT, preset
from headlab.training.config import TrainConfig
from headlab.training.distributed import join_process_group
from headlab.training.memory import rank_shares, step_transient_bytes
from headlab.training.optimizers import make_optimizers
from headlab.training.sharding import OptimizerStep
from ranks import on_ranks

# 4 blocks of d_model 128: stacks of 16 square and 4 + 4 MLP matrices (1 MiB of fp32 each)
CONFIGS = [preset("tiny", family).replace(n_layer=4, d_model=128, head_dim=32) for family in ("mha", "lrkv", "mla")]


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors operations allocated inside the block and that are still alive,
    and their peak."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in given and not getattr(storage, "_counted", False):
                    storage._counted = True  # views of it come back from later operations
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._freed, storage.nbytes())
        return out


def _measured_step(config, optimizer: str, group=None) -> tuple[int, int]:
    """(peak bytes an optimizer step allocates, bytes of optimizer state this process holds) for
    a step after the first (the state exists), on seeded gradients."""
    torch.manual_seed(0)
    model = GPT(config)
    optimizers = make_optimizers(model, TrainConfig(optimizer=optimizer))
    step = OptimizerStep(model, optimizers, group)
    gradients = torch.Generator().manual_seed(1)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gradients)
        with LiveBytes() as counted:
            step(1.0)
    state = sum(v.numel() * v.element_size() for o in optimizers for s in o.state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0)  # not the step counts
    return counted.peak, state


def _measured_in_a_fresh_process(index: int, optimizer: str) -> tuple[int, int]:
    """`_measured_step` of CONFIGS[index] in a Python of its own: in a full suite's worker something
    left behind by an earlier test held one stack more for the length of a step (seen as exactly one
    fp32 stack over the plan, never when the test ran alone), which says nothing of the step."""
    here = Path(__file__).resolve().parent
    code = (f"import json, sys; sys.path[:0] = {[str(here), str(here.parent)]!r}; import test_optimizer_memory as t; "
            f"print(json.dumps(t._measured_step(t.CONFIGS[{index}], {optimizer!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return tuple(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[c.attention for c in CONFIGS])
def test_a_muon_steps_temporaries_are_the_planned_ones(index):
    """One shape's fp32 stacks of gradients and momenta at a time: 8 B per parameter of the
    largest (within 5 %: the Newton–Schulz iteration's bf16 copies and Gram matrices stay below)."""
    config = CONFIGS[index]
    peak, state = _measured_in_a_fresh_process(index, "muon")
    assert peak == pytest.approx(step_transient_bytes(config, 1, "muon"), rel=0.05)
    assert state == rank_shares(config, 1, "muon")[0]["state"]


def _on_rank(rank: int, config, optimizer: str):
    join_process_group(torch.device("cpu"))
    return _measured_step(config, optimizer, dist.group.WORLD)


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_a_sharded_steps_state_and_temporaries_are_the_planned_ones_on_each_rank(optimizer):
    """Each rank holds the state of its share (as planned, to the byte); the busiest rank's
    temporaries are the larger of its stacks and the buffer of the largest share (within 5 %)."""
    config = CONFIGS[0]
    measured = on_ranks(lambda rank: _on_rank(rank, config, optimizer), timeout=60)
    shares = rank_shares(config, 2, optimizer)
    assert [state for _, state in measured] == [share["state"] for share in shares]
    assert max(peak for peak, _ in measured) == pytest.approx(step_transient_bytes(config, 2, optimizer), rel=0.05)
