"""The optimizer step sharded across DDP replicas (ZeRO-1, `headlab.training.sharding`): each rank
clips, steps and keeps the state of its own share of the parameters, the ranks exchange the
results, and every rank ends with the weights of the single-process step, bit for bit. 2 gloo
ranks against one process, on a tiny LRKV model whose Muon matrices come in shapes of odd and
even counts, whose B_h go to the headwise Muon and whose embedding and head go to AdamW."""

from contextlib import contextmanager

import pytest
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
    orthogonalized, iteration = [0], optimizers_module._orthogonalized

    def counted(handed, *args, **kwargs):
        orthogonalized[0] += len(handed[0])
        return iteration(handed, *args, **kwargs)

    optimizers_module._orthogonalized = counted
    try:
        yield orthogonalized
    finally:
        optimizers_module._orthogonalized = iteration


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
    """A rank of a torch before 2.13, which has no `all_gather_single` (on such a torch: as it is)."""
    if hasattr(dist, "all_gather_single"):
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


MUON_RUN = train_preset("tiny", steps=4, eval_every=4, checkpoint_every=2, optimizer="muon", device="cpu")


def _own_states(optimizers, model) -> dict:
    names = {id(p): n for n, p in model.named_parameters()}
    return {(i, names[id(p)], key): value.clone() for i, optimizer in enumerate(optimizers)
            for p, state in optimizer.state.items() for key, value in state.items()}


def _trained_and_interrupted(out, interrupt_at: int | None = None):
    """train(MUON_RUN) into `out` (resumed if it holds a checkpoint), interrupted in the training
    forward numbered `interrupt_at` (the weights then None); the weights and this process's
    optimizer state (by optimizer, parameter name and key) at the end, read through the trainer's
    own objects."""
    from headlab.training import trainer as trainer_module

    held = {}
    step_class = trainer_module.OptimizerStep

    class Holding(step_class):
        def __init__(self, model, optimizers, group=None):
            super().__init__(model, optimizers, group)
            held.update(model=model, optimizers=optimizers)

    trainer_module.OptimizerStep = Holding  # a forked rank's own module (or restored below)
    forward, calls = GPT.forward, [0]

    def interrupted(self, *args, **kwargs):
        calls[0] += self.training
        if calls[0] == interrupt_at:
            raise RuntimeError("interrupted")
        return forward(self, *args, **kwargs)

    GPT.forward = interrupted
    try:
        weights = train(preset("tiny", "mha"), MUON_RUN, "synthetic", out=out, resume=True,
                        progress=False).model.state_dict()
    except RuntimeError as error:
        if str(error) != "interrupted":
            raise
        weights = None
    finally:
        GPT.forward, trainer_module.OptimizerStep = forward, step_class
    return weights, _own_states(held["optimizers"], held["model"])


@pytest.mark.slow
def test_a_sharded_checkpoint_holds_the_whole_state_and_resumes_on_any_number_of_ranks(tmp_path):
    """The checkpoint gathers each rank's share (the union of what the ranks hold, exactly). Two
    ranks resuming it end where the uninterrupted two-rank run ends, bit for bit, each loading
    its share only; one process resuming it loads the whole state and trains on."""
    import shutil

    from headlab.runs.checkpoints import current_checkpoint

    (_, cut_0), (_, cut_1) = on_ranks(lambda rank: _trained_and_interrupted(tmp_path / "cut", interrupt_at=3),
                                      timeout=90)  # in step 3: each rank's share as the step-2 checkpoint saw it
    checkpoint = current_checkpoint(tmp_path / "cut")
    assert checkpoint.step == 2
    shutil.copytree(tmp_path / "cut", tmp_path / "cut-alone")
    saved = torch.load(checkpoint.folder / "state.pt", weights_only=True)["optimizers"]
    saved = {(i, name, key): value for i, state in enumerate(saved) for name, entry in state["state"].items()
             for key, value in entry.items()}
    assert set(cut_0).isdisjoint(cut_1) and set(cut_0) | set(cut_1) == set(saved)
    assert all(torch.equal(value, saved[key]) for key, value in {**cut_0, **cut_1}.items())
    (whole_0, _), (whole_1, _) = on_ranks(lambda rank: _trained_and_interrupted(tmp_path / "whole"), timeout=90)
    (resumed_0, held_0), (resumed_1, held_1) = on_ranks(lambda rank: _trained_and_interrupted(tmp_path / "cut"),
                                                        timeout=90)
    assert _equal(resumed_0, whole_0) and _equal(resumed_1, whole_0) and _equal(whole_1, whole_0)
    assert set(held_0).isdisjoint(held_1) and set(held_0) | set(held_1) == set(saved)  # each its share, all of it
    _, held_alone = _trained_and_interrupted(tmp_path / "cut-alone")
    assert set(held_alone) == set(saved)
