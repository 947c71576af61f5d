"""Muon under DDP splits its Newton–Schulz work across the ranks (each orthogonalises its share of
every shape's matrices, one all-gather shares them) and ends with the weights of the single-process
step: 2 gloo ranks against one process, on a tiny LRKV model whose Muon matrices come in shapes of
odd and even counts and whose B_h go to the headwise Muon."""

from contextlib import contextmanager

import torch
import torch.distributed as dist

from headlab import GPT, preset
from headlab.training import optimizers as optimizers_module
from headlab.training.config import TrainConfig, train_preset
from headlab.training.distributed import join_process_group
from headlab.training.optimizers import make_optimizers
from headlab.training.trainer import train
from ranks import on_ranks

STEPS = 3


@contextmanager
def counting_orthogonalized():
    """[how many matrices this process orthogonalised inside the block]."""
    orthogonalized, orthogonalize = [0], optimizers_module.orthogonalize

    def counted(update, *args, **kwargs):
        orthogonalized[0] += len(update)
        return orthogonalize(update, *args, **kwargs)

    optimizers_module.orthogonalize = counted
    try:
        yield orthogonalized
    finally:
        optimizers_module.orthogonalize = orthogonalize


def _after_muon_steps(split_across=None) -> tuple[dict[str, torch.Tensor], int]:
    """The weights after STEPS steps of the Muon recipe on seeded gradients, and how many matrices
    this process orthogonalised."""
    with counting_orthogonalized() as orthogonalized:
        torch.manual_seed(0)
        model = GPT(preset("tiny", "lrkv"))
        optimizers = make_optimizers(model, TrainConfig(optimizer="muon", lrkv_b_optimizer="muon"), split_across)
        gradients = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gradients)
            for optimizer in optimizers:
                optimizer.step()
    return model.state_dict(), orthogonalized[0]


def _on_rank(rank: int):
    join_process_group(torch.device("cpu"))
    return _after_muon_steps(dist.group.WORLD)


def test_muon_split_across_ranks_ends_with_the_single_process_weights():
    """Equal, not close: each matrix goes through the same bfloat16 Newton–Schulz operations whichever
    rank and batch it sits in (a batched product computes each matrix on its own), and the all-gather
    carries the iteration's bfloat16 output unrounded."""
    alone, all_matrices = _after_muon_steps()
    (weights_0, mine_0), (weights_1, mine_1) = on_ranks(_on_rank, timeout=60)
    for weights in (weights_0, weights_1):
        assert all(torch.equal(weights[name], alone[name]) for name in alone)
    assert mine_0 + mine_1 == all_matrices and abs(mine_0 - mine_1) <= STEPS * 8  # halves, but for odd counts


def _on_rank_of_an_older_torch(rank: int):
    """A rank of a torch before 2.13: no `all_gather_single`, only `all_gather_into_tensor` (counted)."""
    del dist.all_gather_single  # the forked rank's own module: the test process keeps it
    calls, gather = [0], dist.all_gather_into_tensor

    def counted(*args, **kwargs):
        calls[0] += 1
        return gather(*args, **kwargs)

    dist.all_gather_into_tensor = counted
    weights, _ = _on_rank(rank)
    return weights, calls[0]


def test_muon_split_on_a_torch_without_all_gather_single_gathers_with_the_older_collective():
    alone, _ = _after_muon_steps()
    for weights, calls in on_ranks(_on_rank_of_an_older_torch, timeout=60):
        assert calls >= STEPS and all(torch.equal(weights[name], alone[name]) for name in alone)


def _trained_on_rank(rank: int):
    with counting_orthogonalized() as orthogonalized:
        run = train(preset("tiny", "mha"), train_preset("tiny", steps=STEPS, eval_every=STEPS, optimizer="muon",
                                                        device="cpu"), "synthetic", progress=False)
    return run.model.state_dict(), orthogonalized[0]


def test_ddp_training_splits_muon_and_its_replicas_stay_equal():
    """train() under DDP hands Muon the process group: each rank orthogonalises about half of what one
    process does, and the replicas end with equal weights."""
    _, alone = _trained_on_rank(0)
    (weights_0, mine_0), (weights_1, mine_1) = on_ranks(_trained_on_rank, timeout=60)
    assert all(torch.equal(weights_0[name], weights_1[name]) for name in weights_0)
    assert mine_0 + mine_1 == alone and 0 < mine_0 < alone
