"""The GPU check's six variants (tools/gpu_check.py): paper-128m's comparison variants trained in
bf16 with torch.compile on one GPU, at a batch the card holds (`fitting_batch_size`), and what is
checked on them: the SDPA backend each family runs, peak memory against the plan, recompilations,
tokens/s and MFU, the head analysis and the report's measurements, decoding."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from node_checks import FAIL, PASS, SKIP, Check, PeakMemory, RecompileLog, stage, target, verdict
from torch.profiler import ProfilerActivity, profile

from benchmarks import common
from headlab.analysis import attention_maps, inputs, qk_norm
from headlab.analysis import similarity as analysis
from headlab.data.corpus import load_corpus
from headlab.model import decoding
from headlab.study.roles import comparison_variants
from headlab.training.config import train_preset
from headlab.training.flops import model_flops_utilization
from headlab.training.hardware import gpu_peak, measure_peak_flops
from headlab.training.memory import USABLE_MEMORY_FRACTION, memory_per_device, micro_batch_size
from headlab.training.plan import format_bytes
from headlab.training.trainer import train

MHA_MFU_TARGET = 0.40
VARIANT_THROUGHPUT_TARGET = 0.90  # of MHA's tokens/s


@dataclass(frozen=True)
class Mode:
    preset: str
    steps: int
    batch_size: int  # sequences per step
    log_every: int  # steps per throughput window
    matmul_size: int  # of the square bf16 matmul that measures the peak
    peak_seconds: float
    new_tokens: int  # generated after a (context - new_tokens)-token prompt
    timing_s: float  # per cached-step latency measurement
    report_windows: int  # full-context windows of the report's forward-pass measurements (the report: 8)
    tokenize_megabytes: float  # of generated text for the tokenization throughput


# --smoke tokenizes 0.5 MB: a tenth of it still holds the 8192 distinct tokens bpe:8192 learns (0.25 MB does not)
MODES = {"gpu": Mode("paper-128m", 200, 16, 20, 8192, 2.0, 64, 0.2, 2, 16),
         "smoke": Mode("tiny", 6, 4, 2, 128, 0.05, 4, 0.01, 2, 0.5)}



def fitting_batch_size(preset: str, batch_size: int, optimizer: str | None, memory_bytes: float) -> int:
    """`batch_size`, halved until the plan's memory per device (one GPU, bf16) of every variant
    of `preset` fits `memory_bytes` less what the driver keeps (at least 1): paper-128m at 16
    sequences needs more than a 16-24 GB card (T4, L4, A10) has."""
    optimizer = optimizer or train_preset(preset).optimizer
    configs = comparison_variants(preset)
    while batch_size > 1 and any(memory_per_device(config, batch_size, 1, "ddp", optimizer, "bfloat16").total
                                 > USABLE_MEMORY_FRACTION * memory_bytes for config in configs):
        batch_size //= 2
    return batch_size


def train_variants(preset: str, steps: int, batch_size: int, log_every: int, device: str, runs_dir: Path,
                   optimizer: str | None = None) -> tuple[dict, dict]:
    """Train the six comparison variants (with the preset's optimizer unless one is given). Returns
    {label: Run} and {label: {"peak_bytes", "recompiles"}}: what training each allocated at its
    peak on CUDA (`PeakMemory`) and the recompilations torch.compile logged (`RecompileLog`)."""
    corpus = load_corpus("synthetic", tokenizer="byte")
    config = train_preset(preset, steps=steps, batch_size=batch_size, warmup_steps=max(1, steps // 10),
                          dtype="bfloat16", compile="inductor" if device == "cuda" else "off", device=device,
                          log_every=log_every, eval_every=steps, eval_batches=2, checkpoint_every=steps)
    if optimizer:
        config = config.replace(optimizer=optimizer)
    runs, seen = {}, {}
    for variant in comparison_variants(preset):
        started = time.perf_counter()
        torch.compiler.reset()  # so that this model's first compilation is not a recompilation of the last model's
        with RecompileLog() as recompiles, PeakMemory(device) as peak:
            runs[variant.label] = train(variant, config, corpus, out=runs_dir / variant.run_name, progress=False)
        seen[variant.label] = {"peak_bytes": peak.bytes, "recompiles": recompiles.messages}
        print(f"  trained {variant.label} in {time.perf_counter() - started:.0f} s", flush=True)
    return runs, seen


# The aten operator scaled_dot_product_attention dispatches to, per backend (torch.nn.attention.SDPBackend).
SDPA_KERNELS = {
    "aten::_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "FLASH_ATTENTION (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "aten::_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "aten::_scaled_dot_product_fused_attention_overrideable": "OVERRIDEABLE",
    "aten::_scaled_dot_product_attention_math": "MATH",
}


def sdpa_backends(model: torch.nn.Module, autocast) -> set[str]:
    """The backends scaled_dot_product_attention ran in one forward and backward of `model` on two
    full-context windows under `autocast` (the training's): the aten operators the profiler saw.
    The model runs eagerly here; compiled, SDPA's backend is chosen by the same rules."""
    config = model.config
    device = next(model.parameters()).device
    tokens = torch.randint(0, 256, (2, config.seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:  # operators are recorded on the host
        with autocast:
            _, loss = model(tokens, tokens)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {SDPA_KERNELS[event.name] for event in profiler.events() if event.name in SDPA_KERNELS}


def sdpa_check(label: str, backends: set[str], device: str) -> Check:
    """On CUDA, PASS when every attention call ran a fused kernel, FAIL when one fell back to MATH
    (scores materialized: slow, memory quadratic in the context). On the CPU whatever ran passes.
    No SDPA call at all FAILs: the model no longer reaches the kernel this check watches."""
    check = f"SDPA backend: {label}"
    seen = ", ".join(sorted(backends))
    if not backends:
        return Check(check, FAIL, "no scaled_dot_product_attention call seen in a training step")
    if device != "cuda":
        return Check(check, PASS, f"{seen} (on the CPU any backend passes)")
    return verdict(check, "MATH" not in backends, seen + ("; falls back to MATH" if "MATH" in backends else ""))


def sdpa_checks(runs: dict, device: str, results: dict) -> list[Check]:
    """The SDPA backend of each family, in bf16 autocast as it trained."""
    autocast = torch.autocast(device, dtype=torch.bfloat16)
    backends = {label: sdpa_backends(run.model, autocast) for label, run in runs.items()}
    results["sdpa_backends"] = {label: sorted(found) for label, found in backends.items()}
    return [sdpa_check(label, found, device) for label, found in backends.items()]


def memory_check(label: str, measured: int, planned: float) -> Check:
    """The plan's memory per device is an upper-bound estimate: PASS when the measured peak is at most it."""
    return verdict(f"peak memory vs plan: {label}", measured <= planned,
                   f"{format_bytes(measured)} allocated at the peak, plan {format_bytes(planned)} "
                   f"(ratio {measured / planned:.2f})")


def memory_checks(runs: dict, seen: dict, device: str) -> list[Check]:
    """Each variant's peak CUDA memory in training against headlab.training.memory.memory_per_device
    for its config, micro-batch, one device under DDP, optimizer and dtype."""
    if device != "cuda":
        return [Check("peak memory vs plan", SKIP, "no CUDA device (--smoke)")]
    checks = []
    for label, run in runs.items():
        tc = run.train_config
        planned = memory_per_device(run.model_config, micro_batch_size(tc.batch_size, 1, tc.grad_accum), 1, "ddp",
                                    tc.optimizer, tc.dtype).total
        checks.append(memory_check(label, seen[label]["peak_bytes"], planned))
    return checks


def recompile_checks(seen: dict, compiled: bool) -> list[Check]:
    """No recompilation after a model's first compilation: every training micro-batch has one
    shape, and evaluation runs the uncompiled module, so its batches never reach the compiled one.
    Each recompilation would cost minutes of compile time at scale and hint at a guard on a value
    that changes during training."""
    if not compiled:
        return [Check("recompiles under --compile", SKIP, "headlab compiles on CUDA only (--smoke trains on the CPU)")]
    return [verdict(f"recompiles: {label}", not s["recompiles"],
                    "none after the first compilation" if not s["recompiles"] else
                    f"{len(s['recompiles'])}, first: " + " ".join(s["recompiles"][0].split())[:160])
            for label, s in seen.items()]


def throughput_rows(runs: dict, peak_flops: float) -> list[dict]:
    """Per variant: median tokens/s after the first logged window, and MFU against `peak_flops`."""
    rows = []
    for label, run in runs.items():
        windows = [r["tokens_per_s"] for r in run.metrics if "tokens_per_s" in r][1:]
        tokens_per_s = statistics.median(windows)
        rows.append({"variant": label, "tokens_per_s": tokens_per_s,
                     "mfu": model_flops_utilization(run.model_config, tokens_per_s, peak_flops),
                     "final_val_loss": run.final_val_loss})
    mha = rows[0]["tokens_per_s"]
    for row in rows:
        row["of_mha"] = row["tokens_per_s"] / mha
    return rows


def throughput_checks(runs: dict, peak: float, enforced: bool, results: dict) -> list[Check]:
    """The throughput table and its targets: MHA's MFU, every variant's tokens/s against MHA's."""
    rows = throughput_rows(runs, peak)
    results["throughput"] = rows
    print("\n### Training throughput\n")
    print(common.format_table(["variant", "tokens/s", "MFU (measured peak)", "of MHA tokens/s", "val loss"],
                              [[r["variant"], round(r["tokens_per_s"]), r["mfu"], r["of_mha"], r["final_val_loss"]]
                               for r in rows]))
    checks = [target("Standard MHA MFU", rows[0]["mfu"] >= MHA_MFU_TARGET,
                     f"{100 * rows[0]['mfu']:.1f}% (target >= {100 * MHA_MFU_TARGET:.0f}%)", enforced)]
    return checks + [target(f"tokens/s: {r['variant']}", r["of_mha"] >= VARIANT_THROUGHPUT_TARGET,
                            f"{100 * r['of_mha']:.0f}% of MHA's (target >= {100 * VARIANT_THROUGHPUT_TARGET:.0f}%)",
                            enforced) for r in rows[1:]]


def decode_tables(runs: dict, new_tokens: int, timing_s: float):
    """Cache bytes vs formula at full context, generation with vs without cache after a
    (context - new_tokens)-token prompt, and one cached step at context - 1, all in bf16
    (the models are cast in place)."""
    models = {label: run.model.to(torch.bfloat16).eval() for label, run in runs.items()}
    context = next(iter(models.values())).config.seq_len
    device = next(next(iter(models.values())).parameters()).device
    prompt = torch.randint(0, 256, (1, context - new_tokens), generator=torch.Generator().manual_seed(0)).to(device)
    cache = decoding.cache_bytes_table(models, context)
    speed = decoding.generation_speed(models, prompt, new_tokens, repeats=2)
    latency = decoding.step_latency(models, [context - 1], min_run_time=timing_s)
    latency["speed-up vs MHA"] = latency["ms"].iloc[0] / latency["ms"]
    return context, cache, speed, latency


def decode_checks(runs: dict, mode: Mode, results: dict) -> list[Check]:
    """The decoding tables (bf16, batch 1); cache bytes must equal the formula for every variant."""
    context, cache, speed, latency = decode_tables(runs, mode.new_tokens, mode.timing_s)
    print(f"\n### Decoding at context {context} (bf16, batch 1)\n")
    print(cache.to_string(), "\n")
    print(speed.to_string(), "\n")
    print(latency.to_string(index=False))
    results.update(cache=cache.reset_index().to_dict("records"), generation=speed.reset_index().to_dict("records"),
                   step_latency=latency.to_dict("records"))
    return [verdict("decode cache bytes = formula", bool(cache["agree"].all()),
                    f"{len(cache)} cache layouts at context {context}")]


def analyze_runs(runs: dict) -> "analysis.Analysis":
    """The head analysis of every trained model (QK circuit, all layers, fp32 weights)."""
    return analysis.concat(analysis.analyze(run.model, label=label) for label, run in runs.items())


def report_measurements(runs: dict, windows: int) -> list[dict]:
    """The report's forward-pass measurements of every model where it trained, on `windows` random
    windows of its full context: Σ (`inputs.input_moments`), the attention-map similarity and,
    where the variant has QK-norm, `qk_norm.norm_scale_effect`; seconds per measurement."""
    rows = []
    for label, run in runs.items():
        config = run.model_config
        tokens = torch.randint(0, 256, (windows, config.seq_len), generator=torch.Generator().manual_seed(0))
        row = {"variant": label}
        for name, measure in (("moments_s", inputs.input_moments), ("behaviour_s", attention_maps.attention_similarity),
                              ("norm_effect_s", qk_norm.norm_scale_effect if config.qk_norm else None)):
            if measure is None:
                row[name] = None
                continue
            start = time.perf_counter()
            measure(run.model, tokens)
            row[name] = time.perf_counter() - start
        rows.append(row)
    return rows


def analysis_checks(runs: dict, windows: int, runs_dir: Path, results: dict) -> list[Check]:
    """The head analysis (saved under runs_dir/analysis) and the report's measurements, in fp32:
    they must run on every model (no target)."""
    result = analyze_runs(runs)
    measured = report_measurements(runs, windows)
    results["report_measurements"] = measured
    n_layer = next(iter(runs.values())).model_config.n_layer
    layers = sorted({0, n_layer // 2, n_layer - 1})  # the flagship figure's early / middle / late
    summary_frame = result.summary
    picked = summary_frame[summary_frame["layer"].isin(layers)]
    print("\n### Head analysis (QK circuit), layers " + ", ".join(map(str, layers)) + "\n")
    print(picked.pivot_table(index="model", columns=["kind", "layer"], values="effective_rank", sort=False)
          .round(2).to_string())
    result.save(runs_dir / "analysis")
    context = next(iter(runs.values())).model_config.seq_len
    print(f"\n### The report's measurements on the training device ({windows} windows of {context} tokens)\n")
    print(common.format_table(["variant", "Σ s", "attention maps s", "1/rms effect s"],
                              [[r["variant"], r["moments_s"], r["behaviour_s"],
                                "no QK-norm" if r["norm_effect_s"] is None else r["norm_effect_s"]] for r in measured]))
    return [Check("head analysis and report measurements", PASS,
                  f"{summary_frame['model'].nunique()} models; saved in {runs_dir / 'analysis'}")]


def variant_checks(mode: Mode, steps: int, batch_size: int, optimizer: str | None, device: str, runs_dir: Path,
                   results: dict) -> list[Check]:
    """Train the six variants, then every check made on them; the SDPA check and the analysis
    come before decoding, which casts the models to bf16."""
    peak = measure_peak_flops(device, torch.bfloat16, size=mode.matmul_size, seconds=mode.peak_seconds)
    table = gpu_peak(torch.cuda.get_device_name(0)) if device == "cuda" else None
    print(f"\nmeasured bf16 matmul peak ({mode.matmul_size}^3): {peak / 1e12:.1f} TFLOP/s"
          + (f" (data sheet {table[1]:.0f} TFLOP/s dense)" if table else ""), flush=True)
    results["measured_peak_flops"] = peak
    if device == "cuda":
        memory = torch.cuda.get_device_properties(0).total_memory
        fitting = fitting_batch_size(mode.preset, batch_size, optimizer, memory)
        if fitting < batch_size:
            print(f"batch {batch_size} does not fit this card by the plan: the variants train at {fitting}", flush=True)
        batch_size = results["batch_size"] = fitting
    runs, seen = train_variants(mode.preset, steps, batch_size, mode.log_every, device, runs_dir, optimizer)
    results["optimizer"] = next(iter(runs.values())).train_config.optimizer
    results["peak_memory_bytes"] = {label: s["peak_bytes"] for label, s in seen.items()}
    return (stage("SDPA backends", sdpa_checks, runs, device, results)
            + stage("peak memory vs plan", memory_checks, runs, seen, device)
            + stage("recompiles under --compile", recompile_checks, seen, device == "cuda")
            + stage("training throughput", throughput_checks, runs, peak, device == "cuda", results)
            + stage("head analysis and report measurements", analysis_checks, runs, mode.report_windows, runs_dir,
                    results)
            + stage("decoding", decode_checks, runs, mode, results))

