"""Minor page faults per `cpu-small` training step, with glibc's default malloc settings and
after `headlab.training.trainer.keep_freed_cpu_memory()` (target: > 1000 by default, at most 5 kept).

    python benchmarks/page_faults.py

Machine-dependent (glibc's adaptive mmap threshold, the kernel), so a benchmark, not a test.
Each measurement runs in a fresh interpreter, as the allocator settings are process-wide.
"""

from __future__ import annotations

import subprocess
import sys

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

DEFAULT_AT_LEAST, KEPT_AT_MOST = 1000, 5
SCRIPT = """
import resource, torch
from headlab import preset
from headlab.model.gpt import GPT
from headlab.training.trainer import keep_freed_cpu_memory
torch.set_num_threads(1)
model = GPT(preset("cpu-small", seq_len=128))  # the step size this allocator behaviour was measured at
idx = torch.randint(0, 256, (16, 128))
def faults_per_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        model(idx, idx)[1].backward()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
faults_per_step()
default = sum(faults_per_step() for _ in range(3)) / 3  # some steps fault little, most thousands of times
assert keep_freed_cpu_memory()
# The heap takes a few steps to grow to the step's high-water mark; after that, no faults.
print(default, min(faults_per_step() for _ in range(5)))
"""


def run(**_ignored) -> common.Report:
    if not sys.platform.startswith("linux"):
        return common.Report("page_faults", "page faults: glibc's malloc is Linux-only; skipped", True, [])
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         cwd=common._ROOT).stdout
    default, kept = map(float, out.split())
    ok = default > DEFAULT_AT_LEAST and kept <= KEPT_AT_MOST
    rows = [["default malloc", f"{default:,.0f}", f"> {DEFAULT_AT_LEAST}"],
            ["keep_freed_cpu_memory()", f"{kept:,.1f}", f"<= {KEPT_AT_MOST}"]]
    text = "\n".join([common.machine_header("Minor page faults per cpu-small training step"), "",
                      common.format_table(["allocator", "faults per step", "target"], rows),
                      f"result: {common.verdict(ok)}"])
    return common.Report("page_faults", text, ok,
                         [] if ok else [f"page_faults: {default:.0f} default, {kept:.1f} kept"])


if __name__ == "__main__":
    report = run()
    print(report)
    sys.exit(0 if report.passed else 1)
