"""Cost of analysis snapshots (`headlab.runs.snapshots`) on `cpu-small` training.

Timed in one process, interleaved round-robin (common.interleaved): a training step
(forward + backward + AdamW step on a fixed batch) alone, and the same step followed by the
write of one snapshot (the `blocks.*.attn.*` tensors, atomically, fsync included). The
per-round ratio r = time(step + snapshot) / time(step) is the cost of one snapshot in steps;
a run of S steps with the study's schedule writes n snapshots, so its slowdown is
(r − 1) · n / S. Also printed: the size of one snapshot and of a run's snapshots on disk.

Target: slowdown of the study's schedule <= 3 % for LRKV (the variant with the most attention
tensors) and MHA.

    python benchmarks/snapshot_overhead.py [--quick]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch

from headlab.model.gpt import GPT
from headlab.runs.snapshots import snapshot_steps, write_snapshot
from headlab.study.roles import comparison_roles
from headlab.study.study import Study
from headlab.training.config import train_preset

TARGET = 0.03


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=train_preset("cpu-small").batch_size)
    args = p.parse_args()
    common.setup(args)
    monitor = common.CpuMonitor()
    rounds = args.rounds or (3 if args.quick else 15)
    schedule = Study("cpu-small", None, Path(".")).train_config()
    n_snapshots = len(snapshot_steps(schedule.steps, schedule.snapshot_every))
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as folder:
        for role in ("mha", "lrkv-large"):
            config = comparison_roles("cpu-small")[role]
            model = GPT(config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            idx = torch.randint(0, config.vocab_size, (args.batch, config.seq_len))

            def step():
                optimizer.zero_grad(set_to_none=True)
                model(idx, idx)[1].backward()
                optimizer.step()

            run_dir = Path(folder) / role
            run_dir.mkdir()

            def step_and_snapshot():
                step()
                write_snapshot(run_dir, model, 0, 1)

            times = common.interleaved({"step": step, "step + snapshot": step_and_snapshot}, rounds,
                                       budget_s=args.budget)
            ratio = common.paired_ratio(times, "step + snapshot", "step")
            slowdown = (ratio - 1) * n_snapshots / schedule.steps
            size = (run_dir / "snapshots" / "step-00000000.safetensors").stat().st_size
            ok &= slowdown <= TARGET
            rows.append([config.label, f"{common.median(times['step']) * 1e3:.1f}", f"{ratio:.3f}",
                         f"{100 * slowdown:.2f} %", f"{size / 2**20:.2f}", f"{n_snapshots * size / 2**20:.1f}",
                         common.verdict(slowdown <= TARGET)])
    print(common.machine_header("Snapshot overhead (cpu-small)", {
        "schedule": f"the study's: {n_snapshots} snapshots in {schedule.steps} steps (snapshot_every = "
                    f"{schedule.snapshot_every})", "rounds": rounds}, monitor, args.quick))
    print()
    print(common.format_table(["variant", "step ms", "r = (step+snapshot)/step", "schedule slowdown",
                               "MiB/snapshot", "MiB/run", "verdict"], rows))
    print(f"\ntarget: schedule slowdown <= {100 * TARGET:.0f} % — {common.verdict(ok)}")


if __name__ == "__main__":
    main()
