"""How long the explorer (`headlab.report.widgets.explore`) takes to show each new state.

On the study shipped with headlab (`make demo`'s tables: cpu-small, 3 seeds, both MLA RoPE
settings), as notebook 03 builds it, the script walks through the controls in one run, as a
reader (and tests/report/test_browser.py) does: a method off and on, centered and back, one layer
and back, the OV circuit, MLA's other RoPE setting, every view. For each transition it times what
the reader waits for: the figures of the new state (`draw s`) and their PNG, the image the
notebook shows (`PNG s`). A state drawn before comes back from the explorer's cache ("kept").
Target: a new state in under 1 s on a quiet machine. The verdict reads the CPU seconds the process
spent, which a shared machine (the "other processes" line) inflates much less than wall seconds,
at their best over `WALKS` walks, each with a new explorer (so every state is new again): other
processes' bursts only ever add to a row. Importing the figures' modules (seaborn, scipy), once
per kernel, is timed on its own line, before the first walk; the first walk's creation also
pays matplotlib's first use of its fonts, once per kernel too (its own column).

    python benchmarks/explorer_speed.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("MPLBACKEND", "Agg")

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

from headlab.report import plots
from headlab.report.widgets import Explorer, explore
from headlab.study.table_files import SHIPPED, read_study_tables

TARGET_S = 1.0
WALKS = 3


def shipped_tables() -> dict:
    """The tables notebook 03 explores: the shipped study's, with one seed's similarity matrices."""
    tables = read_study_tables(SHIPPED)
    return {**tables.tables, "similarity": tables["similarity"].query("seed == 0").drop(columns="seed")}


def transitions(explorer: Explorer) -> list[tuple[str, object, object]]:
    """(name, control, value) in the order set: each a new state, or one drawn before."""
    one_method = next(iter(explorer.methods))
    layers = explorer.layers.options
    circuit, rope = explorer.choices["circuit"], explorer.choices.get("mla_rope")
    walk = [(f"{one_method} off", explorer.methods[one_method], False),
            (f"{one_method} on", explorer.methods[one_method], True),
            ("spectrum centered", explorer.kind, "centered"), ("spectrum uncentered", explorer.kind, "uncentered"),
            (f"layers {layers[1][0]}", explorer.layers, layers[1][1]),
            (f"layers {layers[0][0]}", explorer.layers, layers[0][1]),
            ("circuit ov", circuit, "ov"), ("circuit qk", circuit, "qk")]
    if rope is not None:
        walk += [(f"MLA RoPE {rope.options[1]}", rope, rope.options[1]),
                 (f"MLA RoPE {rope.options[0]}", rope, rope.options[0])]
    walk += [(f"view {view}", explorer.view, view) for view in explorer.view.options[1:] + explorer.view.options[:1]]
    return walk


def timed(action) -> tuple[float, float]:
    """Wall and CPU seconds (this process) of `action()`: on a shared machine the CPU seconds
    are what the wall time would be on a quiet one (the explorer draws on one thread)."""
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


def walk(tables: dict) -> list[list]:
    """One walk with a new explorer: per transition, [name, state, draw wall, draw CPU, PNG wall, PNG CPU]."""
    made = []
    draw = timed(lambda: made.append(explore(tables, training=tables["training"])))
    explorer = made[0]
    rows = [["creation (spectra, uncentered)", "new", *draw, *timed(explorer.figure_bundle)]]
    for name, control, value in transitions(explorer):
        kept = set(explorer.drawn)
        draw = timed(lambda: setattr(control, "value", value))  # outside an event loop the explorer redraws at once
        png = timed(explorer.figure_bundle)
        rows.append([name, "kept" if explorer.shown in kept else "new", *draw, *png])
    return rows


def run(quick: bool = False) -> common.Report:
    monitor = common.CpuMonitor()
    tables = shipped_tables()
    imports = timed(lambda: [getattr(plots, name) for name in plots.__all__])
    walks = [walk(tables) for _ in range(1 if quick else WALKS)]
    rows = []
    for name, kind, *_ in walks[0]:
        times = [next(row[2:] for row in one if row[0] == name) for one in walks]
        cpu = [draw_cpu + png_cpu for _, draw_cpu, _, png_cpu in times]
        rows.append([name, kind, statistics.median(t[0] for t in times), statistics.median(t[2] for t in times),
                     statistics.median(t[0] + t[2] for t in times), cpu[0], min(cpu)])
    misses = [f"explorer: {name} took {best:.2f} CPU s > {TARGET_S} s"
              for name, kind, *_, best in rows if kind == "new" and best > TARGET_S]
    text = common.machine_header("Explorer: seconds to show each state (shipped study, notebook 03's explorer)",
                                 monitor=monitor, quick=quick)
    text += (f"\nimporting the figures' modules (once per kernel, before the first walk): {imports[0]:.2f} s, "
             f"{imports[1]:.2f} CPU s\n")
    text += "\n" + common.format_table(
        ["transition", "state", "draw s", "PNG s", "total s", "CPU s, walk 1", f"CPU s, best of {len(walks)}",
         f"new < {TARGET_S:g} CPU s"],
        [[*row, common.verdict(row[-1] < TARGET_S) if row[1] == "new" else ""] for row in rows])
    text += ("\n\n'draw s' makes the figures, 'PNG s' renders them into the image the notebook shows, 'total s' "
             f"both (wall seconds, median of {len(walks)} walks); the CPU columns are this process's CPU time for "
             "both, what a quiet machine would take: in the first walk (whose creation also loads matplotlib's "
             "fonts) and at its best.")
    return common.Report("explorer_speed", text, not misses, misses)


def main(argv=None) -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.setup(args)
    report = run(args.quick)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
