"""Speed targets by model: paper-128m's estimated training throughput on 8 x H200 and on one H200,
compiled, built up cost by cost from headlab's own cost model. Estimates, not measurements.

From the package: the model FLOPs per token (`headlab.training.flops.training_flops`), Muon's
Newton–Schulz FLOPs on the busiest rank (`muon_flops_per_step`), each rank's share of the sharded
step (`headlab.training.memory.rank_shares`), the checkpoint's bytes (`checkpoint_bytes`), the H200's
bf16 peak (`headlab.training.gpus.GPU_PEAKS`), and the ATen operations one rank's optimizer step
dispatches (counted here, as benchmarks/muon_ops.py counts them, on a fake process group of the
ranks and a model of the same structure at a small width). Stated as assumptions (`Assumptions`):
what a compiled forward and backward reach of the peak (the one number that moves the estimate
most, measured by the GPU window script), the memory and NVLink bandwidths, the cost of an eager
operation, the speed of a checkpoint write. Each cost is printed before and after the fixes of
issue 46 (H6-H9), so the page says what each fix is worth and what is left.

    python benchmarks/speed_targets.py [--preset paper-128m] [--attention mha]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

try:
    from benchmarks import common
    from benchmarks.muon_ops import CountedOps
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common
    from muon_ops import CountedOps

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from headlab import GPT, preset
from headlab.training.config import PAPER_CHECKPOINT_MINUTES, TrainConfig, train_preset
from headlab.training.flops import muon_flops_per_step, parameter_counts, training_flops
from headlab.training.gpus import gpu_peak
from headlab.training.memory import checkpoint_bytes, rank_shares
from headlab.training.optimizers import is_muon_matrix, make_optimizers
from headlab.training.sharding import OptimizerStep

GPU = "H200"
# Bytes each optimizer parameter moves through memory in one step (reads + writes, fp32 unless said):
MUON_BYTES = 72  # momentum lerp 12, the two stacks 16, Nesterov lerp 12, to bf16 and back 12, decay 8, update 12
ADAMW_BYTES = 28  # torch's fused kernel: reads p, g, m, v, writes p, m, v
CLIP_BYTES = 12  # the norm reads the gradient, the scaling reads and writes it
EXCHANGE_BYTES = 8  # a parameter packed or unpacked: read and written once


@dataclass(frozen=True)
class Assumptions:
    """What the estimate takes as given (the page prints each)."""

    kernel_efficiency: float = 0.50  # of the bf16 peak, by the compiled forward + backward
    newton_schulz_efficiency: float = 0.50  # of the bf16 peak, by the batched bf16 products
    memory_bytes_per_s: float = 0.7 * 4.8e12  # 70 % of the H200's 4.8 TB/s, by elementwise kernels
    bus_bytes_per_s: float = 370e9  # NCCL bus bandwidth of large collectives on 8 x H200 (NVLink 4)
    seconds_per_op: float = 8e-6  # one eager operation dispatched from Python (the step is not compiled)
    eager_slowdown: float = 1.7  # the evaluation forward runs eager
    checkpoint_bytes_per_s: float = 1e9  # rank 0 writes, hashes and fsyncs a checkpoint


def step_ops(config, ranks: int) -> int:
    """ATen operations rank 0 dispatches in one optimizer step after the first: the sharded step
    of `ranks` ranks (one: the whole step, as every rank ran it before the sharding) of a model
    of `config`'s structure at width 96, head width 8 (the count depends on the parameters and their shapes'
    grouping, not on their size)."""
    small = config.replace(d_model=96, head_dim=8, vocab_size=512, seq_len=32, kv_rank=4, rope_head_dim=4,
                           kv_latent_dim=24)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        torch.manual_seed(0)
        model = GPT(small)
        step = OptimizerStep(model, make_optimizers(model, TrainConfig(optimizer="muon")),
                             dist.group.WORLD if ranks > 1 else None)
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            with CountedOps() as counted:
                step(1.0)
    finally:
        dist.destroy_process_group()
    return sum(counted.ops.values())


def optimizer_seconds(config, ranks: int, a: Assumptions, fixed: bool, ops: dict[bool, int]) -> tuple[float, float]:
    """(GPU seconds, Python dispatch seconds) of one rank's optimizer step: sharded (`fixed`, or
    one rank: all of it) or every rank everything as before H7, the Newton–Schulz products then
    split shape by shape as ⌈k / ranks⌉ (a fifth more than an even split on the busiest rank)."""
    peak = gpu_peak(GPU)[1] * 1e12
    total = parameter_counts(config)["total"]
    with torch.device("meta"):
        matrices = sum(p.numel() for n, p in GPT(config).named_parameters() if is_muon_matrix(n, p))
    if fixed or ranks == 1:
        share = max(rank_shares(config, ranks, "muon"), key=lambda s: s["params"])
        others = (share["state"] - 4 * share["params"]) // 4
        moved = (MUON_BYTES * (share["params"] - others) + (ADAMW_BYTES + CLIP_BYTES) * others
                 + CLIP_BYTES * (share["params"] - others) + (EXCHANGE_BYTES * total if ranks > 1 else 0))
        newton_schulz = muon_flops_per_step(config, ranks)
    else:
        moved = MUON_BYTES * matrices + ADAMW_BYTES * (total - matrices) + CLIP_BYTES * total
        newton_schulz = muon_flops_per_step(config, 1) / ranks * 1.2
    gpu = newton_schulz / (peak * a.newton_schulz_efficiency) + moved / a.memory_bytes_per_s
    return gpu, ops[fixed and ranks > 1] * a.seconds_per_op


def step_seconds(config, ranks: int, a: Assumptions, fixed: bool, ops: dict[bool, int]) -> dict[str, float]:
    """Seconds of one training step of the paper recipe on `ranks` H200s, by cost, with the fixes
    of H6-H9 (`fixed`) or without them."""
    recipe = train_preset("paper-128m")
    peak = gpu_peak(GPU)[1] * 1e12
    tokens = recipe.batch_size * config.seq_len // ranks  # per rank and step
    total = parameter_counts(config)["total"]
    costs = {"forward and backward": training_flops(config, tokens)["total"] / (peak * a.kernel_efficiency),
             "optimizer step": max(optimizer_seconds(config, ranks, a, fixed, ops))}  # GPU work or Python
    if ranks > 1:
        with torch.device("meta"):
            matrices = sum(p.numel() for n, p in GPT(config).named_parameters() if is_muon_matrix(n, p))
        ring = 2 * (ranks - 1) / ranks
        embedding = config.vocab_size * config.d_model
        # DDP overlaps the all-reduce with the backward but for the last gradient (the embedding's);
        # without H6 rank 0's step had no buckets and reduced everything after its backward
        costs["gradient all-reduce (not overlapped)"] = ring * 4 * (embedding if fixed else total) / a.bus_bytes_per_s
        costs["exchange of updated weights" if fixed else "all-gather of Newton-Schulz results"] = (
            (ranks - 1) / ranks * (4 * total if fixed else 2 * matrices) / a.bus_bytes_per_s)
    if not fixed:  # H8: a zero bf16 gradient of the logits, written and read
        costs["zero gradient of the logits"] = 4 * tokens * config.vocab_size / a.memory_bytes_per_s
    eval_flops = training_flops(config, tokens)["total"] / 3 * recipe.eval_batches / recipe.eval_every
    costs["evaluation (eager, amortised)"] = eval_flops / (peak * a.kernel_efficiency / a.eager_slowdown)
    write = checkpoint_bytes(config, "muon") / a.checkpoint_bytes_per_s
    step = sum(costs.values())
    every = (60 * PAPER_CHECKPOINT_MINUTES / step) if fixed else 1000  # steps between checkpoints
    costs["checkpoint (amortised)"] = write / every
    return costs


def throughput(config, ranks: int, costs: dict[str, float]) -> tuple[float, float]:
    """(tokens/s, MFU) of a step taking the sum of `costs`."""
    tokens = train_preset("paper-128m").batch_size * config.seq_len
    per_second = tokens / sum(costs.values())
    return per_second, per_second * training_flops(config, 1)["total"] / (ranks * gpu_peak(GPU)[1] * 1e12)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-128m")
    p.add_argument("--attention", default="mha")
    args = p.parse_args(argv)
    config = preset(args.preset, args.attention)
    a = Assumptions()
    ops = {ranks: {True: step_ops(config, ranks), False: step_ops(config, 1)} for ranks in (8,)}
    ops[1] = {True: ops[8][False], False: ops[8][False]}
    lines = [f"## Speed targets, {config.label} ({args.preset}), estimated\n",
             "Estimates from headlab's cost model (`python benchmarks/speed_targets.py`), not measurements: "
             "no GPU was used. Assumed:\n"]
    lines += [f"- `{name}` = {value:g}" for name, value in a.__dict__.items()]
    lines += [f"- the optimizer step dispatches {ops[8][True]} ATen operations per rank sharded over 8 ranks, "
              f"{ops[8][False]} unsharded (counted)\n"]
    for ranks in (8, 1):
        before, after = (step_seconds(config, ranks, a, fixed, ops[ranks]) for fixed in (False, True))
        rows = [[name, f"{1e3 * before.get(name, 0):.2f}", f"{1e3 * after.get(name, 0):.2f}"]
                for name in dict.fromkeys([*before, *after])]
        (tps_0, mfu_0), (tps_1, mfu_1) = throughput(config, ranks, before), throughput(config, ranks, after)
        rows.append(["**step**", f"{1e3 * sum(before.values()):.2f}", f"{1e3 * sum(after.values()):.2f}"])
        rows.append(["**tokens/s**", f"{tps_0 / 1e6:.2f}M", f"{tps_1 / 1e6:.2f}M"])
        rows.append(["**MFU**", f"{100 * mfu_0:.1f} %", f"{100 * mfu_1:.1f} %"])
        gpu, python = optimizer_seconds(config, ranks, a, True, ops[ranks])
        lines += [f"### {ranks} x {GPU}, micro-batch {32 // ranks} per GPU, compiled\n",
                  common.format_table(["cost (ms per step)", "before H6-H9", "after"], rows), "",
                  f"After: the optimizer step's GPU work {1e3 * gpu:.2f} ms, its Python dispatch {1e3 * python:.2f} ms "
                  "(the longer counts).\n"]
    lines.append("### How the estimate moves with what a compiled forward and backward reach\n")
    rows = []
    for efficiency in (0.40, 0.45, 0.50, 0.55):
        b = Assumptions(kernel_efficiency=efficiency)
        (tps_8, mfu_8), (_, mfu_1) = (throughput(config, r, step_seconds(config, r, b, True, ops[r])) for r in (8, 1))
        rows.append([f"{efficiency:.2f}", f"{tps_8 / 1e6:.2f}M", f"{100 * mfu_8:.1f} %", f"{100 * mfu_1:.1f} %"])
    lines.append(common.format_table(["forward+backward share of peak", f"8 x {GPU} tokens/s", "8 x MFU",
                                      f"1 x {GPU} MFU"], rows))
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
