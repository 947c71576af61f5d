"""The GPU check: paper-128m's six comparison variants trained in bf16 with torch.compile, with
tokens/s and MFU against this GPU's measured bf16 matmul peak, decode speed-ups at context 2048,
cache bytes against the formula, the head analysis of the trained models, and the report's
forward-pass measurements (Σ, attention maps, QK-norm's 1/rms) on the device the models trained on.

    benchmarks/gpu_check.sh                 # one GPU, about 6 to 8 minutes on an H100/H200
    python benchmarks/gpu_check.py --smoke  # CPU, tiny preset, a few steps: checks the script

Targets (GPU only): Standard MHA reaches >= 40 % MFU, and every variant >= 90 % of MHA's
tokens/s. Exit status 0 when they are met (always 0 with --smoke, where they are only
printed), 1 otherwise. The corpus is `synthetic` (offline) with byte tokens inside the preset's
50304-token vocabulary: the compute per step is the paper's, but the losses are not a language
result. MFU is headlab.training.plan.model_flops_utilization (6·N + causal attention FLOPs per token); tokens/s
is the median of the logged windows after the first one, which holds compilation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common  # type: ignore[no-redef]

import torch  # noqa: E402

from headlab.analysis import inputs, similarity as analysis  # noqa: E402
from headlab.model import decoding  # noqa: E402
from headlab.study.roles import comparison_variants  # noqa: E402
from headlab.data.corpus import load_corpus  # noqa: E402
from headlab.training.plan import gpu_peak, measure_peak_flops, model_flops_utilization  # noqa: E402
from headlab.study.study import slug  # noqa: E402
from headlab.training.config import train_preset  # noqa: E402
from headlab.training.trainer import train  # noqa: E402

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
    report_windows: int  # full-context windows for the report's forward-pass measurements (the report: 8; time scales with it)


MODES = {"gpu": Mode("paper-128m", 200, 16, 20, 8192, 2.0, 64, 0.2, 2),
         "smoke": Mode("tiny", 6, 4, 2, 128, 0.05, 4, 0.01, 2)}


def train_variants(preset: str, steps: int, batch_size: int, log_every: int, device: str, runs_dir: Path,
                   optimizer: str | None = None):
    """Train the six comparison variants (with the preset's optimizer unless one is given);
    returns {label: Run}."""
    corpus = load_corpus("synthetic", tokenizer="byte")
    config = train_preset(preset, steps=steps, batch_size=batch_size, warmup_steps=max(1, steps // 10),
                          dtype="bfloat16", compile=device == "cuda", device=device, log_every=log_every,
                          eval_every=steps, eval_batches=2, checkpoint_every=steps)
    if optimizer:
        config = config.replace(optimizer=optimizer)
    runs = {}
    for variant in comparison_variants(preset):
        started = time.perf_counter()
        runs[variant.label] = train(variant, config, corpus, out=runs_dir / slug(variant.label), progress=False)
        print(f"  trained {variant.label} in {time.perf_counter() - started:.0f} s", flush=True)
    return runs


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


def analyze_runs(runs: dict) -> "analysis.Analysis":
    """The head analysis of every trained model (QK circuit, all layers, fp32 weights)."""
    return analysis.concat(analysis.analyze(run.model, label=label) for label, run in runs.items())


def report_measurements(runs: dict, windows: int) -> list[dict]:
    """The report's forward-pass measurements of every model where it trained, on `windows` random
    windows of its full context: Σ (`inputs.input_moments`), the attention-map similarity and,
    where the variant has QK-norm, `analysis.norm_scale_effect`; seconds per measurement."""
    rows = []
    for label, run in runs.items():
        config = run.model_config
        tokens = torch.randint(0, 256, (windows, config.seq_len), generator=torch.Generator().manual_seed(0))
        row = {"variant": label}
        for name, measure in (("moments_s", inputs.input_moments), ("behaviour_s", analysis.attention_similarity),
                              ("norm_effect_s", analysis.norm_scale_effect if config.qk_norm else None)):
            if measure is None:
                row[name] = None
                continue
            start = time.perf_counter()
            measure(run.model, tokens)
            row[name] = time.perf_counter() - start
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny preset, a few steps (checks the script)")
    p.add_argument("--steps", type=int, help="training steps per variant (default 200; smoke 6)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 16; smoke 4)")
    p.add_argument("--optimizer", choices=("adamw", "muon"), help="default: the preset's (paper-128m: muon)")
    p.add_argument("--runs-dir", help="where the six runs go (default: a temporary folder)")
    p.add_argument("--json", help="write the results here as JSON")
    args = p.parse_args(argv)
    mode = MODES["smoke" if args.smoke else "gpu"]
    preset, steps, batch_size = mode.preset, args.steps or mode.steps, args.batch_size or mode.batch_size
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; use --smoke to check the script on CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        torch.set_num_threads(1)  # tiny tensors: more threads only fight over a shared CPU
    started = time.perf_counter()
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(common.machine_header(f"GPU check: {preset}, six variants, bf16" + (", torch.compile" if device == "cuda" else ""),
                                {"device": name, "steps x batch": f"{steps} x {batch_size}"}, quick=args.smoke), flush=True)

    peak = measure_peak_flops(device, torch.bfloat16, size=mode.matmul_size, seconds=mode.peak_seconds)
    table = gpu_peak(name) if device == "cuda" else None
    print(f"measured bf16 matmul peak ({mode.matmul_size}^3): {peak / 1e12:.1f} TFLOP/s"
          + (f" (data sheet {table[1]:.0f} TFLOP/s dense)" if table else ""), flush=True)

    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="headlab-gpu-check-"))
    runs = train_variants(preset, steps, batch_size, mode.log_every, device, runs_dir, args.optimizer)
    result = analyze_runs(runs)  # before decoding casts the models to bf16
    measured = report_measurements(runs, mode.report_windows)
    rows = throughput_rows(runs, peak)
    print("\n### Training throughput\n")
    print(common.format_table(["variant", "tokens/s", "MFU (measured peak)", "of MHA tokens/s", "val loss"],
                              [[r["variant"], round(r["tokens_per_s"]), r["mfu"], r["of_mha"], r["final_val_loss"]]
                               for r in rows]))
    checks = [(f"Standard MHA MFU {100 * rows[0]['mfu']:.1f}% >= {100 * MHA_MFU_TARGET:.0f}%",
               rows[0]["mfu"] >= MHA_MFU_TARGET)]
    checks += [(f"{r['variant']} at {100 * r['of_mha']:.0f}% of MHA tokens/s >= {100 * VARIANT_THROUGHPUT_TARGET:.0f}%",
                r["of_mha"] >= VARIANT_THROUGHPUT_TARGET) for r in rows[1:]]

    context, cache, speed, latency = decode_tables(runs, mode.new_tokens, mode.timing_s)
    print(f"\n### Decoding at context {context} (bf16, batch 1)\n")
    print(cache.to_string(), "\n")
    print(speed.to_string(), "\n")
    print(latency.to_string(index=False))
    checks.append(("cache bytes equal the formula for every variant", bool(cache["agree"].all())))

    n_layer = next(iter(runs.values())).model_config.n_layer
    layers = sorted({0, n_layer // 2, n_layer - 1})  # the flagship figure's early / middle / late
    summary = result.summary
    picked = summary[summary["layer"].isin(layers)]
    print("\n### Head analysis (QK circuit), layers " + ", ".join(map(str, layers)) + "\n")
    print(picked.pivot_table(index="model", columns=["kind", "layer"], values="effective_rank", sort=False).round(2).to_string())
    result.save(runs_dir / "analysis")
    print(f"\n### The report's measurements on the training device ({mode.report_windows} windows of {context} tokens)\n")
    print(common.format_table(["variant", "Σ s", "attention maps s", "1/rms effect s"],
                              [[r["variant"], r["moments_s"], r["behaviour_s"],
                                "no QK-norm" if r["norm_effect_s"] is None else r["norm_effect_s"]] for r in measured]))

    print("\n### Targets" + (" (printed, not enforced, in --smoke)" if args.smoke else "") + "\n")
    for text, ok in checks:
        print(f"- {common.verdict(ok)} {text}")
    elapsed = time.perf_counter() - started
    print(f"\ntotal {elapsed:.0f} s; runs and analysis in {runs_dir}"
          + ("" if args.smoke or elapsed <= 480 else " (more than the 8 minutes this check is meant to take)"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": name, "measured_peak_flops": peak, "preset": preset, "steps": steps, "batch_size": batch_size,
            "optimizer": next(iter(runs.values())).train_config.optimizer,
            "throughput": rows, "cache": cache.reset_index().to_dict("records"),
            "generation": speed.reset_index().to_dict("records"), "step_latency": latency.to_dict("records"),
            "report_measurements": measured,
            "checks": [{"check": text, "passed": ok} for text, ok in checks], "elapsed_s": elapsed}, indent=2, default=str))
    return 0 if args.smoke or all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
