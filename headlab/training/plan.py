"""A plan before the bill: what a training job will cost, computed without training.

For every variant: parameters, tokens, training FLOPs (training/flops.py), wall time at a stated
MFU on the given devices or from a step measured here (training/hardware.py), checkpoint disk,
and memory per device under DDP and under FSDP (training/memory.py). A setup that cannot fit is
refused in one line that says what would fit. The optimizer's own FLOPs are counted per rank in
the wall time at the same MFU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from headlab.model.config import ModelConfig
from headlab.training.flops import (
    matmul_parameters,
    model_flops_utilization,
    muon_flops_per_step,
    parameter_counts,
    training_flops,
)
from headlab.training.hardware import Devices, StepTime, run_seconds
from headlab.training.memory import (
    STRATEGIES,
    GiB,
    Memory,
    PlanError,
    checkpoint_bytes,
    memory_per_device,
    micro_batch_size,
)

MAX_SUGGESTED_DEVICES = 1024


@dataclass(frozen=True)
class VariantPlan:
    label: str
    params: int
    matmul_params: int
    steps: int
    tokens: int
    flops: dict[str, float]
    wall_s: float
    checkpoint_bytes: int
    memory: dict[str, Memory]  # by strategy, per device
    fits: bool  # under the plan's strategy
    mfu: float  # the assumed one, or the one a measured step implies
    step: StepTime | None = None  # measured here, or None (wall time from FLOPs at an assumed MFU)


@dataclass(frozen=True)
class StudyPlan:
    variants: list[VariantPlan]
    devices: Devices
    strategy: str
    mfu: float
    batch_size: int
    micro_batch: int
    grad_accum: int
    seq_len: int
    seeds: int
    optimizer: str
    dtype: str
    suggestions: list[str] = field(default_factory=list)
    jobs: int = 1  # runs trained at once (each a model in memory)
    timing_note: str = ""  # the machine's state when steps were measured

    @property
    def measured(self) -> bool:
        return all(v.step is not None for v in self.variants)

    @property
    def total_flops(self) -> float:
        return self.seeds * sum(v.flops["total"] for v in self.variants)

    @property
    def total_wall_s(self) -> float:
        """Every run's wall time, `jobs` of them at a time."""
        return self.seeds * sum(v.wall_s for v in self.variants) / self.jobs

    @property
    def total_checkpoint_bytes(self) -> int:
        return self.seeds * sum(v.checkpoint_bytes for v in self.variants)

    @property
    def fits(self) -> bool:
        return all(v.fits for v in self.variants)


def study_plan(variants: list[ModelConfig], train_config, devices: Devices, *, tokens: int | None = None,
               grad_accum: int = 1, strategy: str = "ddp", mfu: float = 0.4, seeds: int = 1,
               check: bool = True, step_times: dict[str, StepTime] | None = None, jobs: int = 1,
               timing_note: str = "") -> StudyPlan:
    """Plan training every config in `variants` (`seeds` runs each) with `train_config`
    (steps, global batch_size, optimizer, dtype) on `devices`; `tokens` replaces the step count
    with ceil(tokens / (batch_size · seq_len)) steps. With `check`, a plan whose largest variant
    does not fit raises PlanError naming the setups that would.

    Wall time: from `step_times` (label -> a step measured here: `run_seconds`, evaluations
    included) when given, else FLOPs / (devices · peak · mfu). `jobs` runs train at once: the
    total divides by it and memory multiplies by it (every model a study keeps in memory)."""
    if not 0 < mfu <= 1:
        raise PlanError(f"mfu = {mfu} is invalid: must be in (0, 1]")
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy = {strategy!r} is invalid: allowed values are {', '.join(STRATEGIES)}")
    seq_len = variants[0].seq_len
    if any(config.seq_len != seq_len for config in variants):
        raise PlanError(f"variants have different seq_len ({sorted({c.seq_len for c in variants})}): plan them "
                        "separately")
    tokens_per_step = train_config.batch_size * seq_len
    steps = math.ceil(tokens / tokens_per_step) if tokens is not None else train_config.steps
    micro = micro_batch_size(train_config.batch_size, devices.count, grad_accum)
    plans = []
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise PlanError(f"jobs = {jobs!r} is invalid: must be a positive integer")
    for config in variants:
        flops = training_flops(config, steps * tokens_per_step)
        # the optimizer's own FLOPs, per rank (not in "total": MFU counts the model's FLOPs alone)
        flops["optimizer"] = (steps * muon_flops_per_step(config, devices.count) if train_config.optimizer == "muon"
                              else 0.0)
        memory = {s: memory_per_device(config, micro, devices.count, s, train_config.optimizer, train_config.dtype)
                  for s in STRATEGIES}
        step = (step_times or {}).get(config.label)
        wall_s = (run_seconds(step, train_config, steps) if step  # a measured step includes the optimizer's
                  else (flops["total"] / devices.count + flops["optimizer"]) / (devices.peak_flops * mfu))
        plans.append(VariantPlan(
            label=config.label, params=parameter_counts(config)["total"], matmul_params=matmul_parameters(config),
            steps=steps, tokens=steps * tokens_per_step, flops=flops, wall_s=wall_s,
            checkpoint_bytes=checkpoint_bytes(config, train_config.optimizer), memory=memory,
            fits=jobs * memory[strategy].total <= devices.usable_bytes,
            mfu=model_flops_utilization(config, tokens_per_step / step.seconds, devices.count * devices.peak_flops)
            if step else mfu, step=step))
    plan = StudyPlan(plans, devices, strategy, mfu, train_config.batch_size, micro, grad_accum, seq_len, seeds,
                     train_config.optimizer, train_config.dtype, jobs=jobs, timing_note=timing_note)
    if plan.fits:
        return plan
    largest = max(variants, key=lambda c: memory_per_device(c, micro, devices.count, strategy,
                                                            train_config.optimizer, train_config.dtype).total)
    plan = replace(plan, suggestions=fitting_setups(largest, plan))
    if check:
        needed = max(v.memory[strategy].total for v in plans)
        raise PlanError(
            f"{largest.label} needs {needed / GiB:.1f} GiB per device with {strategy.upper()} on {devices.count} x "
            f"{devices.name} ({devices.usable_bytes / GiB:.1f} GiB usable each); would fit: "
            + _would_fit(plan.suggestions))
    return plan


def fitting_setups(config: ModelConfig, plan: StudyPlan) -> list[str]:
    """Setups under which `config` fits, each with the command-line options that choose it (of
    `headlab train` and `headlab reproduce` alike): the other strategy on the same devices, a
    smaller micro-batch with more gradient accumulation (same global batch), and the fewest
    devices that fit with FSDP (which trains with AdamW: Muon needs whole matrices)."""
    def fits(micro: int, world: int, strategy: str) -> bool:
        optimizer = "adamw" if strategy == "fsdp" else plan.optimizer
        return memory_per_device(config, micro, world, strategy, optimizer,
                                 plan.dtype).total <= plan.devices.usable_bytes

    with_adamw = " with AdamW" if plan.optimizer != "adamw" else ""

    def options(strategy: str, grad_accum: int) -> str:
        chosen = [f"--parallel {strategy}"] + (["--optimizer adamw"] if strategy == "fsdp" and with_adamw else [])
        return " ".join(chosen + [f"--grad-accum {grad_accum}"])

    found = []
    n, batch = plan.devices.count, plan.batch_size
    if plan.strategy == "ddp" and n > 1 and fits(plan.micro_batch, n, "fsdp"):
        found.append(f"FSDP{with_adamw} on the same {n} devices ({options('fsdp', plan.grad_accum)})")
    micro = plan.micro_batch // 2
    while micro >= 1 and not (batch % (n * micro) == 0 and fits(micro, n, plan.strategy)):
        micro //= 2
    if micro >= 1:
        found.append(f"micro-batch {micro} with gradient accumulation {batch // (n * micro)} "
                     f"({plan.strategy.upper()} on {n} devices: {options(plan.strategy, batch // (n * micro))})")
    for world in range(n + 1, min(batch, MAX_SUGGESTED_DEVICES) + 1):
        if batch % world:
            continue
        micro = max((m for m in range(1, min(plan.micro_batch, batch // world) + 1) if (batch // world) % m == 0))
        if fits(micro, world, "fsdp"):
            found.append(f"FSDP{with_adamw} on {world} x {plan.devices.name} (micro-batch {micro}, "
                         f"gradient accumulation {batch // (world * micro)}: {world} processes, "
                         f"{options('fsdp', batch // (world * micro))})")
            break
    return found


def _would_fit(suggestions: list[str]) -> str:
    return "; ".join(suggestions) or f"nothing up to {MAX_SUGGESTED_DEVICES} devices"


# ---- text ------------------------------------------------------------------------------------

def _si(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} "


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def format_bytes(n: float) -> str:
    """A byte count for a person: '512 B', '1.5 KiB', ... '72.0 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def format_plan(plan: StudyPlan) -> str:
    """The plan as a text table, one row per variant, with totals and the formulas used."""
    d = plan.devices
    first = plan.variants[0]
    if plan.measured:
        timing = (f"wall time from a step of each variant measured here on {first.step.threads} thread(s), "
                  f"{plan.jobs} run(s) at once, evaluations included; MFU is what that step implies")
    else:
        timing = f"wall time at an assumed {100 * plan.mfu:.0f}% MFU"
    lines = [
        f"plan: {len(plan.variants)} variant(s) x {plan.seeds} seed(s) on {d.count} x {d.name} "
        f"({format_bytes(d.memory_bytes)}, peak {_si(d.peak_flops)}FLOP/s {d.peak_source}), "
        f"{plan.strategy.upper()}, {plan.optimizer}, {plan.dtype}",
        f"budget per run: {first.steps:,} steps x {plan.batch_size} sequences x {plan.seq_len} tokens = "
        f"{_si(first.tokens)} tokens; micro-batch {plan.micro_batch} per device, gradient accumulation "
        f"{plan.grad_accum}",
        "FLOPs = 6·N·D + 6·L·H·(d_qk+d_v)·(T/2)·D, N = parameters without the input embedding; " + timing,
    ]
    if first.flops["optimizer"]:
        share = max(v.flops["optimizer"] / (v.flops["total"] / d.count) for v in plan.variants)
        lines.append(f"Muon's Newton–Schulz orthogonalisation: the ranks split the matrices, up to "
                     f"+{100 * share:.0f}% of a rank's model FLOPs; counted in the wall time, not in MFU")
    lines.append("")
    step_column = f"{'ms/step':>9}" if plan.measured else ""
    header = (f"{'variant':<20}{'params':>11}{'N':>11}{'6·N·D':>11}{'+attn':>7}{'FLOPs':>11}{step_column}{'MFU':>6}"
              f"{'wall':>9}{'checkpoint':>12}{'DDP/dev':>10}{'FSDP/dev':>10}  fits")
    lines += [header, "-" * len(header)]
    for v in plan.variants:
        step = f"{1000 * v.step.seconds:>9.1f}" if plan.measured else ""
        lines.append(
            f"{v.label:<20}{_si(v.params):>11}{_si(v.matmul_params):>11}{v.flops['6ND']:>11.3g}"
            f"{100 * v.flops['attention'] / v.flops['6ND']:>6.1f}%{v.flops['total']:>11.3g}{step}{100 * v.mfu:>5.0f}%"
            f"{_duration(v.wall_s):>9}{format_bytes(v.checkpoint_bytes):>12}{format_bytes(v.memory['ddp'].total):>10}"
            f"{format_bytes(v.memory['fsdp'].total):>10}  {'yes' if v.fits else 'NO'}")
    at_once = f" ({plan.jobs} runs at once: {plan.jobs} models in memory)" if plan.jobs > 1 else ""
    lines += ["", f"total: {plan.total_flops:.3g} FLOPs, {_duration(plan.total_wall_s)} of training{at_once}, "
              f"{format_bytes(plan.total_checkpoint_bytes)} of checkpoints; {format_bytes(d.usable_bytes)} usable "
              "per device"]
    if plan.measured:
        spread = max(v.step.spread for v in plan.variants)
        lines.append(f"measured with {plan.timing_note}; repeated steps differed by up to {100 * spread:.0f}%")
    if not plan.fits:
        lines.append("does not fit; would fit: " + _would_fit(plan.suggestions))
    return "\n".join(lines)
