"""Hostile inputs and faults against headlab's CLI and API, each outcome classified.

    PYTHONPATH=. python tools/hostile_inputs.py [--out /tmp/hostile] [--round issue39 ...] [--page FILE]

Every round is a module tools/hostile/round_<name>.py (`NAME`, `run(root)`), found here and run
in the order of their names in one scratch folder (a later round may reuse what an earlier one
left there: the finished tiny run); `--round` picks some. The harness they share, and the outcome
classes, are tools/hostile/harness.py's. The faults (links, swaps, truncations, manifest edits,
a full disk, kill -9) are tests/faults.py's, the same the tree-diff test
(tests/disk/test_treediff.py) inflicts.

Every case is a bad input (which must be refused with one clear line, exit status 2 on the
CLI), a valid one (which must do what it says), or a fault (kill -9, full disk, a second writer)
after which the run must resume to the uninterrupted result.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the hostile package beside this file
import torch  # noqa: E402
from hostile.harness import FAILURES, HANG_S, OUTCOMES, cli, counts_line, snapshot  # noqa: E402, F401  (disk_attack's)

ROUNDS = sorted(path.stem.removeprefix("round_") for path in (Path(__file__).parent / "hostile").glob("round_*.py"))


def run_rounds(names: list[str], root: Path) -> list[tuple[str, str, str]]:
    results = []
    for name in names:
        print(f"---- round {name}", flush=True)
        results += importlib.import_module(f"hostile.round_{name}").run(root)
    return results


WORDS = {"silent": "silent wrong", "lost": "data lost"}  # the outcomes' names on a page


def write_page(path: Path, results: list[tuple[str, str, str]], command: str, seconds: float) -> None:
    """The counts page of a run: outcomes by class (a case named '[class] ...'), then every input
    with its outcome and what headlab said, the command that reproduces it and its wall time."""
    rows = [(m.group(1) if (m := re.match(r"\[([^]]+)\] ", name)) else "-", name, kind, detail)
            for name, kind, detail in results]
    classes = sorted({cls for cls, *_ in rows})
    by_class = Counter((cls, kind) for cls, _, kind, _ in rows)
    header = "| class | inputs | " + " | ".join(WORDS.get(k, k) for k in OUTCOMES) + " |"
    lines = [f"# Hostile inputs: {len(rows)} inputs", "", f"Reproduce: `{command}` ({seconds / 60:.0f} min wall "
             "time on the machine it ran on).", "", header, "|" + "---|" * (len(OUTCOMES) + 2)]
    for cls in [*classes, "all"]:
        counts = [sum(by_class[(c, k)] for c in classes if cls in ("all", c)) for k in OUTCOMES]
        lines.append(f"| {cls} | {sum(counts)} | " + " | ".join(map(str, counts)) + " |")
    lines += ["", "| class | input | outcome | what headlab said or did |", "|---|---|---|---|"]
    lines += [f"| {cls} | {name.split('] ', 1)[-1].replace('|', '/')} | {WORDS.get(kind, kind)} | "
              f"{detail.replace('|', '/')[:160]} |" for cls, name, kind, detail in rows]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="scratch folder (default: a temporary one, deleted after)")
    parser.add_argument("--round", action="append", choices=ROUNDS, help="run only these rounds (default: all)")
    parser.add_argument("--issue39", action="store_true", help="only issue 39's classes 2 and 4 (--round issue39)")
    parser.add_argument("--page", type=Path, help="write the counts page (markdown) of this run to this file")
    args = parser.parse_args()
    started = time.monotonic()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HEADLAB_CACHE"] = str(Path(scratch) / "cache")
        root = args.out or Path(scratch) / "cases"
        root.mkdir(parents=True, exist_ok=True)
        results = run_rounds(["issue39"] if args.issue39 else args.round or ROUNDS, root)
    counts = Counter(kind for _, kind, _ in results)
    print(f"\n{counts_line(results)}")
    print(", ".join(f"{kind} {counts[kind]}" for kind in FAILURES))
    if args.page:
        argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
        command = f"PYTHONPATH=. python tools/hostile_inputs.py {argv}"
        write_page(args.page, results, command, time.monotonic() - started)
    sys.exit(1 if sum(counts[kind] for kind in FAILURES) else 0)
