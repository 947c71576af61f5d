"""Operations per Muon step: torch.optim.Muon's loop over matrices against headlab's Muon,
which stacks each shape's matrices into one batched Newton–Schulz call.

Counted: every ATen operation the step dispatches (a TorchDispatchMode sees each kernel call,
views included), on the meta device, so the paper presets cost no memory and no time. Each
variant's Muon matrices are the blocks' 2-D weights (`make_optimizers` with optimizer muon);
every one has a gradient. On a GPU each operation is at least one kernel launch: the count
is what the per-matrix Python loop costs beyond the arithmetic, which both do alike.

    python benchmarks/muon_ops.py [--preset paper-128m]
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

from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants
from headlab.training.optimizers import Muon, is_muon_matrix


class CountedOps(TorchDispatchMode):
    """Counts the ATen operations dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(config, optimizer_class) -> tuple[int, int, int]:
    """(matrices, shapes, operations of one step after the first) of `optimizer_class` on the
    Muon matrices of `config`, on the meta device."""
    with torch.device("meta"):
        model = GPT(config)
        matrices = [p for n, p in model.named_parameters() if is_muon_matrix(n, p)]
        for p in matrices:
            p.grad = torch.zeros_like(p)
    optimizer = optimizer_class(matrices, lr=0.02, weight_decay=0.1)
    optimizer.step()  # momentum buffers exist from here on
    with CountedOps() as counted:
        optimizer.step()
    return len(matrices), len({p.shape for p in matrices}), sum(counted.ops.values())


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-128m")
    args = p.parse_args(argv)
    rows = []
    for config in comparison_variants(args.preset):
        matrices, shapes, before = ops_per_step(config, torch.optim.Muon)
        _, _, after = ops_per_step(config, Muon)
        rows.append([config.label, matrices, shapes, before, after, f"{before / after:.1f}x"])
    table = common.format_table(["variant", "Muon matrices", "shapes", "torch.optim.Muon ops/step",
                                 "headlab Muon ops/step", "fewer"], rows)
    print(f"Muon operations per step, {args.preset} (ATen ops dispatched, meta device)\n\n{table}")
    return table


if __name__ == "__main__":
    main()
