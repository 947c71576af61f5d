"""An optimizer's state keyed by parameter name, as checkpoints keep it: gathered from the ranks
that hold it, and loaded into the ranks that step it.

The form is torch.distributed.checkpoint's for a plain model (`get_optimizer_state_dict`):
{"state": {name: {"momentum_buffer" | "step", "exp_avg", ...: tensor}}, "param_groups": [{...,
"params": [name, ...]}]}, on the CPU, so a checkpoint resumes under any number of processes. A
sharded step (`headlab.training.sharding`) marks each optimizer with its `shard`: each rank holds
the state of the parameters it steps (`shard.owns`); saving gathers every parameter's state from
its rank onto rank 0, loading keeps on each rank the state of its own parameters only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _named_groups(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> list[dict]:
    return [{**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
            for group in optimizer.param_groups]


def _spec(value):
    """What a rank tells the others of one state value: a tensor's shape, dtype and whether it
    lives on the CPU (a non-fused optimizer's step count), or the value itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type == "cpu")
    return ("value", value)


def named_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """`optimizer`'s whole state keyed by `model`'s parameter names, on the CPU. Sharded
    (`optimizer.shard`): every rank of the shard's group must call it, each parameter's state is
    broadcast by the rank that holds it, one tensor at a time, and rank 0 returns the whole state
    (None elsewhere)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = _named_groups(optimizer, names)
    shard = getattr(optimizer, "shard", None)
    if shard is None:
        return {"state": {names[id(p)]: {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                          for p, s in optimizer.state.items()}, "param_groups": groups}
    ranks = dist.get_world_size(shard.group)
    held = {names[id(p)]: {k: _spec(v) for k, v in s.items()} for p, s in optimizer.state.items()}
    every = [None] * ranks
    dist.all_gather_object(every, held, group=shard.group)
    state = {}
    for p in (p for group in optimizer.param_groups for p in group["params"]):
        owner, name = shard.owner[id(p)], names[id(p)]
        gathered = {}
        for key, spec in every[owner].get(name, {}).items():
            if spec[0] == "value":
                gathered[key] = spec[1]
                continue
            _, shape, dtype, on_cpu = spec
            tensor = (optimizer.state[p][key] if owner == shard.rank
                      else torch.empty(shape, dtype=dtype, device="cpu" if on_cpu else p.device))
            dist.broadcast(tensor, src=dist.get_global_rank(shard.group, owner), group=shard.group)
            gathered[key] = tensor.cpu()
        if gathered and shard.rank == 0:
            state[name] = gathered
    return {"state": state, "param_groups": groups} if shard.rank == 0 else None


def load_named_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict, where) -> None:
    """Load a `named_state` into `optimizer` of a plain model: the state of every parameter, or
    sharded (`optimizer.shard`) of this rank's own. Each tensor goes to its parameter's device as
    `Optimizer.load_state_dict` sends it, one at a time."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    index = {names[id(p)]: i for i, p in enumerate(params)}
    expected = [group["params"] for group in _named_groups(optimizer, names)]
    if not isinstance(saved, dict) or [group.get("params") for group in saved.get("param_groups", [])] != expected:
        raise ValueError(f"{where} holds the optimizer state of other parameter groups than this recipe's")
    shard = getattr(optimizer, "shard", None)
    state = {index[name]: value for name, value in saved.get("state", {}).items()
             if name in index and (shard is None or shard.owns(params[index[name]]))}
    optimizer.load_state_dict({"state": state, "param_groups": [{**group, "params": [index[n] for n in group["params"]]}
                                                                for group in saved["param_groups"]]})
