"""The memory model's optimizer step (headlab.training.memory: the state each rank holds and the
step's temporaries) against what a step allocates, counted op by op: a dispatch mode adds the
bytes of every tensor an operation returns in fresh memory and takes them off when that memory
is freed, so the peak is exact, on one process and on each of 2 gloo ranks of a sharded step."""

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef
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
    and their peak. A storage is followed by a weak reference to torch's own storage (not to its
    Python object, which the garbage collector may drop and remake while the memory lives on), and
    counted once, however many views of it later operations return."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.counted: dict[StorageWeakRef, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for ref in [ref for ref in self.counted if ref.expired()]:
            self.live -= self.counted.pop(ref)
        given = {StorageWeakRef(t.untyped_storage())
                 for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                ref = StorageWeakRef(storage)
                if ref not in given and ref not in self.counted:
                    self.counted[ref] = storage.nbytes()
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
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


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[c.attention for c in CONFIGS])
def test_a_muon_steps_temporaries_are_the_planned_ones(index):
    """One shape's fp32 stacks of gradients and momenta at a time: 8 B per parameter of the
    largest (within 5 %; the Newton–Schulz iteration's bf16 iterates and Gram matrices reach 8 B
    for square matrices, never more)."""
    config = CONFIGS[index]
    peak, state = _measured_step(config, "muon")
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
