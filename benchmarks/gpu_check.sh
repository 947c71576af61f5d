#!/usr/bin/env bash
# The prepared GPU check (see benchmarks/gpu_check.py): paper-128m's six variants in bf16 with
# torch.compile on one GPU, tokens/s and MFU against the measured bf16 peak, decoding at context
# 2048, cache bytes against the formula, and the head analysis. About 6-8 minutes on an H100/H200.
#   benchmarks/gpu_check.sh [--steps N] [--batch-size B] [--optimizer adamw] [--json results.json]
#   benchmarks/gpu_check.sh --smoke      # CPU, tiny preset, seconds
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
