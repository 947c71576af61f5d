#!/usr/bin/env bash
# The GPU check (see tools/gpu_check.py) on what this node has: torchrun with NCCL (DDP, and
# FSDP on >= 2 GPUs), checkpoint and exact resume, paper-128m's six variants in bf16 with
# torch.compile (SDPA backends, peak memory against the plan, recompiles, tokens/s and MFU,
# decoding, head analysis) and tokenization throughput (SKIP without the corpora extra); one
# summary table, exit status 1 on any FAIL (a missed performance target is a WARN; without a GPU
# every GPU row is a SKIP and the status 0). About 8-10 minutes on an H100/H200 (estimated: the
# six variants took 6-8).
#   tools/gpu_check.sh [--steps N] [--batch-size B] [--optimizer adamw] [--json results.json]
#   tools/gpu_check.sh --smoke      # CPU, tiny preset, under a minute
# The Python: $PYTHON if set, else the first of python3, python, .venv/bin/python whose torch sees
# a CUDA device (the Makefile's .venv pins a CPU torch), else .venv/bin/python or python3 (and
# without --smoke every GPU row of the table then SKIPs, saying there is no CUDA device). A torch
# older than pyproject.toml's bound, or a module the check uses missing, are refused in one line with
# exit status 2 before anything runs.
set -euo pipefail
cd "$(dirname "$0")/.."

sees_cuda() {
  "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

if [ -z "${PYTHON:-}" ]; then
  for candidate in python3 python .venv/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 && sees_cuda "$candidate"; then
      PYTHON=$candidate
      break
    fi
  done
fi
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
# The oldest torch headlab supports is pyproject.toml's `torch>=X.Y` (the oldest `make test-torch` ran
# green; torch.optim.Muon needs 2.9), read from there so the two cannot disagree.
TORCH_MIN=$(sed -n 's/^ *"torch>=\([0-9][0-9.]*\)".*/\1/p' pyproject.toml)
[ -n "$TORCH_MIN" ] || { echo "gpu_check.sh: no \"torch>=X.Y\" line in pyproject.toml" >&2; exit 2; }
# One Python process (each start imports torch: seconds) says which Python and torch run the check,
# and refuses, in one line with exit status 2 before any stage runs, a torch older than that bound
# or a Python that lacks modules the check uses (tools/node_checks.py's NEEDS, every one named: not
# ipywidgets, JupyterLab, matplotlib or seaborn, which the GPU image may lack and nothing here imports).
status=0
"$PYTHON" tools/node_checks.py "$TORCH_MIN" || status=$?
case $status in
  0) ;;
  2) exit 2 ;;  # refused, saying why
  *) echo "gpu_check.sh: $PYTHON cannot import torch (above: why); set PYTHON to a Python with headlab's" \
          "dependencies" >&2
     exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" tools/gpu_check.py "$@"
