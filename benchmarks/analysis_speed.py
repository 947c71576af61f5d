"""Head-similarity analysis speed and memory: `analyze()` of the QK circuit, every layer.

  * paper-128m (12 layers, 6 heads, d_model 768): a randomly initialised headlab GPT of each
    family; the time of `analyze(model)` (reading the weights out of the model included).
    Target < 2 s.
  * paper-2.5b shape (36 layers, 18 heads, d_model 2304, d_h 128): a full GPT would be ~10 GB,
    so the state dict is virtual: each attention tensor is drawn (N(0, 0.02²), float32) when the
    analysis asks for it and dropped after its layer, as if reading a checkpoint layer by layer.
    Drawing takes ~0.06 s per 2304² tensor; it is timed apart and subtracted (a real checkpoint
    would cost disk reads instead). Target < 30 s and peak memory < 4 GB.
  * paper-128m with the data-aware measure (`measure="data"`): Σ is estimated once from the
    model's forward pass on 1024 random tokens (timed apart, as "Σ estimation s"), then
    `analyze(measure="data")` and the plain `analyze()` are timed interleaved, 3 rounds; the
    median time of the data measure (target < 5 s) and the median same-round ratio data/frobenius,
    which stays meaningful on a busy machine.

Every case runs in a fresh subprocess, so "peak MB" is that process's maximum resident set size
(interpreter, torch and numpy included), not memory left over from an earlier case; "others
CPU %" is the share of the machine that other processes took meanwhile (on a shared machine
OpenBLAS threads that lose their core stall each other, so times inflate far more than that share).

    python benchmarks/analysis_speed.py [--quick]      # --quick: MHA only at 2.5B
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch

from headlab.analysis.heads import from_state_dict
from headlab.analysis.inputs import input_moments
from headlab.analysis.similarity import analyze
from headlab.model.attention import build_attention
from headlab.model.config import preset
from headlab.model.gpt import GPT
from headlab.schema import FAMILIES

TARGET_S = {"paper-128m": 2.0, "paper-2.5b": 30.0}
TARGET_PEAK_MB = 4096
DATA_TARGET_S = 5.0
DATA_TOKENS = 1024  # more than d_model = 768, so each layer's Σ has full rank


class RandomAttentionWeights(Mapping):
    """The attention tensors of a GPT state dict for `config`, drawn on access (seeded by name),
    so no more than one layer's weights ever exist at once."""

    def __init__(self, config, seed: int = 0):
        with torch.device("meta"):
            attn = build_attention(config)
        self.shapes = {f"blocks.{i}.attn.{name}": p.shape
                       for i in range(config.n_layer) for name, p in attn.named_parameters()}
        self.seed = seed
        self.generation_s = 0.0

    def __getitem__(self, name: str) -> torch.Tensor:
        t0 = time.perf_counter()
        generator = torch.Generator().manual_seed(self.seed + zlib.crc32(name.encode()))
        shape = self.shapes[name]
        # norm gains (1-D) stay near 1, as a trained model's would
        tensor = 1 + 0.1 * torch.randn(shape, generator=generator) if len(shape) == 1 else \
            0.02 * torch.randn(shape, generator=generator)
        self.generation_s += time.perf_counter() - t0
        return tensor

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def measure(case: str, attention: str, seed: int = 0) -> dict:
    """Time the analysis in this process (after a warm-up on the tiny preset, which pays for lazy
    imports and thread start-up): the median of 3 runs at 128M, one run at 2.5B. Returns
    seconds, weight-drawing seconds, the CPU share other processes took, and peak MB."""
    torch.manual_seed(seed)
    analyze(GPT(preset("tiny", attention)))
    config = preset(case, attention)
    big = case == "paper-2.5b"
    model = None if big else GPT(config)
    monitor = common.CpuMonitor()  # in this worker, so its own CPU is not counted as "others"
    times, drawing = [], 0.0
    for _ in range(1 if big else 3):
        weights = RandomAttentionWeights(config, seed) if big else None
        source = from_state_dict(config, weights) if big else model
        t0 = time.perf_counter()
        result = analyze(source, circuit="qk")
        drawing = weights.generation_s if weights else 0.0
        times.append(time.perf_counter() - t0 - drawing)
        assert len(result.summary) == 2 * config.n_layer
    share = monitor.others_share()
    return {"seconds": common.median(times), "generation_s": drawing,
            "others_pct": float("nan") if share is None else 100 * share,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "layers": config.n_layer, "heads": config.n_head, "d_model": config.d_model}


def measure_data_aware(attention: str, seed: int = 0) -> dict:
    """paper-128m, all layers, QK: seconds of Σ estimation, median seconds of the data-aware
    analysis, its median same-round ratio to the Frobenius one, and the others' CPU share."""
    torch.manual_seed(seed)
    tiny = GPT(preset("tiny", attention))  # warm-up: lazy imports, thread start-up
    analyze(tiny, measure="data", inputs=input_moments(tiny, torch.randint(0, 256, (1, 32))))
    model = GPT(preset("paper-128m", attention))
    tokens = torch.randint(0, model.config.vocab_size, (1, DATA_TOKENS), generator=torch.Generator().manual_seed(seed))
    t0 = time.perf_counter()
    moments = input_moments(model, tokens)
    estimation = time.perf_counter() - t0
    monitor = common.CpuMonitor()
    times = common.interleaved({"data": lambda: analyze(model, measure="data", inputs=moments),
                                "frobenius": lambda: analyze(model)}, rounds=3, warmup=0)
    share = monitor.others_share()
    return {"seconds": common.median(times["data"]), "frobenius_s": common.median(times["frobenius"]),
            "ratio": common.paired_ratio(times, "data", "frobenius"), "estimation_s": estimation,
            "others_pct": float("nan") if share is None else 100 * share}


def _measure_in_subprocess(case: str, attention: str, seed: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", case, attention, str(seed)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False, seed: int = 0, **_ignored) -> common.Report:
    cases = [("paper-128m", a) for a in FAMILIES]
    cases += [("paper-2.5b", a) for a in (("mha",) if quick else FAMILIES)]
    rows, misses = [], []
    for case, attention in cases:
        m = _measure_in_subprocess(case, attention, seed)
        ok = m["seconds"] < TARGET_S[case] and (case != "paper-2.5b" or m["peak_mb"] < TARGET_PEAK_MB)
        target = f"< {TARGET_S[case]:.0f} s" + (f", < {TARGET_PEAK_MB} MB" if case == "paper-2.5b" else "")
        rows.append([case, attention, f"{m['layers']}x{m['heads']}", m["d_model"], m["seconds"],
                     m["generation_s"], round(m["peak_mb"]), m["others_pct"], target, common.verdict(ok)])
        if not ok:
            misses.append(f"analysis_speed {case} {attention}: {m['seconds']:.1f} s, {m['peak_mb']:.0f} MB ({target})")
    data_rows = []
    for attention in ("mha",) if quick else FAMILIES:
        m = _measure_in_subprocess("data", attention, seed)
        ok = m["seconds"] < DATA_TARGET_S
        data_rows.append([attention, m["seconds"], m["frobenius_s"], m["ratio"], m["estimation_s"], m["others_pct"],
                          f"< {DATA_TARGET_S:.0f} s", common.verdict(ok)])
        if not ok:
            misses.append(f"analysis_speed paper-128m {attention} measure=data: {m['seconds']:.1f} s "
                          f"(< {DATA_TARGET_S:.0f} s)")
    header = common.machine_header("Head-similarity analysis (QK circuit, all layers)")
    if max([row[7] for row in rows] + [row[5] for row in data_rows]) > 10:
        header += ("\nWARNING: other processes took CPU while measuring (column 'others CPU %'); the "
                   "absolute times are inflated. Rerun when the machine is idle.")
    text = "\n".join([
        header,
        "",
        common.format_table(["model", "family", "layers x heads", "d_model", "analysis s", "+ drawing weights s",
                             "peak MB", "others CPU %", "target", "result"], rows),
        "",
        f"paper-128m, data-aware measure (Σ from {DATA_TOKENS} tokens; its estimation is not in 'analysis s'):",
        "",
        common.format_table(["family", "analysis s", "frobenius s", "ratio data/frobenius", "Σ estimation s",
                             "others CPU %", "target", "result"], data_rows),
    ])
    return common.Report("analysis_speed", text, not misses, misses)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        case, attention, seed = argv[1], argv[2], int(argv[3])
        print(json.dumps(measure_data_aware(attention, seed) if case == "data" else measure(case, attention, seed)))
        return 0
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    report = run(quick=args.quick, seed=args.seed)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
