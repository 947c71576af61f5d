"""The GPU check: what breaks on a GPU node, checked on what the node has, in one summary table.

    tools/gpu_check.sh                 # the node's GPUs: about 8 to 10 minutes on an H100/H200 (estimated)
    python tools/gpu_check.py --smoke  # CPU, tiny preset, a few steps: checks the script

Stages (each gives rows of the summary table: check, PASS / FAIL / SKIP, detail):

- torchrun: `python -m torch.distributed.run --standalone --nproc_per_node N -m headlab train` of a
  tiny run with DDP on the node's N GPUs (NCCL), and FSDP (`--parallel fsdp`) when N >= 2; each
  must exit 0, write its run folder and end where one process training the same steps ends.
- checkpoint and exact resume: a run killed in step 5, after its step-4 checkpoint, then continued
  with `--resume`, ends bit for bit where the uninterrupted run ends.
- six variants of paper-128m trained in bf16 with torch.compile on one GPU, and on them: the SDPA
  backend each family runs, the peak memory of training against the plan's figure
  (headlab.training.memory.memory_per_device), recompilations, tokens/s and MFU against this GPU's
  measured bf16 matmul peak (headlab.training.flops.model_flops_utilization), decoding at context
  2048 with cache bytes against the formula, the head analysis and the report's forward-pass
  measurements (Σ, attention maps, QK-norm's 1/rms) on the device the models trained on.
- tokenization throughput (benchmarks/tokenization.py's core on a few MB of generated text; it
  needs the `corpora` extra, pyarrow and zstandard: without them its row SKIPs, saying so).

Performance targets (judged on a GPU; printed as SKIP in --smoke): Standard MHA reaches >= 40 %
MFU, and every variant >= 90 % of MHA's tokens/s. A target missed is a WARN, not a FAIL: a slow
node is still a working one. Exit status 1 when any check FAILs, 0 otherwise. Without a CUDA device
(and without --smoke) every GPU stage is a SKIP row saying so, the CPU-only rows still run, and the
exit status is 0: the table says what this node can and cannot check. The variants' corpus is
`synthetic` (offline) with byte tokens inside the preset's 50304-token vocabulary: the compute per
step is the paper's, but the losses are not a language result. Tokens/s is the median of the logged
windows after the first one, which holds compilation.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for benchmarks.common
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import common
from headlab.analysis import attention_maps, inputs, qk_norm
from headlab.analysis import similarity as analysis
from headlab.data.corpus import load_corpus
from headlab.model import decoding
from headlab.runs.checkpoints import checkpoint_step, has_checkpoint
from headlab.study.roles import comparison_variants
from headlab.training.config import train_preset
from headlab.training.flops import model_flops_utilization
from headlab.training.hardware import gpu_peak, measure_peak_flops
from headlab.training.memory import memory_per_device, micro_batch_size
from headlab.training.plan import format_bytes
from headlab.training.runs import Run, load_run
from headlab.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
PASS, FAIL, SKIP, WARN = "PASS", "FAIL", "SKIP", "WARN"
OPTIONAL_EXTRAS = {"pyarrow": "corpora", "zstandard": "corpora"}  # module -> the headlab extra that installs it
MHA_MFU_TARGET = 0.40
VARIANT_THROUGHPUT_TARGET = 0.90  # of MHA's tokens/s
ELAPSED_TARGET_S = 600


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


MODES = {"gpu": Mode("paper-128m", 200, 16, 20, 8192, 2.0, 64, 0.2, 2, 16),
         "smoke": Mode("tiny", 6, 4, 2, 128, 0.05, 4, 0.01, 2, 2)}


# ---- the summary ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """One row of the summary: what was checked, PASS, FAIL or SKIP, and what was seen (or why not)."""

    check: str
    result: str
    detail: str


def verdict(check: str, ok: bool, detail: str) -> Check:
    """PASS when `ok`, else FAIL."""
    return Check(check, PASS if ok else FAIL, detail)


def target(check: str, ok: bool, detail: str, enforced: bool) -> Check:
    """A performance target: PASS, or WARN when missed, where it is judged (on a GPU): a slow node
    still trains correctly, so it does not FAIL the check; else SKIP, still saying what was
    measured (a CPU's numbers say nothing about a GPU's)."""
    if not enforced:
        return Check(check, SKIP, detail + "; not judged in --smoke")
    return Check(check, PASS if ok else WARN, detail)


def stage(name: str, function, *args) -> list[Check]:
    """`function(*args)`'s rows (a Check or a list of them); if it raises, one FAIL row naming the
    error (traceback on stderr), so that one broken stage neither hides the others nor ends the
    check without its summary."""
    try:
        rows = function(*args)
        return rows if isinstance(rows, list) else [rows]
    except Exception as error:
        traceback.print_exc()
        message = (str(error).strip().splitlines() or [""])[0][:200]
        return [Check(name, FAIL, f"raised {type(error).__name__}: {message}")]


def summary(checks: list[Check]) -> str:
    """The summary table, and how many checks passed, failed and were skipped."""
    table = common.format_table(["check", "result", "detail"], [[c.check, c.result, c.detail] for c in checks])
    counts = ", ".join(f"{sum(c.result == result for c in checks)} {result}" for result in (PASS, FAIL, WARN, SKIP))
    return f"\n## Summary\n\n{table}\n\n{len(checks)} checks: {counts}"


# ---- torchrun, checkpoints and exact resume ------------------------------------------------------

# A tiny run, short enough that a process's start-up dominates; lr 1e-3, so a step done wrong (a
# gradient lost in a collective, an optimizer state not restored) moves weights by about 1e-3.
TINY_RUN = ["train", "--preset", "tiny", "--attention", "lrkv", "--corpus", "synthetic", "--steps", "6",
            "--lr", "1e-3", "--log-every", "1", "--eval-every", "3", "--checkpoint-every", "2", "--no-progress"]
KILLED_IN_STEP, RESUMED_FROM = 5, 4  # one process, no accumulation: forward k is in step k
# Another split of the batch or an all-reduce sums in another order: weights move by ~1e-6.
SAME_TRAINING = 1e-4
# A resume on CUDA with a kernel that has no deterministic version (atomics) cannot be bit-identical.
CUDA_RESUME_TOLERANCE = 1e-5
CHILD_TIMEOUT_S = 600  # a hung NCCL rendezvous ends as a FAIL, not a hung check
# `headlab train` that ends its process, as a kill would, at its GPU_CHECK_KILL_AT-th training
# forward (0: never), with torch's deterministic kernels on CUDA: two trainings of the same steps
# can then be compared bit for bit, so the resume check sees the checkpoint, not kernel noise.
RESUMABLE_TRAIN = """
import os, sys
import torch
from headlab.cli.main import main
from headlab.model.gpt import GPT

if torch.cuda.is_available():
    torch.use_deterministic_algorithms(True, warn_only=True)
kill_at, forward, calls = int(os.environ["GPU_CHECK_KILL_AT"]), GPT.forward, [0]

def counted_forward(self, *args, **kwargs):
    if self.training:
        calls[0] += 1
        if calls[0] == kill_at:
            os._exit(3)
    return forward(self, *args, **kwargs)

GPT.forward = counted_forward
sys.exit(main(sys.argv[1:]))
"""


@dataclass(frozen=True)
class Launch:
    """Where the torchrun and resume checks train: `processes` ranks on `device` (one per GPU; two
    CPU processes in --smoke), with run folders under `folder`."""

    device: str
    processes: int
    folder: Path

    @property
    def batch_size(self) -> int:
        return 4 * self.processes  # splits evenly across the ranks

    @property
    def backend(self) -> str:
        return "NCCL" if self.device == "cuda" else "gloo"


def run_child(command: list[str], kill_at: int = 0) -> subprocess.CompletedProcess:
    """Run `command` with this checkout's headlab first on PYTHONPATH, one OpenMP thread, cuBLAS's
    deterministic workspace and GPU_CHECK_KILL_AT; after CHILD_TIMEOUT_S its whole process group
    (torchrun's workers too) is killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "GPU_CHECK_KILL_AT": str(kill_at)}
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        stderr += f"\ntimed out after {CHILD_TIMEOUT_S} s"
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


def train_tiny(launch: Launch, name: str, *extra: str, torchrun: bool = False,
               kill_at: int = 0) -> tuple[subprocess.CompletedProcess, Path]:
    """`headlab train` of TINY_RUN into launch.folder/name: under torchrun on all `launch.processes`
    exactly as a user starts it (`-m headlab`), or as one process through RESUMABLE_TRAIN (killed at
    its `kill_at`-th training forward if given). Returns the finished process and the run folder."""
    out = launch.folder / name
    program = (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={launch.processes}", "-m", "headlab"]
               if torchrun else [str(launch.folder / "resumable_train.py")])
    started = time.perf_counter()
    done = run_child([sys.executable, *program, *TINY_RUN, "--device", launch.device, "--batch-size",
                      str(launch.batch_size), *extra, "--out", str(out)], kill_at)
    killed = f" (killed at training forward {kill_at})" if kill_at else ""
    print(f"  {name}: exit {done.returncode}{killed} in {time.perf_counter() - started:.0f} s", flush=True)
    if done.returncode and not kill_at:
        print("\n".join(done.stderr.splitlines()[-20:]), flush=True)
    return done, out


def failure(done: subprocess.CompletedProcess) -> str:
    """A failed process in one line: its exit status and the last line it wrote to stderr."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return f"exit {done.returncode}: {lines[-1][:160] if lines else 'no error output'}"


def max_difference(a: Run, b: Run) -> float:
    """The largest |difference| between two runs' final weights and logged losses."""
    if [r["step"] for r in a.metrics] != [r["step"] for r in b.metrics]:
        raise ValueError(f"the runs logged different steps: {len(a.metrics)} vs {len(b.metrics)} records")
    weights = b.model.state_dict()
    losses = [abs(x[k] - y[k]) for x, y in zip(a.metrics, b.metrics) for k in ("train_loss", "val_loss") if k in x]
    return max([(v - weights[k]).abs().max().item() for k, v in a.model.state_dict().items()] + losses)


def parallel_check(launch: Launch, reference: Run, parallel: str) -> Check:
    """torchrun with `parallel` (ddp or fsdp) on all ranks: exits 0, writes its run folder, and ends
    within SAME_TRAINING of the one-process reference run of the same steps."""
    check = f"torchrun {parallel.upper()}"
    done, out = train_tiny(launch, parallel, "--parallel", parallel, torchrun=True)
    if done.returncode or not has_checkpoint(out):
        return Check(check, FAIL, failure(done) if done.returncode else f"no checkpoint in {out}")
    difference = max_difference(load_run(out), reference)
    collectives = launch.backend if launch.processes > 1 else "one process: no collectives, NCCL needs >= 2 GPUs"
    return verdict(check, difference <= SAME_TRAINING, f"{launch.processes} x {launch.device} ({collectives}); max abs "
                                                       f"difference from 1 process {difference:.1e} (tolerance "
                                                       f"{SAME_TRAINING:.0e})")


def resume_verdict(difference: float, device: str) -> Check:
    """Exact resume: bit-identical to the uninterrupted run; on CUDA, where a kernel without a
    deterministic version makes that impossible, within CUDA_RESUME_TOLERANCE (said in the detail)."""
    check = "checkpoint and exact resume"
    if difference == 0:
        return Check(check, PASS, f"killed in step {KILLED_IN_STEP}, resumed from step {RESUMED_FROM} on {device}: "
                                  "bit-identical weights and losses")
    if device == "cuda" and difference <= CUDA_RESUME_TOLERANCE:
        return Check(check, PASS, "not bit-identical (a CUDA kernel without a deterministic version): max abs "
                                  f"difference {difference:.1e} <= {CUDA_RESUME_TOLERANCE:.0e}")
    return Check(check, FAIL, f"the resumed run differs from the uninterrupted one by up to {difference:.1e}")


def resume_check(launch: Launch, reference: Run) -> Check:
    """A run killed (os._exit, as a kill would) in step 5 keeps its step-4 checkpoint, and continued
    with --resume it ends where the uninterrupted reference run ends (`resume_verdict`)."""
    killed, out = train_tiny(launch, "resumed", kill_at=KILLED_IN_STEP)
    if killed.returncode == 0 or checkpoint_step(out) != RESUMED_FROM:
        return Check("checkpoint and exact resume", FAIL, f"killed run: exit {killed.returncode}, checkpoint of step "
                                                          f"{checkpoint_step(out)} (expected {RESUMED_FROM})")
    done, out = train_tiny(launch, "resumed", "--resume")
    if done.returncode:
        return Check("checkpoint and exact resume", FAIL, "resume " + failure(done))
    return resume_verdict(max_difference(load_run(out), reference), launch.device)


def distributed_checks(launch: Launch) -> list[Check]:
    """torchrun DDP, torchrun FSDP (>= 2 ranks) and exact resume, each against one uninterrupted
    one-process reference run of the same tiny training."""
    print(f"\n### torchrun and exact resume ({launch.processes} x {launch.device}, {launch.backend})\n", flush=True)
    launch.folder.mkdir(parents=True, exist_ok=True)
    (launch.folder / "resumable_train.py").write_text(RESUMABLE_TRAIN)
    done, out = train_tiny(launch, "reference")
    if done.returncode:
        return [Check("torchrun and resume: 1-process reference run", FAIL, failure(done))]
    reference = load_run(out)
    checks = stage("torchrun DDP", parallel_check, launch, reference, "ddp")
    checks += (stage("torchrun FSDP", parallel_check, launch, reference, "fsdp") if launch.processes > 1 else
               [Check("torchrun FSDP", SKIP, "needs >= 2 GPUs; this node has 1")])
    return checks + stage("checkpoint and exact resume", resume_check, launch, reference)


# ---- the six variants -------------------------------------------------------------------------

class RecompileLog(logging.Handler):
    """While entered, torch's `recompiles` log is on (torch._logging.set_logs, which also prints it)
    and each message it logs is kept in `messages`: one per function compiled again because the
    guards of its earlier compilation failed (the message names the guard). A new model's first
    compilation after torch.compiler.reset() logs none. On exit every torch log is back to its
    default (a TORCH_LOGS setting is not restored)."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "recompiles" in record.name:
            self.messages.append(record.getMessage())

    def __enter__(self) -> "RecompileLog":
        torch._logging.set_logs(recompiles=True)
        logging.getLogger("torch._dynamo").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("torch._dynamo").removeHandler(self)
        torch._logging.set_logs()


class PeakMemory:
    """The CUDA memory the block allocated at its peak beyond what was allocated when it began
    (earlier models still on the GPU): `bytes` after the block; None off CUDA."""

    def __init__(self, device: str):
        self.cuda, self.bytes, self.start = device == "cuda", None, 0

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.start


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


# ---- tokenization -----------------------------------------------------------------------------

def tokenization_checks(megabytes: float, results: dict) -> list[Check]:
    """Tokenization throughput (informational, PASS when it ran): M tokens/s writing the shards of
    `megabytes` of generated .jsonl text with 1 and 2 worker processes, per tokenizer that
    benchmarks/tokenization.py finds here (byte, a trained BPE, GPT-2 when its files are here)."""
    print(f"\n### Tokenization ({megabytes:.0f} MB of generated .jsonl text)\n", flush=True)
    try:  # imported here, not at the top: it needs pyarrow and zstandard, which a node may lack
        tokenization = importlib.import_module("benchmarks.tokenization")
    except ModuleNotFoundError as error:
        if error.name not in OPTIONAL_EXTRAS:
            raise
        return [Check("tokenization", SKIP, f"needs {error.name}, which this Python lacks (pip install "
                                            f"'headlab[{OPTIONAL_EXTRAS[error.name]}]')")]
    texts = list(tokenization.documents(megabytes))
    rows, checks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "jsonl"
        tokenization.write_corpus(folder, texts, "jsonl")
        for name, tokenizer in tokenization.tokenizers(texts).items():
            rate = {}
            for workers in (1, 2):
                seconds, _, _, tokens = tokenization.time_shards(folder, tokenizer, workers,
                                                                 Path(tmp) / f"{name.replace(':', '-')}-{workers}")
                rate[workers] = tokens / seconds
                rows.append({"tokenizer": name, "workers": workers, "tokens_per_s": rate[workers]})
            checks.append(Check(f"tokenization: {name}", PASS, f"{rate[1] / 1e6:.2f} M tokens/s with 1 worker, "
                                f"{rate[2] / 1e6:.2f} with 2 ({rate[2] / rate[1]:.2f}x); informational"))
    results["tokenization"] = rows
    print(common.format_table(["tokenizer", "workers", "M tokens/s"],
                              [[r["tokenizer"], r["workers"], r["tokens_per_s"] / 1e6] for r in rows]))
    return checks


# ---- command line -----------------------------------------------------------------------------

# What a node without a GPU cannot check: one SKIP row each.
GPU_STAGES = ("torchrun DDP", "torchrun FSDP", "checkpoint and exact resume",
              "six variants: SDPA backends, peak memory vs plan, recompiles, throughput, analysis, decoding")

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny preset, a few steps (checks the script)")
    p.add_argument("--steps", type=int, help="training steps per variant (default 200; smoke 6)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 16; smoke 4)")
    p.add_argument("--optimizer", choices=("adamw", "muon"), help="default: the preset's (paper-128m: muon)")
    p.add_argument("--runs-dir", help="where the runs go (default: a temporary folder)")
    p.add_argument("--json", help="write the results here as JSON")
    args = p.parse_args(argv)
    mode = MODES["smoke" if args.smoke else "gpu"]
    steps, batch_size = args.steps or mode.steps, args.batch_size or mode.batch_size
    no_gpu = None if args.smoke or torch.cuda.is_available() else \
        f"no CUDA device visible to {sys.executable} (torch {torch.__version__})"
    if no_gpu:
        print(f"gpu_check: {no_gpu}: every GPU check is a SKIP; --smoke checks the script on CPU", file=sys.stderr)
    device = "cpu" if args.smoke or no_gpu else "cuda"
    if args.smoke:
        torch.set_num_threads(1)  # tiny tensors: more threads only fight over a shared CPU
    started = time.perf_counter()
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    print(common.machine_header(f"GPU check: {mode.preset}, six variants, bf16" + (", torch.compile" if gpus else ""),
                                {"python": sys.executable, "device": f"{gpus} x {name}" if gpus else name,
                                 "steps x batch": f"{steps} x {batch_size}"}, quick=args.smoke), flush=True)
    runs_dir = Path(args.runs_dir or tempfile.mkdtemp(prefix="headlab-gpu-check-"))
    results = {"device": name, "gpus": gpus, "preset": mode.preset, "steps": steps, "batch_size": batch_size}
    launch = Launch(device, gpus or 2, runs_dir / "torchrun")  # one rank per GPU; two CPU ranks in --smoke
    if no_gpu:
        checks = [Check(name, SKIP, no_gpu) for name in GPU_STAGES]
    else:
        checks = (stage("torchrun and resume", distributed_checks, launch)
                  + stage("six variants", variant_checks, mode, steps, batch_size, args.optimizer, device, runs_dir,
                          results))
    checks += stage("tokenization", tokenization_checks, mode.tokenize_megabytes, results)
    elapsed = time.perf_counter() - started
    print(summary(checks))
    print(f"total {elapsed:.0f} s; runs and analysis in {runs_dir}"
          + ("" if args.smoke or elapsed <= ELAPSED_TARGET_S else
             f" (more than the {ELAPSED_TARGET_S // 60} minutes this check is meant to take)"))
    if args.json:
        results.update(checks=[asdict(c) for c in checks], elapsed_s=elapsed)
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 1 if any(c.result == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
