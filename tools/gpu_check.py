"""The GPU check: what breaks on a GPU node, checked on what the node has, in one summary table.

    tools/gpu_check.sh                 # the node's GPUs: about 8 to 10 minutes on an H100/H200 (estimated)
    python tools/gpu_check.py --smoke  # CPU, tiny preset, a few steps: checks the script (FSDP's torchrun alone)

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
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # node_checks, gpu_variants (run as a module too)
import node_checks  # noqa: E402  (puts the repository root on sys.path, for benchmarks.common)
import torch  # noqa: E402
from gpu_variants import (  # noqa: E402, F401  (the checks' tests read them here)
    MODES,
    Mode,
    memory_check,
    recompile_checks,
    sdpa_backends,
    sdpa_check,
    variant_checks,
)
from node_checks import (  # noqa: E402, F401
    FAIL,
    PASS,
    SKIP,
    Check,
    RecompileLog,
    failure,
    run_child,
    stage,
    summary,
    target,
    verdict,
)

from benchmarks import common  # noqa: E402
from headlab.runs.checkpoints import checkpoint_step, has_checkpoint  # noqa: E402
from headlab.training.runs import Run, load_run  # noqa: E402

ROOT = node_checks.ROOT
OPTIONAL_EXTRAS = {"pyarrow": "corpora", "zstandard": "corpora"}  # module -> the headlab extra that installs it
ELAPSED_TARGET_S = 600


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
KILLED_STATUS = 3  # the exit status of RESUMABLE_TRAIN's kill
# `headlab train` that ends its process, as a kill would, at its GPU_CHECK_KILL_AT-th training
# forward (0: never), with torch's deterministic kernels on CUDA: two trainings of the same steps
# can then be compared bit for bit, so the resume check sees the checkpoint, not kernel noise.
# Given GPU_CHECK_REFERENCE, it first trains the same run uninterrupted into that folder: the
# reference needs no process of its own (~4 CPU-s), and the resumed run's process is still new.
RESUMABLE_TRAIN = """
import os, sys
import torch
from headlab.cli.main import main
from headlab.model.gpt import GPT

if torch.cuda.is_available():
    torch.use_deterministic_algorithms(True, warn_only=True)
reference = os.environ.get("GPU_CHECK_REFERENCE")
if reference and (status := main(sys.argv[1:] + ["--out", reference])):  # the last --out given is the one used
    sys.exit(status)
kill_at, forward, calls = int(os.environ["GPU_CHECK_KILL_AT"]), GPT.forward, [0]

def counted_forward(self, *args, **kwargs):
    if self.training:
        calls[0] += 1
        if calls[0] == kill_at:
            os._exit(%d)
    return forward(self, *args, **kwargs)

GPT.forward = counted_forward
sys.exit(main(sys.argv[1:]))
""" % KILLED_STATUS


@dataclass(frozen=True)
class Launch:
    """Where the torchrun and resume checks train: `processes` ranks on `device` (one per GPU; two
    CPU processes in --smoke), with run folders under `folder`, launched with each of `parallels`
    (--smoke launches FSDP alone: DDP's launch runs the same check, and each costs three processes'
    imports of torch)."""

    device: str
    processes: int
    folder: Path
    parallels: tuple[str, ...] = ("ddp", "fsdp")

    @property
    def batch_size(self) -> int:
        return 4 * self.processes  # splits evenly across the ranks

    @property
    def backend(self) -> str:
        return "NCCL" if self.device == "cuda" else "gloo"


def run_tiny(command: list[str], kill_at: int = 0, reference: Path | None = None) -> subprocess.CompletedProcess:
    """`run_child` with cuBLAS's deterministic workspace, GPU_CHECK_KILL_AT and GPU_CHECK_REFERENCE;
    after CHILD_TIMEOUT_S its whole process group (torchrun's workers too) is killed."""
    env = node_checks.child_env(CUBLAS_WORKSPACE_CONFIG=":4096:8", GPU_CHECK_KILL_AT=str(kill_at),
                                GPU_CHECK_REFERENCE=str(reference or ""))
    return run_child(command, CHILD_TIMEOUT_S, env)


def train_tiny(launch: Launch, name: str, *extra: str, torchrun: bool = False, kill_at: int = 0,
               reference: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """`headlab train` of TINY_RUN into launch.folder/name: under torchrun on all `launch.processes`
    exactly as a user starts it (`-m headlab`), or as one process through RESUMABLE_TRAIN (killed at
    its `kill_at`-th training forward if given, after training the run uninterrupted into
    `reference` if given). Returns the finished process and the run folder."""
    out = launch.folder / name
    program = (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={launch.processes}", "-m", "headlab"]
               if torchrun else [str(launch.folder / "resumable_train.py")])
    started = time.perf_counter()
    done = run_tiny([sys.executable, *program, *TINY_RUN, "--device", launch.device, "--batch-size",
                      str(launch.batch_size), *extra, "--out", str(out)], kill_at, reference)
    trained = f"{reference.name}, then {name}" if reference else name
    killed = f" (killed at training forward {kill_at})" if kill_at else ""
    print(f"  {trained}: exit {done.returncode}{killed} in {time.perf_counter() - started:.0f} s", flush=True)
    if done.returncode != (KILLED_STATUS if kill_at else 0):
        print("\n".join(done.stderr.splitlines()[-20:]), flush=True)
    return done, out


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


def resume_check(launch: Launch, killed: subprocess.CompletedProcess, out: Path, reference: Run) -> Check:
    """The run `killed` (os._exit, as a kill would) in step 5 kept its step-4 checkpoint in `out`,
    and continued there with --resume in a new process it ends where the uninterrupted reference
    run ends (`resume_verdict`)."""
    if killed.returncode == 0 or checkpoint_step(out) != RESUMED_FROM:
        return Check("checkpoint and exact resume", FAIL, f"killed run: exit {killed.returncode}, checkpoint of step "
                                                          f"{checkpoint_step(out)} (expected {RESUMED_FROM})")
    done, out = train_tiny(launch, "resumed", "--resume")
    if done.returncode:
        return Check("checkpoint and exact resume", FAIL, "resume " + failure(done))
    return resume_verdict(max_difference(load_run(out), reference), launch.device)


def distributed_checks(launch: Launch) -> list[Check]:
    """torchrun DDP, torchrun FSDP (>= 2 ranks) and exact resume, each against one uninterrupted
    one-process reference run of the same tiny training, which the process of the run to be killed
    trains first."""
    print(f"\n### torchrun and exact resume ({launch.processes} x {launch.device}, {launch.backend})\n", flush=True)
    launch.folder.mkdir(parents=True, exist_ok=True)
    (launch.folder / "resumable_train.py").write_text(RESUMABLE_TRAIN)
    killed, out = train_tiny(launch, "resumed", kill_at=KILLED_IN_STEP, reference=launch.folder / "reference")
    if not out.exists():  # the reference run failed, so the run to be killed never began
        return [Check("torchrun and resume: 1-process reference run", FAIL, failure(killed))]
    reference = load_run(launch.folder / "reference")
    checks = []
    for parallel in ("ddp", "fsdp"):
        check = f"torchrun {parallel.upper()}"
        if parallel not in launch.parallels:
            checks.append(Check(check, SKIP, f"--smoke launches {', '.join(launch.parallels).upper()} alone (the same "
                                             "check); a GPU node runs both"))
        elif parallel == "fsdp" and launch.processes < 2:
            checks.append(Check(check, SKIP, "needs >= 2 GPUs; this node has 1"))
        else:
            checks += stage(check, parallel_check, launch, reference, parallel)
    return checks + stage("checkpoint and exact resume", resume_check, launch, killed, out, reference)


# ---- the six variants -------------------------------------------------------------------------

# ---- tokenization -----------------------------------------------------------------------------

def tokenization_checks(megabytes: float, results: dict) -> list[Check]:
    """Tokenization throughput (informational, PASS when it ran): M tokens/s writing the shards of
    `megabytes` of generated .jsonl text with 1 and 2 worker processes, per tokenizer that
    benchmarks/tokenization.py finds here (byte, a trained BPE, GPT-2 when its files are here)."""
    print(f"\n### Tokenization ({megabytes:g} MB of generated .jsonl text)\n", flush=True)
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
    launch = Launch(device, gpus or 2, runs_dir / "torchrun",  # one rank per GPU; two CPU ranks in --smoke
                    ("fsdp",) if args.smoke else ("ddp", "fsdp"))
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
