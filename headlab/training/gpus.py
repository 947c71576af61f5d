"""The GPUs headlab knows by name: their data-sheet peaks and memory (no torch: the compile
rule and the planner read them alike)."""

from __future__ import annotations

import re

# Dense (no sparsity) peaks in TFLOPS, bf16 on tensor cores and fp32 as fp32 training runs
# (TF32 tensor cores from Ampere on: `headlab.training.distributed.use_tf32_matmuls`), and
# memory as marketed, from the vendors' data sheets (USABLE_MEMORY_FRACTION leaves room for what the driver reserves).
# Matched in order as whole words of torch.cuda.get_device_name() (case aside), so the more
# specific names come first and "NVIDIA L40" is not an L4 nor "NVIDIA GH200 480GB" an H200.
# The T4 has neither bf16 tensor cores (its fp16 peak is given) nor TF32 (its CUDA-core fp32).
GPU_PEAKS: tuple[tuple[str, float, float, float], ...] = (
    # name, bf16 TFLOPS, GiB, fp32 (TF32) TFLOPS
    ("B200", 2250.0, 180.0, 1100.0),
    ("H100 PCIe", 756.5, 80.0, 378.0),
    ("H100 NVL", 835.5, 94.0, 417.5),
    ("H200 NVL", 835.5, 141.0, 417.5),
    ("H200", 989.4, 141.0, 494.7),
    ("H100", 989.4, 80.0, 494.7),
    ("A100-SXM4-40GB", 312.0, 40.0, 156.0),
    ("A100-PCIE-40GB", 312.0, 40.0, 156.0),
    ("A100", 312.0, 80.0, 156.0),
    ("L40S", 362.0, 48.0, 183.0),
    ("L4", 121.0, 24.0, 60.0),
    ("T4", 65.0, 16.0, 8.1),
)


def gpu_peak(name: str, dtype: str = "bfloat16") -> tuple[str, float, float] | None:
    """(table key, dense TFLOPS in the training `dtype`, GiB) of the first GPU_PEAKS entry found
    in `name` as whole words: neither a letter nor a digit on either side of it."""
    for key, bf16, gib, fp32 in GPU_PEAKS:
        if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])", name, re.IGNORECASE):
            return key, bf16 if dtype == "bfloat16" else fp32, gib
    return None
