"""The report's forward-pass measurements at the paper's context: paper-128m's shape (6 heads of
128, d_model 768), one layer, T = 2048, 8 validation windows as the report uses.

  * the behaviour view's Jensen–Shannon distance matrix of one layer's attention maps:
    `analysis.js_distance_matrix` (torch, where the maps live) against scipy's `jensenshannon`
    on the same maps, interleaved in one process; the median same-round ratio scipy / headlab
    and the largest difference between the two matrices;
  * per layer, the time of `attention_similarity`, `norm_scale_effect` and `input_moments`
    (32 windows, as the report's Σ), on a randomly initialised model (the cost does not depend
    on the weights). A 12-layer model costs 12 × these; the report measures every run for the
    behaviour view and Σ, and each QK-normed variant's seed 0 for 1/rms.

On a GPU every array of these stays on the device; here they run on the CPU.

    python science/report_measures_at_scale.py [--quick]   # --quick: T = 512
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for benchmarks.common
import numpy as np
import torch
from scipy.spatial.distance import jensenshannon

from benchmarks import common
from headlab import preset
from headlab.analysis.attention_maps import (
    attention_pattern,
    attention_similarity,
    js_distance_matrix,
    recorded_attention,
)
from headlab.analysis.inputs import input_moments
from headlab.analysis.qk_norm import norm_scale_effect
from headlab.model.gpt import GPT


def scipy_js_distance_matrix(probs: torch.Tensor) -> np.ndarray:
    """The reference: scipy's `jensenshannon` per head against all heads, as headlab computed it
    before (means over batch and query positions 1…T−1)."""
    p = probs[:, :, 1:].double().numpy()
    distance = np.zeros((p.shape[1], p.shape[1]))
    for i in range(p.shape[1]):
        distance[i] = jensenshannon(p[:, i:i + 1], p, base=2, axis=-1).mean(axis=(0, 2))
    return (distance + distance.T) / 2


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    common.setup(args)
    monitor = common.CpuMonitor()
    context = 512 if args.quick else 2048
    config = preset("paper-128m", "mha").replace(n_layer=1, seq_len=context, vocab_size=1024)
    model = GPT(config).eval()
    windows = torch.randint(0, config.vocab_size, (8, context))
    with torch.no_grad(), recorded_attention() as calls:
        model(windows)
    probs = attention_pattern(*calls[0])
    rounds = args.rounds or (2 if args.quick else 3)
    times = common.interleaved({"headlab": lambda: js_distance_matrix(probs),
                                "scipy": lambda: scipy_js_distance_matrix(probs)}, rounds, warmup=0)
    gap = float(np.abs(js_distance_matrix(probs) - scipy_js_distance_matrix(probs)).max())
    per_layer = [[name, f"{common.time_once(fn):.1f}"] for name, fn in (
        ("attention_similarity (8 windows)", lambda: attention_similarity(model, windows)),
        ("norm_scale_effect (8 windows)", lambda: norm_scale_effect(model, windows)),
        ("input_moments (32 windows)", lambda: input_moments(model, torch.randint(0, config.vocab_size,
                                                                                  (32, context)))))]
    print(common.machine_header(f"The report's measurements at T = {context} (paper-128m shape, one layer)",
                                {"rounds": rounds}, monitor, args.quick))
    print()
    print(common.format_table(["JS distance matrix", "median s", "scipy / headlab (same round)", "max |difference|"],
                              [["headlab (torch)", f"{common.median(times['headlab']):.2f}",
                                f"{common.paired_ratio(times, 'scipy', 'headlab'):.1f}", f"{gap:.1e}"],
                               ["scipy", f"{common.median(times['scipy']):.2f}", "1.0", ""]]))
    print()
    print(common.format_table(["per layer", "s"], per_layer))


if __name__ == "__main__":
    main()
