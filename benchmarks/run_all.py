"""Run every benchmark (train step, block overhead, decode, page faults, verification cost, ...) and print their tables.

    python benchmarks/run_all.py [--quick] [--threads N]

Exit status 0 when every row meets its target, 1 otherwise (the misses are listed at the end).
"""

from __future__ import annotations

import sys
import time

try:
    from benchmarks import (
        analysis_speed,
        block_overhead,
        common,
        decode,
        page_faults,
        tokenization,
        train_step,
        train_throughput,
        verification_cost,
    )
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import analysis_speed
    import block_overhead
    import common
    import decode
    import page_faults
    import tokenization
    import train_step
    import train_throughput
    import verification_cost


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--adamw", action="store_true", help="train_step: include an AdamW step")
    args = p.parse_args(argv)
    common.setup(args)
    t0 = time.perf_counter()
    reports = []
    kw = dict(quick=args.quick, rounds=args.rounds, seed=args.seed, budget_s=args.budget)
    for fn in (lambda: train_step.run(adamw=args.adamw, **kw), lambda: block_overhead.run(**kw),
               lambda: decode.run(**kw), lambda: train_throughput.run(quick=args.quick, rounds=args.rounds),
               lambda: analysis_speed.run(quick=args.quick, seed=args.seed), page_faults.run,
               lambda: tokenization.run(quick=args.quick), lambda: verification_cost.run(quick=args.quick)):
        report = fn()
        print(report, end="\n\n", flush=True)
        reports.append(report)
    misses = [m for r in reports for m in r.misses]
    print(f"## Summary ({time.perf_counter() - t0:.1f} s total{', quick mode' if args.quick else ''})\n")
    print(common.format_table(["benchmark", "result"],
                              [[r.name, "PASS" if r.passed else f"MISS ({len(r.misses)})"] for r in reports]))
    for m in misses:
        print(f"- MISS {m}")
    return 0 if not misses else 1


if __name__ == "__main__":
    sys.exit(main())
