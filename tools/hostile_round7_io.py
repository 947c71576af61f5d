"""Round 7 of hostile inputs, issue 45's classes 1, 2, 3, 5 and 8: what headlab reads, replaces
and deletes, and how it ends when the machine refuses. Inputs in none of the earlier lists.

    PYTHONPATH=. python tools/hostile_round7_io.py [--out tools/hostile_round7.md]

Classes: 1/5 a Hub cache read through its links, never out of it (tools/hostile_round7_hub.py);
2 write-ahead records are no licences (a user's file where a killed write was going, files named
like temporaries, forged records); 3 a study's manifest owns nothing of its runs; 8 every failure
one line (memory, a terminal without UTF-8, immutable and folder-shaped targets, damaged records,
a checkpoint that cannot be deleted). The machinery is tools/hostile/harness.py's (the
in-process CLI with its deadline) and the tests' (tests/faults.py's faults, tests/treediff.py's
checker, which judges every command on a folder headlab wrote). Outcomes:

    OK            a valid input did what it should
    clear         refused in one line naming the problem
    vague         refused in one line that does not name it
    silent wrong  accepted but wrong, or a valid input refused
    data lost     the tree-diff checker found a file headlab did not own changed or removed
    traceback     not one line, or an exception escaped
    security      a file outside the place headlab was given was read
    hang          no answer within the deadline
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tools")]  # tools/: the hostile package

from hostile.harness import Hang, cli, deadline  # noqa: E402
from hostile.round_issue39 import STUDY39  # noqa: E402

import faults  # noqa: E402  (tests/faults.py: the faults the tests inflict)
import treediff  # noqa: E402
from tools.hostile_round7_hub import gguf_cases, hub_cases  # noqa: E402

OUTCOMES = ("OK", "clear", "vague", "silent wrong", "data lost", "traceback", "security", "hang")
BAD = ("silent wrong", "data lost", "traceback", "security", "hang")


class Judge:
    """Classifies outcomes; `secret` is planted in files outside every place headlab is given."""

    def __init__(self):
        self.secret = f"SECRET-{secrets.token_hex(8)}"

    @staticmethod
    def cli(*argv) -> tuple[str, str]:
        return cli(*argv)

    def refusal(self, outcome, *words: str, escape: bool = False) -> tuple[str, str]:
        """A command that must be refused in one line naming `words`; `escape`: accepting it read outside."""
        kind, text = outcome
        if self.secret in text:
            return "security", f"printed a secret from outside: {text[:120]}"
        if kind == "silent":
            return ("security" if escape else "silent wrong"), f"accepted: {text[:120]}"
        if kind == "clear":
            return ("clear" if all(w.lower() in text.lower() for w in words) else "vague"), text
        return kind, text

    def success(self, outcome, holds: bool = True, what: str = "") -> tuple[str, str]:
        kind, text = outcome
        if kind == "silent":
            return ("OK", text[-120:] or "done") if holds else ("silent wrong", what)
        return ("silent wrong", f"refused: {text}") if kind == "clear" else (kind, text)

    def on_tree(self, root: Path, argv, expect: str, *words: str, holds=lambda: True, what="") -> tuple[str, str]:
        """`headlab argv` judged by the tree-diff checker over `root`, then as a refusal or a success."""
        before = treediff.Tree.read(root)
        try:
            with deadline():
                status, err = treediff.run_cli(argv)
        except Hang as error:
            return "hang", str(error)
        except BaseException as error:  # what escapes is what is counted
            return "traceback", f"{type(error).__name__}: {error}"[:200]
        broken = treediff.check(before, treediff.Tree.read(root), status, err)
        lost = [b for b in broken if not b.startswith(("exit status", "error is not one line"))]
        if lost:
            return "data lost", lost[0][:200]
        lines = err.strip().splitlines()
        kind = ("silent" if status == 0 else "clear" if status == 2 and len(lines) == 1
                and lines[0].startswith("headlab: error: ") else "traceback")
        outcome = (kind, lines[-1][:200] if lines else "")
        return self.refusal(outcome, *words) if expect == "refused" else self.success(outcome, holds(), what)


def in_subprocess(argv, env=None, address_space: int | None = None, timeout: int = 300) -> tuple[str, str]:
    """`python -m headlab argv` in a child (optionally under `ulimit -v`): the cli()-style outcome."""
    def limit():
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.RLIM_INFINITY))
    try:
        done = subprocess.run([sys.executable, "-m", "headlab", *map(str, argv)], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                      **(env or {})})
    except subprocess.TimeoutExpired:
        return "hang", f"no answer within {timeout} s"
    lines = done.stderr.strip().splitlines()
    if done.returncode == 0:
        return "silent", done.stdout.strip().splitlines()[0][:120] if done.stdout.strip() else ""
    if done.returncode == 2 and len(lines) == 1 and lines[0].startswith("headlab: error: "):
        return "clear", lines[0][:200]
    return "traceback", f"status {done.returncode}: {' | '.join(lines[-2:])[:200]}"


def templates(root: Path) -> Path:
    """root/template: a tiny two-variant study with its report, its docs, and an analysis of one
    of its runs inside the study."""
    study = root / "template" / "study"
    for argv in (["reproduce", *STUDY39, "--jobs", "1", "--out", study],
                 ["docs", study, "--out", study.parent / "docs"]):
        status, err = treediff.run_cli(argv)
        assert status == 0, (argv, err)
    (study / "notes.md").write_text("a user's notes inside the study")
    run = sorted((study / "runs").iterdir())[0]
    status, err = treediff.run_cli(["analyze", run, "--out", study / "analysis"])
    assert status == 0, err
    return study


def fresh(template: Path, root: Path, name: str) -> Path:
    """A copy of the template tree (the study and docs) in a case root of its own."""
    case = root / "cases" / name
    shutil.copytree(template.parent, case, symlinks=True)
    return case


def write_ahead_cases(root: Path, judge: Judge):
    """Class 2: a record of a write licenses nothing its bytes do not."""
    template = root / "template" / "study"
    counter = iter(range(1000))

    def case():
        return fresh(template, root, f"w{next(counter)}")

    for where in (".report.md.0123abcd.tmp", "figures/.spectra_uncentered.png.0123abcd.tmp"):
        tree = case()
        (tree / "study" / where).write_text("a user's file, named like a temporary")
        yield f"report beside a user's {where}", judge.on_tree(tree, ["report", tree / "study"], "ok")
    tree = case()
    (tree / "study" / ".report.md.0123abcd.tmp").write_text("a user's")
    faults.forge_entry(tree / "study", "staging", ".report.md.0123abcd.tmp", "false")
    yield "report, a user's temporary-named file recorded with another inode", judge.on_tree(
        tree, ["report", tree / "study"], "ok")
    tree = case()
    faults.forge_entry(tree / "study", "staging", "report.md", "true")
    yield "report, staging record naming report.md (not a temporary)", judge.on_tree(
        tree, ["report", tree / "study"], "refused", "temporary")
    tree = case()
    (tree / "study" / "report.md").write_text("my own report, edited by hand")
    yield "report over a hand-edited report.md", judge.on_tree(tree, ["report", tree / "study"], "refused", "changed")
    for state in ("no content", "false"):
        tree = case()
        faults.forge_entry(tree / "study", "intended", "report.md", state)
        (tree / "study" / "report.md").write_text("mine, written after a kill")
        yield f"report, intended ({state}) + a user's report.md", judge.on_tree(
            tree, ["report", tree / "study"], "refused", "report.md")
    tree = case()
    faults.forge_entry(tree / "docs", "intended", "headline.md", "no content")
    (tree / "docs" / "headline.md").write_text("my headline")
    yield "docs, intended (no content) + a user's headline.md", judge.on_tree(
        tree, ["docs", tree / "study", "--out", tree / "docs"], "refused", "headline.md")
    tree = case()
    (tree / "study" / "analysis" / "summary.csv").write_text("layer,mine\n0,1\n")
    run = sorted((tree / "study" / "runs").iterdir())[0]
    yield "analyze over a user's summary.csv", judge.on_tree(
        tree, ["analyze", run, "--out", tree / "study" / "analysis"], "refused", "summary.csv")
    tree = case()
    run = sorted((tree / "study" / "runs").iterdir())[0]
    (run / ".config.json.0123abcd.tmp").write_text("a user's")
    yield "train --resume beside a user's .config.json.<hex>.tmp", judge.on_tree(
        tree, ["train", "--preset", "tiny", "--attention", run.name.split("-")[0], "--corpus", "synthetic",
               "--steps", "4", "--resume", "--no-progress", "--out", run], "ok")


def nested_cases(root: Path, judge: Judge):
    """Class 3: a study's manifest owns nothing inside a run (or analysis) folder with a manifest of its own."""
    template = root / "template" / "study"
    counter = iter(range(1000))
    for field, pattern, state in (("retired", "runs/*/manifest.json", "true"),
                                  ("retired", "runs/*/checkpoint-*/model.safetensors", "true"),
                                  ("retired", "runs/*/config.json", "true"),
                                  ("retired", "analysis/summary.csv", "true"),
                                  ("intended", "runs/*/config.json", "true"),
                                  ("files", "runs/*/manifest.json", "true"),
                                  ("discard", "runs/*/checkpoint-*", "no content"),
                                  ("staging", "runs/*/.model.safetensors.0123abcd.tmp", "true")):
        tree = fresh(template, root, f"n{next(counter)}")
        study = tree / "study"
        if pattern.endswith(".tmp"):
            (sorted((study / "runs").iterdir())[0] / Path(pattern).name).write_text("a run's temporary")
        name = sorted(study.glob(pattern))[0].relative_to(study).as_posix()
        faults.forge_entry(study, field, name, state)
        if field == "discard":
            faults.edit_json(study / "study.json", lambda payload: payload.setdefault("folders", []).append(name))
        yield f"report, study.json {field} ({state}) naming {pattern}", judge.on_tree(
            tree, ["report", study], "ok", holds=lambda: (study / name).exists(), what=f"{name} removed")


def machine_cases(root: Path, judge: Judge):
    """Class 8: every failure one line, the machine's too."""
    template = root / "template" / "study"
    run = sorted((template / "runs").iterdir())[0]
    for megabytes in (300, 700, 1100):  # too little to load torch, ..., enough for a tiny run: done or one line
        outcome = in_subprocess(["analyze", run, "--out", root / "out" / f"mem{megabytes}"],
                                address_space=megabytes << 20)
        yield f"analyze under ulimit -v {megabytes} MB", (judge.success(outcome) if outcome[0] == "silent" else
                                                          judge.refusal(outcome, "memory"))
    yield "analyze with PYTHONIOENCODING=ascii", judge.success(in_subprocess(
        ["analyze", run, "--out", root / "out" / "ascii"], env={"PYTHONIOENCODING": "ascii"}))
    yield "report under LC_ALL=C, no UTF-8 mode", judge.success(in_subprocess(
        ["report", fresh(template, root, "lc") / "study"], env={"LC_ALL": "C", "PYTHONUTF8": "0", "LANG": "C"}))
    tree = fresh(template, root, "immutable")
    subprocess.run(["chattr", "+i", tree / "study" / "report.md"], check=True)
    try:
        outcome = judge.refusal(cli("report", tree / "study"), "report.md")
        yield "report over an immutable report.md (chattr +i)", (
            ("vague", outcome[1]) if ".tmp" in outcome[1] else outcome)
    finally:
        subprocess.run(["chattr", "-i", tree / "study" / "report.md"], check=True)
    tree = fresh(template, root, "folder-target")
    analysis = tree / "study" / "analysis"
    (analysis / "summary.csv").unlink()
    (analysis / "summary.csv").mkdir()
    outcome = judge.on_tree(tree, ["analyze", sorted((tree / "study" / "runs").iterdir())[0], "--out", analysis],
                            "refused", "summary.csv")
    yield "analyze where summary.csv is now a folder", ("vague", outcome[1]) if ".tmp" in outcome[1] else outcome
    for what, edit in (("a checkpoint step of 1e400", lambda text: text.replace('"step": 4', '"step": 1e400')),
                       ("a checkpoint step of -1e400", lambda text: text.replace('"step": 4', '"step": -1e400')),
                       ("a checkpoint step of 4.5", lambda text: text.replace('"step": 4', '"step": 4.5'))):
        tree = fresh(template, root, f"step{abs(hash(what)) % 1000}")
        manifest = sorted((tree / "study" / "runs").iterdir())[0] / "manifest.json"
        manifest.write_text(edit(manifest.read_text()))
        yield f"analyze a run whose manifest records {what}", judge.on_tree(
            tree, ["analyze", manifest.parent, "--out", tree / "out"], "refused", "step" if "." in what else "1e400")
    for what, change in (("columns a number", lambda t: t.update(columns=5)), ("rows a string", lambda t: t.update(
            rows="x")), ("no columns", lambda t: t.pop("columns"))):
        tree = fresh(template, root, f"tables{abs(hash(what)) % 1000}")
        faults.edit_json(tree / "study" / "study.json",
                         lambda payload: change(payload["meta"]["tables"]["summary.csv"]))
        yield f"report, study.json's table record with {what}", judge.on_tree(
            tree, ["report", tree / "study"], "refused", "tables")
    yield from undeletable_checkpoint(root, judge)


def undeletable_checkpoint(root: Path, judge: Judge):
    """A superseded checkpoint that cannot be deleted (made immutable, chattr +i, as soon as it is
    written): a warning, and training goes on to its last step."""
    run = root / "cases" / "undeletable"
    weights = run / "checkpoint-00000002" / "model.safetensors"
    written = threading.Event()

    def make_immutable_once_written():
        while not written.is_set():
            if weights.exists():
                subprocess.run(["chattr", "+i", weights], check=True)
                return
            time.sleep(0.002)
    watcher = threading.Thread(target=make_immutable_once_written)
    watcher.start()
    try:
        status, err = treediff.run_cli(["train", "--preset", "tiny", "--corpus", "synthetic", "--batch-size", "2",
                                        "--steps", "8", "--checkpoint-every", "2", "--eval-every", "4",
                                        "--no-progress", "--out", run])
    finally:
        written.set()
        watcher.join()
        subprocess.run(["chattr", "-i", weights], check=False)
    step = json.loads((run / "manifest.json").read_text())["meta"]["checkpoint"]["step"]
    warned = "headlab: warning: could not delete" in err
    yield "train past a checkpoint it cannot delete (chattr +i)", (
        ("OK", err.strip().splitlines()[0][:160]) if status == 0 and step == 8 and warned else
        ("silent wrong" if status == 0 else "traceback" if len(err.strip().splitlines()) > 1 else "vague",
         f"status {status}, step {step}, warned {warned}: {err.strip()[-160:]}"))


def write_page(path: Path, results: list[tuple[str, str, str, str]]) -> None:
    counts = Counter(outcome for _, _, outcome, _ in results)
    lines = ["# Hostile inputs, round 7: reading, replacing and deleting (issue 45, classes 1, 2, 3, 5, 8)", "",
             "`PYTHONPATH=. python tools/hostile_round7_io.py` (as root: `chattr +i`), "
             f"{len(results)} inputs in none of the earlier lists.", "",
             "| " + " | ".join(OUTCOMES) + " |", "|" + "---|" * len(OUTCOMES),
             "| " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |", "",
             "| class | input | outcome | what headlab said or did |", "|---|---|---|---|"]
    lines += [f"| {cls} | {name} | {outcome} | {detail.replace('|', '/')[:160]} |"
              for cls, name, outcome, detail in results]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the results page to write (markdown)")
    parser.add_argument("--keep", type=Path, help="scratch folder to keep (default: a temporary one)")
    parser.add_argument("--only", nargs="+", choices=["hub", "gguf", "write-ahead", "nested", "machine"],
                        help="only these classes (default: all)")
    args = parser.parse_args()
    judge, results = Judge(), []
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        os.environ["HEADLAB_CACHE"] = str(root / "cache")
        classes = {"hub": ("1, 5 hub", hub_cases), "gguf": ("1, 5 gguf", gguf_cases),
                   "write-ahead": ("2 write-ahead", write_ahead_cases),
                   "nested": ("3 nested", nested_cases), "machine": ("8 one line", machine_cases)}
        chosen = args.only or list(classes)
        if set(chosen) - {"hub", "gguf"}:
            templates(root)
        for key in chosen:
            cls, cases = classes[key]
            for name, (outcome, detail) in cases(root / f"{key}-cases" if key in ("hub", "gguf") else root, judge):
                results.append((cls, name, outcome, detail))
                print(f"{outcome:<13} [{cls}] {name:<64} {detail[:100]}", flush=True)
    counts = Counter(outcome for _, _, outcome, _ in results)
    print(f"\n{len(results)} inputs: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES))
    if args.out:
        write_page(args.out, results)
    return 1 if any(counts[o] for o in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
