"""Hostile inputs and faults against headlab's CLI and API, each outcome classified.

    PYTHONPATH=. python tools/hostile_inputs.py [--out /tmp/hostile] [--round issue39 ...]

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
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the hostile package beside this file
import torch  # noqa: E402
from hostile.harness import FAILURES, HANG_S, cli, counts_line, snapshot  # noqa: E402, F401  (disk_attack's)

ROUNDS = sorted(path.stem.removeprefix("round_") for path in (Path(__file__).parent / "hostile").glob("round_*.py"))


def run_rounds(names: list[str], root: Path) -> list[tuple[str, str, str]]:
    results = []
    for name in names:
        print(f"---- round {name}", flush=True)
        results += importlib.import_module(f"hostile.round_{name}").run(root)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="scratch folder (default: a temporary one, deleted after)")
    parser.add_argument("--round", action="append", choices=ROUNDS, help="run only these rounds (default: all)")
    parser.add_argument("--issue39", action="store_true", help="only issue 39's classes 2 and 4 (--round issue39)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HEADLAB_CACHE"] = str(Path(scratch) / "cache")
        root = args.out or Path(scratch) / "cases"
        root.mkdir(parents=True, exist_ok=True)
        results = run_rounds(["issue39"] if args.issue39 else args.round or ROUNDS, root)
    counts = Counter(kind for _, kind, _ in results)
    print(f"\n{counts_line(results)}")
    print(", ".join(f"{kind} {counts[kind]}" for kind in FAILURES))
    sys.exit(1 if sum(counts[kind] for kind in FAILURES) else 0)
