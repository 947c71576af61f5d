"""Rounds whose inputs are listed before they run: each input is a `Case` (the issue's class it
attacks, its name, and the function that inflicts it and judges the outcome), so a cheap test can
count a round's distinct inputs and their classes without running one (tests/cli/test_hostile_lists.py).

Judging a command on a tree headlab wrote (`on_tree`): the tree-diff checker (tests/treediff.py)
decides 'lost' (a file headlab did not own changed or removed, or an owned one without a verified
new version), and files named in `watched` (a user's file named like a temporary, which the checker
does not read as content, a link's target) must not change at all. Then the command is judged as a
refusal (`expect='refused'`: one line naming every one of `words`), a success (`expect='ok'`: it
ran and `holds()`), or either (`expect='either'`: a valid input headlab may refuse in one line).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hostile.harness import HANG_S, Hang, deadline, faults, snapshot

import treediff  # noqa: E402  (tests/ is on the path: hostile.harness puts it there)

CLASSES = ("1", "2", "3", "4", "5", "6", "7", "8", "9")  # issue 45's classes


@dataclass(frozen=True)
class Case:
    cls: str  # the class ("1".."9"), or several joined by "/"
    name: str
    inflict: Callable[[Path], tuple[str, str]]  # scratch folder -> (outcome, detail)

    @property
    def title(self) -> str:
        return f"[{self.cls}] {self.name}"


def run_cases(cases: list[Case], root: Path, record) -> None:
    """Each case in a scratch folder of its own below `root`; an escape of the round's own code is
    recorded as 'traceback' with its message, so one broken case does not end the round."""
    for number, case in enumerate(cases):
        folder = root / f"case{number:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            outcome = case.inflict(folder)
        except Hang as error:
            outcome = ("hang", str(error))
        except Exception as error:  # noqa: BLE001  (the round's own failure: counted, named)
            outcome = ("traceback", f"round: {type(error).__name__}: {error}"[:200])
        record(case.title, outcome)


def refusal(outcome: tuple[str, str], *words: str, escape: bool = False) -> tuple[str, str]:
    """A bad input: clear when refused in one line naming every one of `words`; accepted is
    'silent' (or 'security' when accepting it means reading outside the place named)."""
    kind, detail = outcome
    if kind == "clear":
        return outcome if all(w.lower() in detail.lower() for w in words) else ("vague", detail)
    if kind == "silent":
        return ("security" if escape else "silent"), f"accepted: {detail[:150]}"
    return outcome


def success(outcome: tuple[str, str], holds: Callable[[], bool] = lambda: True, what: str = "") -> tuple[str, str]:
    """A valid input: OK when it ran and `holds()`; refused is 'silent' (a valid input refused)."""
    kind, detail = outcome
    if kind == "silent":
        return ("OK", what or "done") if holds() else ("silent", f"ran, but not: {what}")
    return ("silent", f"a valid input was refused: {detail}") if kind == "clear" else outcome


def either(outcome: tuple[str, str], holds: Callable[[], bool] = lambda: True, what: str = "") -> tuple[str, str]:
    """An input headlab may run (then `holds()` must) or refuse in one line."""
    return outcome if outcome[0] == "clear" else success(outcome, holds, what)


def run_cli(argv, seconds: int = HANG_S) -> tuple[int | str, str]:
    """`headlab argv` in this process: (exit status or 'hang' / 'traceback', stderr)."""
    try:
        with deadline(seconds):
            return treediff.run_cli([str(a) for a in argv])
    except Hang as error:
        return "hang", str(error)
    except BaseException as error:  # noqa: BLE001  (an escape is what is counted)
        return "traceback", f"{type(error).__name__}: {error}"[:200]


def state(path) -> dict | None:
    """What is at `path` (`hostile.harness.snapshot`), None where nothing is."""
    return snapshot(Path(path)) if os.path.lexists(path) else None


def on_tree(root: Path, argv, expect: str, *words: str, watched=(), holds=lambda: True, what="",
            seconds: int = HANG_S) -> tuple[str, str]:
    """`headlab argv` judged by the tree-diff checker over `root` and by `watched` staying as they
    were, then by `expect` ('refused', 'ok', 'either')."""
    before, watching = treediff.Tree.read(root), [state(w) for w in watched]
    status, err = run_cli(argv, seconds)
    if status in ("hang", "traceback"):
        return status, err
    changed = [str(w) for w, earlier in zip(watched, watching) if state(w) != earlier]
    if changed:
        return "lost", f"changed {', '.join(changed)}"[:200]
    broken = treediff.check(before, treediff.Tree.read(root), status, err)
    lost = [b for b in broken if not b.startswith(("exit status", "error is not one line"))]
    if lost:
        return "lost", lost[0][:200]
    lines = err.strip().splitlines()
    one_line = len(lines) == 1 and lines[0].startswith("headlab: error: ")
    outcome = (("silent", lines[-1][:200] if lines else "") if status == 0 else
               ("clear", lines[0][:200]) if status == 2 and one_line else
               ("traceback", f"status {status}: {' | '.join(lines[-2:])[:180]}"))
    if expect == "refused":
        return refusal(outcome, *words)
    return (either if expect == "either" else success)(outcome, holds, what)


def count_writes(work: Callable[[], object], root: Path) -> int:
    """How many writes below `root` `work()` makes, counted in a child process as
    `faults.kill_after_write` counts them (so a kill at write n, 1 <= n <= this, lands inside it)."""
    root = Path(root).resolve()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        os.close(read)
        count = 0
        try:
            def counted(call: str, real: Callable) -> Callable:
                def counting(*args, **kwargs):
                    nonlocal count
                    path = faults.written_path(call, args)
                    result = real(*args, **kwargs)
                    count += path is not None and path.is_relative_to(root)
                    return result
                return counting
            reals = {call: getattr(os, call) for call in faults.WRITES}
            for call, real in reals.items():
                setattr(os, call, counted(call, real))
            try:
                work()
            finally:
                for call, real in reals.items():
                    setattr(os, call, real)
        finally:
            os.write(write, str(count).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return int(said or 0)


def killed_then(work: Callable[[], object], root: Path, nth: int) -> bool:
    """Kill -9 `work()` right after its `nth` write below `root`; True if it was killed."""
    return faults.kill_after_write(work, root, nth) == faults.KILLED

