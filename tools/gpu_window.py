"""The first GPU window: what a short loan of a GPU should measure, in at most 9 minutes, in one JSON.

    python tools/gpu_window.py [--out DIR] [--budget-s 540]   # the node's first GPU
    python tools/gpu_window.py --smoke                        # CPU, tiny shapes, a minute or two

Every stage runs in its own process (a crash, a hang or a CUDA error ends that stage only) under
one budget: a stage gets at most what is left of it. Each is forked from this process, which
imports torch and dynamo once and runs nothing on the GPU, so that each stage initialises CUDA
itself, as a fresh process would, without paying those imports again (~3 CPU-s a stage). Results
go to DIR/gpu_window.json, the stages' output to DIR/gpu_window.log. Needs only torch and
node_checks.NEEDS (the GPU image's packages: no ipywidgets, no jupyter). Stages, in order:

- probe: torch, CUDA, the GPU; the collectives Muon's split may call, the TF32 API and whether the
  legacy getters that inductor reads still answer after headlab turns TF32 on, the compile
  backends, Triton, native bf16, the dynamo options headlab's compile watch uses.
- trainer: the real trainer on paper-128m MHA at the one-GPU micro-batch, compiled as "auto"
  decides: tokens/s, MFU (data-sheet peak), peak memory against the plan, checkpoint seconds.
- optimizers: a Muon and an AdamW step's seconds per rank on a fake 8-rank group, 128M and 2.5B.
- lrkv_memory: eager LRKV r=64 peak memory against the plan.
- attention: scaled_dot_product_attention forward+backward per SDPA backend, paper-128m shapes.
- notice_then_ddp: on one NCCL rank, whether the DDP step compiles graphs of its own after the
  training notice's timing compiled the bare model (DDP's gradient hooks need their own graph).
- recompile_order: reproduce's six variants compiled in its order, against the recompile limit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_checks  # noqa: E402  (puts the repository root on sys.path)
import torch  # noqa: E402

BUDGET_S = 540.0  # 9 minutes
STAGE_CAP_S = {"probe": 60, "trainer": 180, "optimizers": 120, "lrkv_memory": 90, "attention": 60,
               "notice_then_ddp": 90, "recompile_order": 90}
STAGES = tuple(STAGE_CAP_S)
GIB = 1 << 30


def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def seconds(fn, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ---- the stages (each returns a JSON-able dict) -------------------------------------------------

def probe(smoke: bool) -> dict:
    import importlib.util

    import torch.distributed as dist

    from headlab.training.distributed import allow_tf32_matmuls
    found = {}
    if torch.cuda.is_available():
        found.update(gpu=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                     memory_gib=torch.cuda.get_device_properties(0).total_memory / GIB,
                     bf16_native=torch.cuda.get_device_capability(0) >= (8, 0))
    allow_tf32_matmuls()
    readable = {}
    for name, read in (("allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                       ("get_float32_matmul_precision", torch.get_float32_matmul_precision),
                       ("fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision)):
        try:
            readable[name] = str(read())
        except Exception as error:  # the "mix of the legacy and new APIs" RuntimeError
            readable[name] = f"raises {type(error).__name__}"
    dynamo, functorch = torch._dynamo.config, torch._functorch.config
    return {**found, "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "collectives": {name: hasattr(dist, name) for name in
                            ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_tensor")},
            "nccl": dist.is_nccl_available(), "tf32_after_headlab": readable,
            "compile_backends": sorted(torch._dynamo.list_backends()),
            "triton": importlib.util.find_spec("triton") is not None,
            "dynamo_options": {"fail_on_recompile_limit_hit": hasattr(dynamo, "fail_on_recompile_limit_hit"),
                               "force_non_lazy_backward_lowering": hasattr(functorch,
                                                                           "force_non_lazy_backward_lowering"),
                               "recompile_limit": getattr(dynamo, "recompile_limit", None)},
            "ipywidgets": not node_checks.missing_modules(("ipywidgets",)),
            "missing_needs": node_checks.missing_modules()}


def trainer(smoke: bool) -> dict:
    from headlab import preset
    from headlab.runs.folder import RunFolder
    from headlab.training.config import train_preset
    from headlab.training.flops import model_flops_utilization
    from headlab.training.hardware import gpu_peak
    from headlab.training.memory import memory_per_device
    from headlab.training.trainer import train
    name, steps = ("tiny", 6) if smoke else ("paper-128m", 40)
    config = preset(name, "mha")
    train_config = train_preset(name, steps=steps, log_every=max(1, steps // 4), eval_every=steps, eval_batches=1,
                                checkpoint_every=steps, device=str(device()))
    if not smoke:
        train_config = train_config.replace(compile="auto")
    saved, checkpoint = [], RunFolder.checkpoint

    def timed_checkpoint(self, *args, **kwargs):
        start = time.perf_counter()
        checkpoint(self, *args, **kwargs)
        saved.append(time.perf_counter() - start)

    RunFolder.checkpoint = timed_checkpoint
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as folder:
        run = train(config, train_config, "synthetic", out=Path(folder) / "run", progress=False)
    windows = [r["tokens_per_s"] for r in run.metrics if "tokens_per_s" in r][1:]  # the first holds the compile
    tokens_per_s = statistics.median(windows)
    planned = memory_per_device(config, train_config.batch_size, 1, "ddp", train_config.optimizer,
                                train_config.dtype).total
    peak = gpu_peak(torch.cuda.get_device_name(0), train_config.dtype) if torch.cuda.is_available() else None
    found = {"preset": name, "micro_batch": train_config.batch_size, "steps": steps, "tokens_per_s": tokens_per_s,
             "planned_bytes": planned, "checkpoint_s": saved}
    if peak:
        found["mfu_datasheet"] = model_flops_utilization(config, tokens_per_s, peak[1] * 1e12)
    if torch.cuda.is_available():
        found["peak_bytes"] = torch.cuda.max_memory_allocated()
        found["peak_of_plan"] = found["peak_bytes"] / planned
    return found


def optimizers(smoke: bool) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from headlab import preset
    from headlab.model.gpt import GPT
    from headlab.training.config import train_preset
    from headlab.training.optimizers import make_optimizers
    from headlab.training.sharding import OptimizerStep
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)  # collectives send nothing
    found = {}
    try:
        for name in (("tiny", "cpu-small") if smoke else ("paper-128m", "paper-2.5b")):
            with torch.device(device()):
                model = GPT(preset(name, "mha"))
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            for optimizer in ("muon", "adamw"):
                # rank 0's share of the sharded step: clipping, its parameters' update, the exchange
                steps = OptimizerStep(model, make_optimizers(model, train_preset(name, optimizer=optimizer)),
                                      dist.group.WORLD)
                try:
                    found[f"{name} {optimizer} s/step per rank"] = seconds(lambda: steps(1.0), 1 if smoke else 3)
                except Exception as error:
                    found[f"{name} {optimizer} s/step per rank"] = f"raised {type(error).__name__}: {error}"[:200]
                del steps
            del model
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return found


def lrkv_memory(smoke: bool) -> dict:
    from headlab import preset
    from headlab.training.config import train_preset
    from headlab.training.hardware import measure_step
    from headlab.training.memory import memory_per_device
    name = "tiny" if smoke else "paper-128m"
    config = preset(name, "lrkv", kv_rank=4 if smoke else 64)
    train_config = train_preset(name, compile="off", device=str(device()))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    step = measure_step(config, train_config, repeats=1)
    planned = memory_per_device(config, train_config.batch_size, 1, "ddp", train_config.optimizer,
                                train_config.dtype).total
    found = {"preset": name, "kv_rank": config.kv_rank, "step_s": step.seconds, "planned_bytes": planned}
    if torch.cuda.is_available():
        found.update(peak_bytes=torch.cuda.max_memory_allocated(),
                     peak_of_plan=torch.cuda.max_memory_allocated() / planned)
    return found


def attention(smoke: bool) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    batch, heads, length, width = (2, 4, 32, 8) if smoke else (8, 6, 2048, 128)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    q, k, v = (torch.randn(batch, heads, length, width, device=device(), dtype=dtype, requires_grad=True)
               for _ in range(3))
    found = {"shape": [batch, heads, length, width], "dtype": str(dtype)}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        def step():
            with sdpa_kernel(backend):
                scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        try:
            found[f"{backend.name} ms"] = 1e3 * seconds(step, 2 if smoke else 10)
        except RuntimeError as error:
            found[f"{backend.name} ms"] = f"unavailable: {str(error).splitlines()[0][:120]}"
    return found


def notice_then_ddp(smoke: bool) -> dict:
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from headlab import GPT, preset
    from headlab.training.compiling import compiled_forward
    from headlab.training.config import train_preset
    from headlab.training.hardware import measure_step
    from headlab.training.processes import Processes
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("GPU_WINDOW_PORT", "29517"))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    try:
        name = "tiny" if smoke else "paper-128m"
        # On the CPU, "eager": the graphs counted are dynamo's, whatever backend compiles them, and
        # eager spares AOT autograd's tracing (~2 CPU-s of --smoke)
        backend = "inductor" if torch.cuda.is_available() else "eager"
        train_config = train_preset(name, compile=backend, device=str(device()), batch_size=2)
        config = preset(name, "mha")
        # the notice as rank 0 of a 2-process DDP job times it (H6: compiled apart from GPT.forward)
        measure_step(config, train_config, repeats=1, processes=Processes(0, 2, 0))
        graphs = counters["stats"]["unique_graphs"]
        model = GPT(config).to(device())
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if torch.cuda.is_available() else None)
        forward = compiled_forward(ddp, backend, backend, print)
        tokens = torch.randint(0, config.vocab_size, (2, config.seq_len), device=device())
        forward(tokens, tokens, loss_only=True).backward()
        return {"backend": backend, "notice_graphs": graphs,
                "ddp_step_new_graphs": counters["stats"]["unique_graphs"] - graphs}
    finally:
        dist.destroy_process_group()


def recompile_order(smoke: bool) -> dict:
    from headlab.model.gpt import GPT
    from headlab.study.roles import comparison_variants
    from headlab.training.compiling import FIRST_STEP_RECOMPILE_LIMIT, compiled_forward

    said = []
    variants = comparison_variants("tiny" if smoke else "paper-128m")
    if smoke:  # one block: dynamo traces every block of each variant (~0.4 CPU-s a block), each block alike
        variants = [variant.replace(n_layer=1) for variant in variants]
    order = [variant.label for variant in variants]
    for variant in variants:  # reproduce's order; dynamo's guards decide, so "eager" backs it
        with torch.device(device()):
            forward = compiled_forward(GPT(variant), "eager", "eager", said.append)
        tokens = torch.randint(0, variant.vocab_size, (1, min(variant.seq_len, 64)), device=device())
        forward(tokens, tokens)[1].backward()
    entries = len(torch._dynamo.eval_frame._debug_get_cache_entry_list(GPT.forward.__code__))
    return {"order": order, "compiled_versions": entries, "recompile_limit": torch._dynamo.config.recompile_limit,
            "first_step_limit": FIRST_STEP_RECOMPILE_LIMIT, "fallback_lines": said}


# ---- the window -------------------------------------------------------------------------------

def run_stage(name: str, smoke: bool, result: Path) -> int:
    """One stage in this process: its dict, or the error that ended it, to `result`."""
    if smoke:
        torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        found = {"ok": True, **globals()[name](smoke)}
    except Exception as error:
        traceback.print_exc()
        found = {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}
    found["seconds"] = time.perf_counter() - started
    result.write_text(json.dumps(found, default=str))
    return 0 if found["ok"] else 1


def forked_stage(name: str, smoke: bool, result: Path, output: Path, timeout: float) -> subprocess.CompletedProcess:
    """`run_stage` in a child forked from this process, in a session of its own, its stdout and
    stderr both to `output` (returned as the stderr); past `timeout` seconds the whole session
    (a stage's own children too) is killed and the output ends saying so. This process must not
    have run a torch operation: a child forked after OpenMP ran hangs at its first parallel
    region, and one forked after CUDA started cannot use the GPU."""
    sys.stdout.flush()
    sys.stderr.flush()  # else the child would write this process's pending output as its own
    with warnings.catch_warnings():  # Python >= 3.12 warns of torch's idle thread pool, which holds no lock here
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:
        status = 1
        try:
            os.setsid()
            descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(descriptor, 1)
            os.dup2(descriptor, 2)
            sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # not an inherited capture
            status = run_stage(name, smoke, result)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(status)  # never back into the caller's code, nor its exit handlers
    deadline, late = time.monotonic() + timeout, ""
    while not (ended := os.waitpid(child, os.WNOHANG))[0]:
        if time.monotonic() > deadline:
            os.killpg(child, signal.SIGKILL)
            ended, late = os.waitpid(child, 0), f"\ntimed out after {timeout:.0f} s"
            break
        time.sleep(0.05)
    output_text = output.read_text(errors="replace") + late
    return subprocess.CompletedProcess(name, os.waitstatus_to_exitcode(ended[1]), "", output_text)


def window(out: Path, smoke: bool, budget_s: float) -> dict:
    """Every stage in its own process, in order, each under min(its cap, what is left of `budget_s`)."""
    out.mkdir(parents=True, exist_ok=True)
    log, results, started = out / "gpu_window.log", {}, time.perf_counter()
    with log.open("w") as written:
        for name in STAGES:
            left = budget_s - (time.perf_counter() - started)
            if left < 5:
                results[name] = {"ok": False, "error": "skipped: the window's budget is spent"}
                continue
            result, output = out / f"{name}.json", out / f"{name}.out"
            done = forked_stage(name, smoke, result, output, min(STAGE_CAP_S[name], left))
            written.write(f"## {name}: exit {done.returncode}\n{done.stderr}\n")
            written.flush()
            results[name] = (json.loads(result.read_text()) if result.exists() else
                             {"ok": False, "error": node_checks.failure(done)})
            result.unlink(missing_ok=True)
            output.unlink()
            print(f"{name}: {'ok' if results[name]['ok'] else results[name]['error']}", flush=True)
    report = {"smoke": smoke, "budget_s": budget_s, "elapsed_s": time.perf_counter() - started, "stages": results}
    (out / "gpu_window.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes (checks the script)")
    p.add_argument("--out", default="gpu_window", help="folder of gpu_window.json and gpu_window.log")
    p.add_argument("--budget-s", type=float, default=BUDGET_S)
    args = p.parse_args(argv)
    importlib.import_module("torch._dynamo")  # all stages but attention import it (~1.3 CPU-s): once, before they fork
    report = window(Path(args.out), args.smoke, args.budget_s)
    print(f"{sum(s['ok'] for s in report['stages'].values())} of {len(STAGES)} stages ran; "
          f"{report['elapsed_s']:.0f} s; results in {Path(args.out) / 'gpu_window.json'}")
    return 0 if all(s["ok"] for s in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
