"""Operations per Muon step: torch.optim.Muon's loop over matrices against headlab's Muon,
which stacks each shape's matrices into one batched Newton–Schulz call.

Counted: every ATen operation the step dispatches (a TorchDispatchMode sees each kernel call,
views included), on the meta device, so the paper presets cost no memory and no time. Each
variant's Muon matrices are the blocks' 2-D weights (`make_optimizers` with optimizer muon);
every one has a gradient. On a GPU each operation is at least one kernel launch: the count
is what the per-matrix Python loop costs beyond the arithmetic, which both do alike.

Under DDP every rank used to orthogonalise every matrix; the sharded step (headlab.training.sharding)
deals each shape's matrices out across the ranks, and each rank orthogonalises its own (the
ranks then exchange the updated weights). Counted for the busiest rank of `--ranks` (the one
with the most Newton–Schulz FLOPs), with the matrix-product FLOPs per rank (torch's
FlopCounterMode), every matrix against that rank's share.

    python benchmarks/muon_ops.py [--preset paper-128m] [--ranks 8]
"""

from __future__ import annotations

import argparse
from collections import Counter

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants
from headlab.training.flops import newton_schulz_by_rank
from headlab.training.optimizers import Muon, is_muon_matrix


class CountedOps(TorchDispatchMode):
    """Counts the ATen operations dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(config, optimizer_class, ranks: int = 1) -> tuple[int, int, int, int]:
    """(matrices, shapes, operations and matrix-product FLOPs of one step after the first) of
    `optimizer_class(..., **options)` on the Muon matrices of `config` that the busiest of
    `ranks` ranks steps (all of them for one rank), on the meta device."""
    with torch.device("meta"):
        model = GPT(config)
        matrices = [p for n, p in model.named_parameters() if is_muon_matrix(n, p)]
    work, owner = newton_schulz_by_rank(matrices, ranks)
    busiest = max(range(ranks), key=lambda rank: work[rank])
    mine = [p for p in matrices if owner[id(p)] == busiest]
    with torch.device("meta"):
        for p in mine:
            p.grad = torch.zeros_like(p)
    optimizer = optimizer_class(mine, lr=0.02, weight_decay=0.1)
    optimizer.step()  # momentum buffers exist from here on
    with CountedOps() as counted, FlopCounterMode(display=False) as flops:
        optimizer.step()
    return len(mine), len({p.shape for p in mine}), sum(counted.ops.values()), flops.get_total_flops()


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-128m")
    p.add_argument("--ranks", type=int, default=8, help="DDP ranks the sharded step is counted for")
    args = p.parse_args(argv)
    rows, split_rows = [], []
    for config in comparison_variants(args.preset):
        matrices, shapes, before, _ = ops_per_step(config, torch.optim.Muon)
        _, _, after, flops = ops_per_step(config, Muon)
        mine, _, split, split_flops = ops_per_step(config, Muon, args.ranks)
        rows.append([config.label, matrices, shapes, before, after, f"{before / after:.1f}x"])
        split_rows.append([config.label, mine, after, split, f"{flops / 1e9:.1f}", f"{split_flops / 1e9:.1f}",
                           f"{flops / split_flops:.1f}x"])
    table = common.format_table(["variant", "Muon matrices", "shapes", "torch.optim.Muon ops/step",
                                 "headlab Muon ops/step", "fewer"], rows)
    split_table = common.format_table(["variant", "matrices of the busiest rank", "ops/step, every matrix",
                                       "its share", "GFLOP/step, every matrix", "its share", "less"], split_rows)
    text = (f"Muon operations per step, {args.preset} (ATen ops dispatched, meta device)\n\n{table}\n\n"
            f"The busiest of {args.ranks} DDP ranks under the sharded step: every matrix, against its share\n\n"
            f"{split_table}")
    print(text)
    return text


if __name__ == "__main__":
    main()
