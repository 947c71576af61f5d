"""What the node checks (tools/gpu_check.py, tools/gpu_window.py) share: their rows and summary,
the modules they need, child processes under a time limit, and what torch.compile and CUDA memory
did while a block ran.

    python tools/node_checks.py [X.Y]   # this Python and its torch in one line; exit status 2, in one
                                        # line, if its torch is older than X.Y or it lacks modules the checks need

The checks need `NEEDS` only: the GPU image has neither ipywidgets nor JupyterLab (nor, perhaps,
matplotlib and seaborn), which headlab's notebooks and figures need and no check runs.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch  # should this fail, gpu_check.sh says that its Python cannot import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository root, for benchmarks.common

from benchmarks import common  # noqa: E402  (the standard library only)

PASS, FAIL, SKIP, WARN = "PASS", "FAIL", "SKIP", "WARN"
# The modules the checks import, directly or through headlab (tests/cli/test_gpu_window.py runs them
# with every other base dependency of headlab made unimportable).
NEEDS = ("torch", "numpy", "scipy", "pandas", "tqdm", "safetensors", "tokenizers")


def missing_modules(names=NEEDS) -> list[str]:
    """The modules of `names` this Python cannot import. Each is imported, not only looked up: a module
    that is found but fails to import (a broken install, a shadowing folder) stops the checks as surely
    as an absent one."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def refusal(torch_min: str | None) -> str | None:
    """Why the checks cannot run on this Python, in one line, or None: its torch is older than
    `torch_min` ("X.Y", pyproject.toml's bound, if given), or it lacks modules of NEEDS."""
    version = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if torch_min and version < tuple(int(part) for part in torch_min.split(".")[:2]):
        return f"{sys.executable} has torch {torch.__version__}; headlab needs torch >= {torch_min} (pyproject.toml)"
    missing = missing_modules()
    if missing:
        return (f"{sys.executable} lacks {', '.join(missing)}, which the GPU checks use: pip install "
                f"{' '.join(missing)} (or pip install -e . in the checkout)")
    return None


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH, one OpenMP thread, and `extra`."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "OMP_NUM_THREADS": "1", **extra}


def run_child(command: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `command` (output captured); past `timeout` seconds its whole process group (torchrun's
    workers too) is killed and its stderr ends saying so."""
    child = subprocess.Popen(command, env=env or child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        stderr += f"\ntimed out after {timeout:.0f} s"
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


def failure(done: subprocess.CompletedProcess) -> str:
    """A failed process in one line: its exit status and the last line it wrote to stderr."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return f"exit {done.returncode}: {lines[-1][:160] if lines else 'no error output'}"


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



# ---- what a block did -------------------------------------------------------------------------

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



if __name__ == "__main__":
    print(f"Python {sys.executable}, torch {torch.__version__} (CUDA build: {torch.version.cuda}), "
          f"{torch.cuda.device_count()} CUDA device(s)", flush=True)
    if why := refusal(sys.argv[1] if len(sys.argv) > 1 else None):
        print(f"{Path(sys.argv[0]).name}: {why}", file=sys.stderr)
        sys.exit(2)
