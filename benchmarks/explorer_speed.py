"""How long the explorer (`headlab.report.widgets.explore`) takes to show each new state.

On the study shipped with headlab (`make demo`'s tables: cpu-small, 3 seeds, both MLA RoPE
settings), as notebook 03 builds it, the script walks through the controls in one run, as a
reader (and tests/report/test_browser.py) does: a method off and on, centered and back, one layer
and back, the OV circuit, MLA's other RoPE setting, every view. For each transition it times what
the reader waits for: the figures of the new state (`draw s`) and their PNG, the image the
notebook shows (`PNG s`). A state drawn before comes back from the explorer's cache ("kept").
Target: a new state in under 1 s on a quiet machine (the "others CPU %" line says how quiet it was).

    python benchmarks/explorer_speed.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("MPLBACKEND", "Agg")

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

from headlab.report.widgets import Explorer, explore
from headlab.study.table_files import SHIPPED, read_study_tables

TARGET_S = 1.0


def shipped_explorer() -> Explorer:
    """The explorer of notebook 03 on the shipped study (one seed's similarity matrices)."""
    tables = read_study_tables(SHIPPED)
    similarity = tables["similarity"].query("seed == 0").drop(columns="seed")
    return explore({**tables.tables, "similarity": similarity}, training=tables["training"])


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


def run(quick: bool = False) -> common.Report:
    monitor = common.CpuMonitor()
    started = time.perf_counter()
    explorer = shipped_explorer()
    drawn = time.perf_counter()
    explorer.figure_bundle()
    rows = [["creation (spectra, uncentered)", "new", drawn - started, time.perf_counter() - drawn]]
    for name, control, value in transitions(explorer):
        kept = set(explorer.drawn)
        before = time.perf_counter()
        control.value = value  # outside an event loop the explorer redraws at once
        between = time.perf_counter()
        explorer.figure_bundle()
        shown = time.perf_counter()
        rows.append([name, "kept" if explorer.shown in kept else "new", between - before, shown - between])
    misses = [f"explorer: {name} took {draw + png:.2f} s > {TARGET_S} s"
              for name, kind, draw, png in rows if kind == "new" and draw + png > TARGET_S]
    text = common.machine_header("Explorer: seconds to show each state (shipped study, notebook 03's explorer)",
                                 monitor=monitor, quick=quick)
    text += "\n" + common.format_table(
        ["transition", "state", "draw s", "PNG s", "total s", f"new < {TARGET_S:g} s"],
        [[name, kind, draw, png, draw + png, common.verdict(draw + png < TARGET_S) if kind == "new" else ""]
         for name, kind, draw, png in rows])
    return common.Report("explorer_speed", text, not misses, misses)


def main(argv=None) -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.setup(args)
    report = run(args.quick)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
