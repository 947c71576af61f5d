"""The harness every round of hostile inputs shares: run a case through the CLI (`cli`) or the
API (`api`), watch what it must not touch (`untouched`), compare a resumed run (`same_run`), and
classify the outcome. A round is a module `round_<name>.py` beside this one with `NAME` and
`run(root) -> [(case, outcome, detail)]` (tools/hostile_inputs.py finds and runs them).

Outcomes (a round may judge further what `cli` and `api` say from the exit alone):

    OK          a valid input did what it should (checked, not only exit 0)
    recovered   a fault the run survived: resumed to bit-identical weights and metrics
    clear       refused: one line naming the problem (CLI: exit 2, no traceback)
    vague       refused in one line, but the line does not name what is wrong
    traceback   an exception escaped, or the CLI printed a traceback
    silent      a bad input was accepted, or a result is wrong without any error (silent wrong)
    lost        a fault left a run that cannot be resumed or loaded, or headlab changed or
                deleted something it did not write (a foreign folder, a link's target) (data lost)
    security    a read or write outside the place named
    hang        no answer within HANG_S seconds
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path

import torch

from headlab import load_corpus, load_run, preset, train, train_preset
from headlab.cli.main import main
from headlab.runs.metrics import read_metrics

try:
    import faults  # noqa: F401  (the rounds inflict its faults)
except ImportError:  # run as a script: the faults the tree-diff test inflicts live in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import faults  # noqa: F401

OUTCOMES = ("OK", "recovered", "clear", "vague", "traceback", "silent", "lost", "security", "hang")
FAILURES = ("traceback", "silent", "lost", "security", "hang")  # what a round must drive to 0
TINY = train_preset("tiny", steps=8, batch_size=4, eval_every=4, checkpoint_every=2, log_every=1)
TINY_FLAGS = ["--steps", "8", "--batch-size", "4", "--eval-every", "4", "--checkpoint-every", "2", "--log-every", "1"]
USER_ERRORS = (ValueError, RuntimeError, OSError)
HANG_S = 120


class Hang(BaseException):
    pass


@contextlib.contextmanager
def deadline(seconds: int = HANG_S):
    """Raise `Hang` in this process if the block runs longer than `seconds` (a FIFO, a lock)."""
    def expire(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def cli(*argv, seconds: int = HANG_S) -> tuple[str, str]:
    """Run `headlab argv` in this process; classify by exit status and stderr (a hang: no answer
    within `seconds`, more for a case that trains a study on a busy machine)."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with deadline(seconds), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse: usage and one error line, status 2
        code = exit_.code
    except Hang as error:
        return "hang", str(error)
    except BaseException as error:  # any escape is what is being counted
        return "traceback", f"{type(error).__name__}: {error}"[:200]
    text = err.getvalue().strip()
    if code == 2 and "Traceback" not in text and text.splitlines()[-1].count("error:") == 1:
        return "clear", text.splitlines()[-1][:200]
    return ("silent" if code == 0 else "traceback"), text[-200:]


def api(make, seconds: int = HANG_S) -> tuple[str, str]:
    try:
        with deadline(seconds):
            make()
    except Hang as error:
        return "hang", str(error)
    except USER_ERRORS as error:
        return "clear", f"{type(error).__name__}: {error}"[:200]
    except BaseException as error:
        return "traceback", f"{type(error).__name__}: {error}"[:200]
    return "silent", "accepted"


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (and `folder` itself when a file): content hash or link target."""
    paths = sorted(folder.rglob("*")) if folder.is_dir() and not folder.is_symlink() else [folder]
    return {str(p): f"-> {os.readlink(p)}" if p.is_symlink() else "folder" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def untouched(case, *watched: Path) -> tuple[str, str]:
    """The outcome of `case()`, or 'lost' if it changed any of `watched` (what headlab did not write)."""
    before = [snapshot(w) for w in watched]
    outcome = case()
    changed = [str(w) for w, earlier in zip(watched, before) if snapshot(w) != earlier]
    return ("lost", f"changed {', '.join(changed)}") if changed else outcome


def same_run(folder: Path, reference) -> tuple[str, str]:
    try:
        loaded = load_run(folder)
        metrics = read_metrics(folder / "metrics.jsonl")
    except BaseException as error:
        return "lost", f"{type(error).__name__}: {error}"[:200]
    strip = lambda records: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in records]
    same = all(torch.equal(t, loaded.model.state_dict()[n]) for n, t in reference.model.state_dict().items())
    return ("recovered", "identical") if same and strip(metrics) == strip(reference.metrics) else ("silent", "differs")


def judged(outcome: tuple[str, str], holds: bool, what: str) -> tuple[str, str]:
    """A command's outcome, 'silent' when it ran or was refused but `holds` is false (`what` says why)."""
    return outcome if holds or outcome[0] != "clear" and outcome[0] != "silent" else ("silent", what)


def finished_run(root: Path) -> Path:
    """root/finished: a finished tiny GQA run (`TINY`), trained here unless an earlier round left it."""
    finished = root / "finished"
    if not finished.exists():
        train(preset("tiny", "gqa"), TINY, load_corpus("synthetic"), out=finished, progress=False)
    return finished


def copy_of(root: Path, source: Path, name: str) -> Path:
    """A copy of the run folder `source` as root/name."""
    shutil.copytree(source, root / name)
    return root / name


def recorder(results: list, width: int = 52):
    """A function `record(name, outcome)` appending (name, kind, detail) to `results` and printing it."""
    def record(name: str, outcome: tuple[str, str]) -> None:
        results.append((name, *outcome))
        print(f"{outcome[0]:<10} {name:<{width}} {outcome[1][:110]}", flush=True)
    return record


def counts_line(results: list) -> str:
    """'N cases: a OK, b clear, ...' over `OUTCOMES`, the kinds that occurred."""
    counts = Counter(kind for _, kind, _ in results)
    return f"{len(results)} cases: " + ", ".join(f"{counts[k]} {k}" for k in OUTCOMES if counts[k])
