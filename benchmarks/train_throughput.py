"""Training throughput and model FLOPs utilisation (MFU) of the six comparison variants.

A step here is exactly the trainer's: random windows, forward, backward, gradient clipping and
the AdamW step, at the preset's training batch, with the trainer's CPU allocator setting
(`keep_freed_cpu_memory`). MFU is headlab's one definition,
`headlab.training.flops.model_flops_utilization` (6·N plus the causal attention term per token,
as `--plan` and tools/gpu_check.py count it), against this CPU's fp32 matmul peak measured in
the same run: large square matmuls are timed in every round beside the training steps, a round's
peak is its best size, and MFU is the median over rounds of each round's ratio, so that a shared
machine's speed changes reach numerator and denominator alike.

Targets: MHA at >= 50% of the peak; every other variant within 10% of MHA's tokens/s.
On a CUDA machine, `--preset paper-128m` runs the same in bf16 against the bf16 peak.

    python benchmarks/train_throughput.py [--quick] [--preset cpu-small]
"""

from __future__ import annotations

import time
from contextlib import nullcontext

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch

from headlab.data.corpus import load_corpus
from headlab.data.shards import random_windows
from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants
from headlab.training.config import train_preset
from headlab.training.flops import model_flops_utilization, training_flops
from headlab.training.optimizers import make_optimizers
from headlab.training.trainer import keep_freed_cpu_memory

MFU_TARGET = 0.50
GPU_MFU_TARGET = 0.35
TOKENS_TARGET = 0.90


def matmul_probes(device: torch.device, dtype: torch.dtype) -> dict[int, object]:
    """Square matmuls of a few sizes, n -> a function doing one n x n x n product (2 n^3 FLOPs)."""
    probes = {}
    for n in (1024, 2048) if device.type == "cpu" else (8192,):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        probes[n] = lambda a=a, b=b: _sync(a @ b, device)
    return probes


def _sync(x, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    return x


def run(quick: bool = False, preset_name: str = "cpu-small", rounds: int | None = None) -> common.Report:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        keep_freed_cpu_memory()
    monitor = common.CpuMonitor()
    train_config = train_preset(preset_name)
    use_bf16 = device.type == "cuda" and train_config.dtype == "bfloat16"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else nullcontext()
    probes = matmul_probes(device, torch.bfloat16 if use_bf16 else torch.float32)
    corpus = load_corpus("synthetic")
    configs = comparison_variants(preset_name)
    if configs[0].vocab_size < corpus.vocab_size:
        configs = [c.replace(vocab_size=corpus.vocab_size) for c in configs]
    batch = train_config.batch_size
    generator = torch.Generator().manual_seed(0)

    steps = {}
    for config in configs:
        torch.manual_seed(0)
        model = GPT(config).to(device).train()
        optimizers = make_optimizers(model, train_config)

        def step(model=model, optimizers=optimizers, config=config):
            x, y = random_windows(corpus.train, batch, config.seq_len, generator)
            with autocast:
                _, loss = model(x.to(device), y.to(device))
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
            for optimizer in optimizers:
                optimizer.step()
            _sync(loss, device)

        steps[config.label] = step

    rounds = rounds or (2 if quick else 12)  # MFU sits near its target: 12 rounds steady the median
    fns = {**steps, **{f"matmul {n}": probe for n, probe in probes.items()}}
    times = common.interleaved(fns, rounds=rounds, warmup=1, inner=1 if quick else 3)
    done = len(times[configs[0].label])
    peaks = [max(2 * n ** 3 / times[f"matmul {n}"][r] for n in probes) for r in range(done)]
    tokens_per_step = batch * configs[0].seq_len
    mha = configs[0].label
    mha_tokens = tokens_per_step / common.median(times[mha])
    rows, misses = [], []
    for config in configs:
        label = config.label
        tokens_per_s = tokens_per_step / common.median(times[label])
        mfu = common.median([model_flops_utilization(config, tokens_per_step / t, peak)
                             for t, peak in zip(times[label], peaks)])
        relative = common.paired_ratio(times, mha, label)  # tokens/s relative to MHA, same-round pairs
        if label == mha:
            target = GPU_MFU_TARGET if device.type == "cuda" else MFU_TARGET
            ok, goal = mfu >= target, f"MFU >= {target:.0%}"
        else:
            ok, goal = relative >= TOKENS_TARGET, f">= {TOKENS_TARGET:.0%} of MHA tok/s"
        if not ok:
            misses.append(f"{label}: {goal}")
        rows.append([label, round(tokens_per_s), round(training_flops(config, 1)["total"] / 1e6, 2), mfu * 100,
                     relative, goal,
                     common.verdict(ok)])
    table = common.format_table(
        ["variant", "tokens/s", "MFLOP/token", "MFU %", "tok/s vs MHA", "target", "result"], rows)
    header = common.machine_header(
        f"Training throughput on {preset_name} ({'bf16' if use_bf16 else 'fp32'}, {device.type})",
        {"matmul peak (measured now)": f"median {common.median(peaks) / 1e9:.1f} GFLOP/s over {done} rounds "
                                       f"(range {min(peaks) / 1e9:.1f}-{max(peaks) / 1e9:.1f}), best of n = "
                                       f"{', '.join(map(str, probes))} each round",
         "step": f"trainer step (windows, fwd, bwd, clip, {train_config.optimizer}), batch {batch} x "
                 f"{configs[0].seq_len}",
         "MHA tokens/s": f"{mha_tokens:,.0f}"}, monitor)
    return common.Report("train_throughput", f"{header}\n\n{table}\n", not misses, misses)


def main(argv=None) -> int:
    parser = common.parser(__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-small")
    args = parser.parse_args(argv)
    common.setup(args)
    start = time.perf_counter()
    report = run(quick=args.quick, preset_name=args.preset, rounds=args.rounds)
    print(report)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
