"""Per-token decode latency at context 512: KV cache vs recomputing the whole context.

For each comparison variant of `cpu-small` (with seq_len raised to 512), batch 1, eval mode,
under torch.inference_mode:
  (a) cached:    prefill 511 tokens once into a 512-token cache, then time single-token steps
                 at position 511 (the cache position is reset to 511 before each step, so
                 every timed step attends over exactly 512 keys);
  (b) recompute: one forward over the full 512-token context (what decoding without a cache
                 does for each new token).
MLA appears twice: absorbed (latent cache, the default) and naive (mla_absorb=False, cache of
decompressed keys/values). Timing is interleaved round-robin over all rows and both modes.

Also checked per row: the cached step's logits equal the full forward's last-position logits,
and cache.nbytes() equals kv_cache_values_per_token() * n_layer * 512 * 4 bytes (float32).

Target: recompute / cached >= 5x for every row.

    python benchmarks/decode.py [--quick] [--context 512]
"""

from __future__ import annotations

import time

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

import torch

from headlab.model.gpt import GPT
from headlab.study.roles import comparison_variants

TARGET = 5.0


def run(quick: bool = False, context: int = 512, rounds: int | None = None, inner: int | None = None,
        preset_name: str = "cpu-small", seed: int = 0, budget_s: float | None = None) -> common.Report:
    rounds = rounds or (3 if quick else 9)
    budget_s = budget_s if budget_s is not None else (15.0 if quick else 40.0)
    inner = inner or (3 if quick else 10)
    t_start = time.perf_counter()
    monitor = common.CpuMonitor()
    gen = torch.Generator().manual_seed(seed)
    configs = [cfg.replace(seq_len=max(cfg.seq_len, context)) for cfg in comparison_variants(preset_name)]
    tokens = torch.randint(0, configs[0].vocab_size, (1, context), generator=gen)

    rows_meta, fns = [], {}
    for cfg in configs:
        torch.manual_seed(seed)
        model = GPT(cfg).eval()
        for absorb in ((True, False) if cfg.attention == "mla" else (True,)):
            name = cfg.label + ("" if cfg.attention != "mla" else " absorbed" if absorb else " naive")
            with torch.inference_mode():
                cache = model.new_cache(1, context, mla_absorb=absorb)
                model(tokens[:, :-1], cache=cache)  # prefill 511 tokens, once
                assert cache.pos == context - 1
                step_logits, _ = model(tokens[:, -1:], cache=cache)
                full_logits, _ = model(tokens)
            logit_diff = (step_logits[:, -1] - full_logits[:, -1]).abs().max().item()
            formula = cfg.kv_cache_bytes(context, cache.tensors()[0].element_size(), mla_absorb=absorb)
            rows_meta.append(dict(name=name, cfg=cfg, absorb=absorb, nbytes=cache.nbytes(), formula=formula,
                                  logit_diff=logit_diff))

            def cached_steps(model=model, cache=cache):
                for _ in range(inner):
                    cache.pos = context - 1  # step at position 511: attends over all 512 keys
                    model(tokens[:, -1:], cache=cache)

            def recompute(model=model):
                model(tokens)

            fns[(name, "cached")] = cached_steps
            fns[(name, "full")] = recompute

    # Interleaved over every (row, mode): a "cached" call runs `inner` steps back to back
    # (time / inner = ms per token), a "full" call one 512-token forward.
    with torch.inference_mode():
        times = common.interleaved(fns, rounds=rounds, warmup=1, budget_s=budget_s)
    done = len(next(iter(times.values())))
    for key in fns:
        if key[1] == "cached":
            times[key] = [t / inner for t in times[key]]

    mha_bytes = rows_meta[0]["nbytes"]
    rows, misses = [], []
    for meta in rows_meta:
        name = meta["name"]
        cached_ms = common.median(times[(name, "cached")]) * 1e3
        full_ms = common.median(times[(name, "full")]) * 1e3
        speedup = common.median([f / c for f, c in zip(times[(name, "full")], times[(name, "cached")])])
        bytes_ok = meta["nbytes"] == meta["formula"]
        ok = speedup >= TARGET and bytes_ok
        if speedup < TARGET:
            misses.append(f"decode: {name} speedup {speedup:.1f}x < {TARGET:.0f}x "
                          f"(cached {cached_ms:.2f} ms, recompute {full_ms:.2f} ms)")
        if not bytes_ok:
            misses.append(f"decode: {name} cache.nbytes() {meta['nbytes']} != formula {meta['formula']}")
        rows.append([
            name, cached_ms, full_ms, speedup, meta["nbytes"], meta["formula"], bytes_ok,
            meta["nbytes"] / mha_bytes, f"{meta['logit_diff']:.1e}", f">= {TARGET:.0f}x", common.verdict(ok),
        ])

    header = common.machine_header(
        f"Decode latency at context {context}, batch 1, preset {preset_name!r} with seq_len={configs[0].seq_len}",
        {
            "cached": f"prefill {context - 1} tokens once; time 1-token steps at position {context - 1} "
                      "(cache.pos reset before each step); model.eval(), torch.inference_mode()",
            "recompute": f"one forward over all {context} tokens per generated token",
            "method": f"1 warm-up call each; {done} interleaved rounds (max {rounds}, time budget {budget_s:.0f} s), "
                      f"each = {inner} cached steps back to back + 1 recompute per row; "
                      "ms = median over rounds; speedup = median of same-round ratios",
            "bytes": f"cache.nbytes() of a {context}-token cache vs kv_cache_values_per_token()"
                     f" * n_layer * {context} * 4 (float32); 'x MHA' = cache size relative to MHA",
            "logit diff": "max |cached-step logits - full-forward last-position logits|",
            "target": f"speedup >= {TARGET:.0f}x for every row (and bytes agree)",
        },
        monitor=monitor, quick=quick,
    )
    table = common.format_table(
        ["variant", "cached ms/tok", "recompute ms/tok", "speedup", "cache bytes", "formula bytes",
         "agree", "x MHA", "logit diff", "target", "result"], rows)
    text = f"{header}\n\n{table}\n\n({time.perf_counter() - t_start:.1f} s)"
    return common.Report("decode", text, not misses, misses)


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--preset", default="cpu-small")
    args = p.parse_args(argv)
    common.setup(args)
    report = run(quick=args.quick, context=args.context, rounds=args.rounds, preset_name=args.preset,
                 seed=args.seed, budget_s=args.budget)
    print(report)
    return report


if __name__ == "__main__":
    main()
