"""The optimizer step of DDP replicas, sharded ZeRO-1 style: each rank clips, steps and keeps the
optimizer state of its own share of the parameters, and the ranks exchange the results.

    step = OptimizerStep(model, optimizers, group)   # DDP's process group; None: one process
    ...                                              # forward and backward (DDP all-reduces the gradients)
    step(max_norm)                                   # clipped by the global norm, stepped, every rank updated

Which rank steps which parameter (`owners`): Muon's matrices are dealt round-robin shape by shape,
the deal going on across shapes, so each rank gets ⌊k/ranks⌋ or ⌈k/ranks⌉ of a shape's k matrices
and about the same Newton–Schulz work; then AdamW's parameters, largest first, each to the rank
holding the fewest bytes so far. The update of a parameter reads only its own gradient and state
(AdamW is elementwise, Muon orthogonalises each matrix on its own, however many are batched), so a
rank's results are those one process computes, bit for bit on the CPU:

  clipping   each rank takes the norms of its own gradients; one all-reduce of that vector (each
             entry non-zero on one rank only, so the sum is exact) gives every rank all of them in
             the model's order, and the global norm as torch.nn.utils.clip_grad_norm_ takes it;
             each rank scales its own gradients
  step       every optimizer steps the parameters this rank owns (the others' gradients are hidden
             from it): momentum and AdamW's moments exist for those only (the state divided by ranks)
  exchange   each rank broadcasts its updated parameters packed in one buffer: `ranks` broadcasts,
             4 B received per parameter not owned (DDP's gradient all-reduce moves about 8)

Checkpoints gather the state on rank 0 whole and keyed by parameter name
(`headlab.runs.checkpoints`, through each optimizer's `shard`), so a run resumes on any number of
processes, and each rank then loads the state of its own parameters only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from headlab.training.optimizers import HeadwiseMuon, Muon


@dataclass(frozen=True)
class Shard:
    """Which rank of `group` steps each parameter (`owner`, by the parameter's id): the `shard` of
    every optimizer of a sharded step, which the checkpoints read."""

    owner: dict[int, int]
    rank: int
    group: object

    def owns(self, parameter: torch.Tensor) -> bool:
        return self.owner[id(parameter)] == self.rank


def owners(matrices: list[torch.Tensor], others: list[torch.Tensor], ranks: int) -> dict[int, int]:
    """Parameter id -> the rank that steps it (module docstring): Muon's `matrices` dealt by
    shape, then the `others` by size, each onto the least-loaded rank. Shapes and sizes only
    (meta tensors will do: `headlab.training.memory` plans with it)."""
    owner, load = {}, [0] * ranks
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for p in matrices:
        by_shape.setdefault((tuple(p.shape), p.dtype), []).append(p)
    turn = 0
    for same in by_shape.values():
        for p in same:
            owner[id(p)], turn = turn % ranks, turn + 1
            load[owner[id(p)]] += p.numel() * p.element_size()
    for p in sorted(others, key=lambda p: -p.numel() * p.element_size()):  # stable: ties keep their order
        rank = min(range(ranks), key=lambda r: load[r])
        owner[id(p)] = rank
        load[rank] += p.numel() * p.element_size()
    return owner


def _orthogonalised(optimizer) -> bool:
    return isinstance(optimizer, (Muon, HeadwiseMuon))


class OptimizerStep:
    """Clip the gradients of `model` to a global norm and step `optimizers`: as one process does
    (torch.nn.utils.clip_grad_norm_, then each optimizer's step) without `group` or with one
    rank, else sharded across the ranks of `group`, DDP replicas holding the same gradients
    (module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizers, group=None):
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizers = optimizers
        self.shard = None
        self.flat: list[tuple[int, list[torch.Tensor]]] | None = None  # (rank, flat views of its parameters)
        self.largest: dict[tuple[torch.dtype, torch.device], int] = {}  # the largest share's elements per dtype
        if group is not None and dist.get_world_size(group) > 1:
            params = [(optimizer, p) for optimizer in optimizers for g in optimizer.param_groups for p in g["params"]]
            owner = owners([p for optimizer, p in params if _orthogonalised(optimizer)],
                           [p for optimizer, p in params if not _orthogonalised(optimizer)], dist.get_world_size(group))
            self.shard = Shard(owner, dist.get_rank(group), group)
            for optimizer in optimizers:
                optimizer.shard = self.shard

    def __call__(self, max_norm: float) -> None:
        if self.shard is None:
            torch.nn.utils.clip_grad_norm_(self.parameters, max_norm)
            for optimizer in self.optimizers:
                optimizer.step()
            return
        with torch.no_grad():
            self._clip(max_norm)
            hidden = {p: p.grad for p in self.parameters if p.grad is not None and not self.shard.owns(p)}
            try:
                for p in hidden:
                    p.grad = None
                for optimizer in self.optimizers:
                    optimizer.step()
            finally:
                for p, grad in hidden.items():
                    p.grad = grad
            self._exchange()

    def _clip(self, max_norm: float) -> None:
        """Scale this rank's gradients by torch's clip coefficient of the global norm."""
        with_grad = [p for p in self.parameters if p.grad is not None]
        mine = [i for i, p in enumerate(with_grad) if self.shard.owns(p)]
        device = with_grad[0].grad.device
        norms = torch.zeros(len(with_grad), device=device, dtype=with_grad[0].grad.dtype)
        if mine:
            norms[mine] = torch.stack(torch._foreach_norm([with_grad[i].grad for i in mine], 2.0))
        dist.all_reduce(norms, group=self.shard.group)
        if mine:  # torch's coefficient of the norm of the stacked norms, as clip_grad_norm_ takes it
            torch.nn.utils.clip_grads_with_norm_([with_grad[i] for i in mine], max_norm,
                                                 torch.linalg.vector_norm(norms, 2.0))

    def _exchange(self) -> None:
        """Every rank's updated parameters to every rank: one broadcast per rank and dtype of its
        parameters packed in one buffer, in the model's order. One buffer per dtype, of the largest
        share, serves every rank in turn, so a step holds that much whenever a collective lets go
        of the tensors it was handed (gloo's worker thread may keep the last one a moment after
        the broadcast returns). A handful of operations per rank, whatever its parameters (flat
        views made once)."""
        if self.flat is None:
            self.flat = []
            for rank in range(dist.get_world_size(self.shard.group)):
                by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
                for p in self.parameters:
                    if self.shard.owner[id(p)] == rank:
                        by_dtype.setdefault(p.dtype, []).append(p.detach().view(-1))
                self.flat += [(rank, views) for views in by_dtype.values()]
            for _, views in self.flat:
                key = (views[0].dtype, views[0].device)
                self.largest[key] = max(self.largest.get(key, 0), sum(view.numel() for view in views))
        buffers = {key: torch.empty(size, dtype=key[0], device=key[1]) for key, size in self.largest.items()}
        for rank, views in self.flat:
            self._broadcast(rank, views, buffers[(views[0].dtype, views[0].device)])

    def _broadcast(self, rank: int, views: list[torch.Tensor], buffer: torch.Tensor) -> None:
        sizes = [view.numel() for view in views]
        packed = buffer[:sum(sizes)]
        if rank == self.shard.rank:
            torch.cat(views, out=packed)
        dist.broadcast(packed, src=dist.get_global_rank(self.shard.group, rank), group=self.shard.group)
        if rank != self.shard.rank:
            torch._foreach_copy_(views, packed.split(sizes))
