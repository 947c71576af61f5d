"""Training-step time of the six comparison variants on `cpu-small`, relative to MHA.

One step = forward + cross-entropy + backward on a fixed random batch (zero_grad with
set_to_none before each step); with --adamw it also includes `torch.optim.AdamW.step()`.
Timing is interleaved round-robin across the six models (see common.interleaved) and the
ratio to MHA is the median over rounds of the same-round ratio.

Target: ratio to MHA <= 1.10 for LRKV (both ranks), MQA, MLA and GQA.

    python benchmarks/train_step.py [--quick] [--adamw] [--batch 16] [--seq-len 128]
"""

from __future__ import annotations

import time

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch

from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants

TARGET = 1.10


def make_step(model: GPT, idx: torch.Tensor, targets: torch.Tensor, optimizer):
    def step():
        model.zero_grad(set_to_none=True)
        _, loss = model(idx, targets)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        return loss
    return step


def run(quick: bool = False, adamw: bool = False, batch: int = 16, seq_len: int = 128,
        rounds: int | None = None, preset_name: str = "cpu-small", seed: int = 0,
        budget_s: float | None = None) -> common.Report:
    rounds = rounds or (3 if quick else 15)
    budget_s = budget_s if budget_s is not None else (20.0 if quick else 60.0)
    warmup = 1 if quick else 2
    t_start = time.perf_counter()
    monitor = common.CpuMonitor()
    configs = comparison_variants(preset_name)
    seq_len = min(seq_len, configs[0].seq_len)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, configs[0].vocab_size, (batch, seq_len), generator=gen)
    targets = torch.randint(0, configs[0].vocab_size, (batch, seq_len), generator=gen)

    steps, params = {}, {}
    for cfg in configs:
        torch.manual_seed(seed)
        model = GPT(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if adamw else None
        steps[cfg.label] = make_step(model, idx, targets, opt)
        params[cfg.label] = sum(p.numel() for p in model.parameters())

    times = common.interleaved(steps, rounds=rounds, warmup=warmup, budget_s=budget_s)
    done = len(next(iter(times.values())))
    ref = configs[0].label
    rows, misses = [], []
    for cfg in configs:
        name = cfg.label
        ms = common.median(times[name]) * 1e3
        ratio = common.paired_ratio(times, name, ref)
        if name == ref:
            status = "(reference)"
        else:
            ok = ratio <= TARGET
            status = common.verdict(ok)
            if not ok:
                misses.append(f"train_step: {name} ratio {ratio:.3f} > {TARGET}")
        target = "" if name == ref else f"<= {TARGET:.2f}"
        rows.append([name, params[name], ms, common.spread(times[name]), ratio, target, status])

    what = "forward + loss + backward + AdamW.step()" if adamw else "forward + loss + backward (no optimizer step)"
    header = common.machine_header(
        f"Training step time, preset {preset_name!r}",
        {
            "step": f"{what}; zero_grad(set_to_none=True) before each step",
            "batch": f"{batch} x {seq_len} tokens (fixed random tokens, seed {seed})",
            "method": f"{warmup} warm-up step(s) each, then {done} interleaved round-robin rounds "
                      f"(max {rounds}, time budget {budget_s:.0f} s); "
                      "ms/step = median over rounds; ratio = median of same-round ratios to MHA; "
                      "IQR/med = interquartile range / median (noise)",
            "target": f"ratio to MHA <= {TARGET:.2f} for every non-MHA variant",
        },
        monitor=monitor, quick=quick,
    )
    table = common.format_table(
        ["variant", "params", "ms/step", "IQR/med", "ratio vs MHA", "target", "result"], rows)
    text = f"{header}\n\n{table}\n\n({time.perf_counter() - t_start:.1f} s)"
    return common.Report("train_step", text, not misses, misses)


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--adamw", action="store_true", help="include an AdamW optimizer step in each timed step")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--preset", default="cpu-small")
    args = p.parse_args(argv)
    common.setup(args)
    report = run(quick=args.quick, adamw=args.adamw, batch=args.batch, seq_len=args.seq_len,
                 rounds=args.rounds, preset_name=args.preset, seed=args.seed, budget_s=args.budget)
    print(report)
    return report


if __name__ == "__main__":
    main()
