"""The optimizer step sharded across DDP replicas (ZeRO-1, `headlab.training.sharding`): each rank
clips, steps and keeps the state of its own share of the parameters, the ranks exchange the
results, and every rank ends with the weights of the single-process step, bit for bit. 2 gloo
ranks against one process, on a tiny LRKV model whose Muon matrices come in shapes of odd and
even counts, whose B_h go to the headwise Muon and whose embedding and head go to AdamW."""

from contextlib import contextmanager

import torch
import torch.distributed as dist

from headlab import GPT, preset
from headlab.training import optimizers as optimizers_module
from headlab.training.config import TrainConfig, train_preset
from headlab.training.distributed import join_process_group
from headlab.training.optimizers import make_optimizers
from headlab.training.sharding import OptimizerStep
from headlab.training.trainer import train
from ranks import on_ranks

STEPS = 3
CLIP = 1.0  # the seeded gradients' norm is far above it: every step clips


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


def _after_steps(group=None) -> tuple[dict[str, torch.Tensor], int, int]:
    """The weights after STEPS clipped steps of the Muon recipe on seeded gradients (the same on
    every rank, as DDP leaves them), how many matrices this process orthogonalised, and how many
    parameters it holds optimizer state for."""
    with counting_orthogonalized() as orthogonalized:
        torch.manual_seed(0)
        model = GPT(preset("tiny", "lrkv"))
        optimizers = make_optimizers(model, TrainConfig(optimizer="muon", lrkv_b_optimizer="muon"))
        step = OptimizerStep(model, optimizers, group)
        gradients = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gradients)
            step(CLIP)
    return model.state_dict(), orthogonalized[0], sum(len(optimizer.state) for optimizer in optimizers)


def _on_rank(rank: int):
    join_process_group(torch.device("cpu"))
    return _after_steps(dist.group.WORLD)


def _equal(weights: dict, alone: dict) -> bool:
    return all(torch.equal(weights[name], alone[name]) for name in alone)


def test_the_sharded_step_ends_with_the_single_process_weights_each_rank_stepping_its_share():
    """Equal, not close: each parameter's update reads its own gradient and state only (a batched
    Newton–Schulz product computes each matrix on its own), the clipping norm is the same sum in
    the same order, and the results travel unrounded. Each rank holds the state of, and
    orthogonalises, its share only: the shares add up to what one process does."""
    alone, all_matrices, all_states = _after_steps()
    (weights_0, matrices_0, states_0), (weights_1, matrices_1, states_1) = on_ranks(_on_rank, timeout=60)
    assert _equal(weights_0, alone) and _equal(weights_1, alone)
    assert matrices_0 + matrices_1 == all_matrices and abs(matrices_0 - matrices_1) <= STEPS * 8  # halves, odd counts
    assert states_0 + states_1 == all_states and 0 < states_0 < all_states


def _on_rank_of_an_older_torch(rank: int):
    """A rank of a torch before 2.13, which has no `all_gather_single`."""
    del dist.all_gather_single  # the forked rank's own module: the test process keeps it
    weights, _, _ = _on_rank(rank)
    return weights


def test_the_sharded_step_runs_on_a_torch_without_all_gather_single():
    alone, _, _ = _after_steps()
    assert all(_equal(weights, alone) for weights in on_ranks(_on_rank_of_an_older_torch, timeout=60))


def _trained_on_rank(rank: int):
    with counting_orthogonalized() as orthogonalized:
        run = train(preset("tiny", "mha"), train_preset("tiny", steps=STEPS, eval_every=STEPS, optimizer="muon",
                                                        device="cpu"), "synthetic", progress=False)
    return run.model.state_dict(), orthogonalized[0]


def test_ddp_training_shards_the_step_and_its_replicas_stay_equal():
    """train() under DDP shards the step: each rank orthogonalises about half of what one process
    does, and the replicas end with equal weights."""
    _, alone = _trained_on_rank(0)
    (weights_0, mine_0), (weights_1, mine_1) = on_ranks(_trained_on_rank, timeout=60)
    assert _equal(weights_0, weights_1)
    assert mine_0 + mine_1 == alone and 0 < mine_0 < alone
