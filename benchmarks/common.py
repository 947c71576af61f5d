"""Shared helpers for the benchmark scripts: timing, interleaved measurement, tables, headers.

Timing is wall-clock `time.perf_counter`. Every measurement warms up first and reports a
median, never a mean, so one slow outlier (a page fault, another process) does not move it.
Comparisons between methods are *interleaved*: each round times every method once, in a
rotating order, so drift in machine load hits all methods alike; ratios are then taken per
round (paired with the reference measured in the same round) and the median ratio reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

# Make `import headlab` work when a script is run as `python benchmarks/x.py` from anywhere
# (the package is normally installed editable into .venv; this is only a fallback).
_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch


# ---- command line -------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark accepts."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fast smoke mode: few rounds, small repeats")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads(N); default: leave torch's machine default")
    p.add_argument("--rounds", type=int, default=None, help="override the number of interleaved rounds")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of timing rounds after which a benchmark stops early (never before 3 rounds)")
    p.add_argument("--seed", type=int, default=0)
    return p


def setup(args: argparse.Namespace) -> None:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


# ---- timing -------------------------------------------------------------------------------
def time_once(fn: Callable[[], object]) -> float:
    """Seconds one call of fn takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_fn(fn: Callable[[], object], warmup: int = 2, repeats: int = 10) -> list[float]:
    """Run fn `warmup` times untimed, then `repeats` times timed; the seconds of each run."""
    for _ in range(warmup):
        fn()
    return [time_once(fn) for _ in range(repeats)]


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def interleaved(fns: dict, rounds: int, warmup: int = 1, inner: int = 1,
                reduce: Callable[[Sequence[float]], float] = median,
                budget_s: float | None = None, min_rounds: int = 3) -> dict:
    """Round-robin timing: every round runs each fn `inner` times back to back and records
    `reduce` of those times (seconds). The order rotates each round so no method always runs
    first (or right after the same neighbour). Each fn is warmed up `warmup` times, also
    round-robin, before any timing. With `budget_s`, rounds stop early once that many seconds
    have passed (but never before `min_rounds`), so a busy machine cannot make a run drag on.
    Returns name -> one value per completed round."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict = {name: [] for name in names}
    t0 = time.perf_counter()
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(reduce([time_once(fns[name]) for _ in range(inner)]))
        if budget_s is not None and r + 1 >= min_rounds and time.perf_counter() - t0 > budget_s:
            break
    return times


def paired_ratio(times: dict[str, list[float]], name: str, reference: str) -> float:
    """Median over rounds of times[name][i] / times[reference][i] (same-round pairs)."""
    return median([a / b for a, b in zip(times[name], times[reference])])


def spread(xs: Sequence[float]) -> float:
    """Interquartile range relative to the median: a quick noise indicator."""
    if len(xs) < 4:
        return float("nan")
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / median(xs)


# ---- machine load -------------------------------------------------------------------------
class CpuMonitor:
    """How much CPU *other* processes took while a benchmark ran (Linux /proc only).

    busy ticks of the whole machine (from /proc/stat) minus this process's own ticks (from
    /proc/self/stat), as a share of elapsed time x cores. Near 0 % means the numbers are
    clean; tens of percent mean another job competed for the cores (absolute times inflate,
    and with OpenMP threads a stolen core stalls every parallel op, so ratios get noisier)."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                cpu = [int(v) for v in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                own = f.read().rsplit(")", 1)[1].split()
            idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)
            busy = sum(cpu[:8]) - idle  # user..steal; guest time is already inside user
            return time.perf_counter(), busy, int(own[11]) + int(own[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            return None

    def others_share(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        wall = end[0] - self.start[0]
        others = (end[1] - self.start[1]) - (end[2] - self.start[2])
        return max(0.0, others / hz / (wall * (os.cpu_count() or 1))) if wall > 0 else None


# ---- reporting ----------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def machine_header(title: str, extra: dict[str, object] | None = None,
                   monitor: CpuMonitor | None = None, quick: bool = False) -> str:
    """A few lines naming the benchmark and the conditions it ran under. With a CpuMonitor
    started before the measurements, also the CPU share other processes took meanwhile."""
    try:
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    lines = [
        f"## {title}",
        "",
        f"torch {torch.__version__} | torch.get_num_threads()={torch.get_num_threads()} "
        f"| os.cpu_count()={os.cpu_count()} | load avg 1/5/15 min {load} "
        f"| python {platform.python_version()} | {platform.machine()}",
    ]
    share = monitor.others_share() if monitor is not None else None
    if share is not None:
        lines.append(f"other processes used {100 * share:.0f}% of the machine's CPU during this benchmark")
        if share > 0.10:
            lines.append("WARNING: the machine was shared while measuring; absolute times are inflated and "
                         "ratios noisier (interleaving spreads the noise over all rows alike). Rerun when idle.")
    if quick:
        lines.append("QUICK MODE: a smoke test of the script; too few rounds for the PASS/MISS verdicts to be "
                     "reliable.")
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], markdown: bool = True) -> str:
    """Rows as an aligned text table; with markdown=True it is also a valid markdown table.
    Numbers are right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row):
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return ("| " + " | ".join(parts) + " |") if markdown else "  ".join(parts)

    out = [line(cells[0])]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2))
                                  for w, num in zip(widths, numeric)) + "|")
    else:
        out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fmt(x) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x != x:
            return "n/a"
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


class Report:
    """What a benchmark hands back: its printed text and whether every row met its target."""

    def __init__(self, name: str, text: str, passed: bool, misses: list[str]):
        self.name, self.text, self.passed, self.misses = name, text, passed, misses

    def __str__(self) -> str:
        return self.text
