"""Issue 45's faults round: fresh hostile inputs (in none of the earlier lists) of class 8 where
headlab reads and writes files: FIFOs, a socket and hard links where files go, a FIFO as --out,
a run named through a link; kill -9 right after a chosen write of docs, report, analyze and train,
a full disk and a file-size limit, each followed by the same command, which must end as the
uninterrupted one did (the same files, byte for byte; the same weights and metrics). Every command
on a tree headlab wrote is judged by the tree-diff checker (`hostile.cases.on_tree`); the trees are
round_issue45_io's templates."""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path

from hostile.cases import Case, count_writes, either, killed_then, on_tree, refusal, run_cases, run_cli
from hostile.harness import cli, faults, recorder, same_run
from hostile.round_issue45_io import PLACE, mqa_run, report, template, tree, users

NAME = "issue45_faults"
RANDOM = random.Random(45)  # the write a kill lands on: drawn once, from a fixed seed


def files_of(manifest: Path) -> dict:
    return json.loads(manifest.read_text())["files"]


def fifo_at(relative: str, command: str, *words: str):
    """A FIFO where headlab reads file `relative` of the tree: one line, no hang."""
    def inflict(folder):
        copy = tree(folder)
        path = copy / relative
        path.unlink()
        os.mkfifo(path)
        argv = (["report", copy / "study"] if command == "report" else
                ["analyze", mqa_run(copy / "study"), "--no-figure", "--out", folder / "out"])
        return refusal(cli(*argv, seconds=90), *words) if words else either(cli(*argv, seconds=90))
    return inflict


def socket_config(folder):
    copy = tree(folder)
    config = mqa_run(copy / "study") / "config.json"
    config.unlink()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(config))
    try:
        return refusal(cli("analyze", config.parent, "--out", folder / "out", seconds=90), "config.json")
    finally:
        listener.close()


def hard_linked_report(folder):
    return report(folder, user=users("study/report.md", "hardlink"))


def hard_linked_weights(folder):
    """A run killed after its step-4 checkpoint, whose weights the user hard-links under a name of
    their own; the resume supersedes (deletes) that checkpoint: the user's name keeps its bytes."""
    run, mine = folder / "run", folder / "mine.safetensors"
    if not killed_then(lambda: run_cli(train_argv(run)), run, writes_of_train(folder) // 2):
        return "silent", "not killed"
    os.link(sorted(run.glob("checkpoint-*/model.safetensors"))[-1], mine)
    return on_tree(folder, train_argv(run), "ok", watched=[mine])


def docs_out_fifo(folder):
    copy = tree(folder)
    os.mkfifo(copy / "pipe")
    return on_tree(copy, ["docs", copy / "study", "--out", copy / "pipe"], "refused", "pipe", seconds=90)


def analyze_linked_run(folder):
    copy = tree(folder)
    (copy / "alias").symlink_to(mqa_run(copy / "study"), target_is_directory=True)
    return on_tree(copy, ["analyze", copy / "alias", "--no-figure", "--out", copy / "alias-out"], "either")


def rewrite(command: str):
    """(the folder a command writes, the command as a function of the tree, the manifest it writes)."""
    return {"docs": ("docs2", lambda c: ["docs", c / "study", "--out", c / "docs2"], "docs2/docs.json"),
            "report": ("study", lambda c: ["report", c / "study"], "study/study.json"),
            "analyze": ("analysis2", lambda c: ["analyze", mqa_run(c / "study"), "--out", c / "analysis2"],
                        "analysis2/analysis.json")}[command]


WRITES_SEEN: dict[str, int] = {}


def writes_of(folder: Path, command: str) -> int:
    """How many writes `command` makes (counted once, on a copy of its own)."""
    if command not in WRITES_SEEN:
        copy = tree(folder / "counting")
        written, argv, _ = rewrite(command)
        WRITES_SEEN[command] = count_writes(lambda: run_cli(argv(copy)), copy / written)
    return WRITES_SEEN[command]


def killed_command(command: str, share: float):
    """kill -9 right after a write `share` of the way through `command`, then the same command:
    it must end as the uninterrupted one (every file the same bytes)."""
    def inflict(folder):
        total = writes_of(folder, command)
        copy = tree(folder)
        written, argv, manifest = rewrite(command)
        reference = tree(folder / "reference")
        assert run_cli(argv(reference))[0] == 0
        nth = max(1, min(total, round(share * total)))
        if not killed_then(lambda: run_cli(argv(copy)), copy / written, nth):
            return "silent", f"not killed at write {nth} of {total}"
        outcome = on_tree(copy, argv(copy), "ok")
        same = outcome[0] == "OK" and files_of(copy / manifest) == files_of(reference / manifest)
        return (("recovered", f"killed at write {nth} of {total}; rerun identical") if same else
                outcome if outcome[0] != "OK" else ("silent", f"killed at write {nth}: rerun differs"))
    return inflict


def train_argv(run: Path, steps: int = 8) -> list:
    return ["train", "--preset", "tiny", "--attention", "gqa", "--corpus", "synthetic", "--steps", steps,
            "--batch-size", "4", "--eval-every", "4", "--checkpoint-every", "2", "--log-every", "1", "--no-progress",
            "--resume", "--out", run]


def reference_run(folder: Path):
    from headlab import load_run
    from headlab.runs.metrics import read_metrics
    run = load_run(template(folder) / "run")
    run.metrics = read_metrics(template(folder) / "run" / "metrics.jsonl")
    return run


def writes_of_train(folder: Path) -> int:
    if "train" not in WRITES_SEEN:
        WRITES_SEEN["train"] = count_writes(lambda: run_cli(train_argv(folder / "count")), folder / "count")
    return WRITES_SEEN["train"]


def killed_train(share: float):
    def inflict(folder):
        total, run = writes_of_train(folder), folder / "run"
        nth = max(1, round(share * total))
        if not killed_then(lambda: run_cli(train_argv(run)), run, nth):
            return "silent", f"not killed at write {nth} of {total}"
        status, err = run_cli(train_argv(run))
        if status != 0:
            return "lost", f"resume after a kill at write {nth}: {err.strip()[-150:]}"
        kind, detail = same_run(run, reference_run(folder))
        return kind, f"killed at write {nth} of {total}: {detail}"
    return inflict


def full_disk(command: str, nth: int):
    """The nth os.write of `command` fails with ENOSPC: one line; the same command then gives the
    uninterrupted result."""
    def inflict(folder):
        copy, reference = tree(folder), tree(folder / "reference")
        written, argv, manifest = rewrite(command)
        assert cli(*argv(reference))[0] == "silent"
        with faults.failing_call(os, "write", nth):
            first = on_tree(copy, argv(copy), "refused", "space")
        if first[0] not in ("clear", "OK"):
            return first
        again = on_tree(copy, argv(copy), "ok")
        same = again[0] == "OK" and files_of(copy / manifest) == files_of(reference / manifest)
        return (("recovered", f"{first[1][:100]}; rerun identical") if same else
                again if again[0] != "OK" else ("silent", "rerun differs from the uninterrupted one"))
    return inflict


def file_size_limit_train(folder):
    run = folder / "run"
    limit = (sorted((template(folder) / "run").glob("checkpoint-*/model.safetensors"))[-1].stat().st_size // 2)
    status, err = faults.with_file_size_limit(lambda: run_cli(train_argv(run)), limit)
    lines = err.strip().splitlines()
    if status != 2 or len(lines) != 1:
        return ("traceback", f"status {status}: {err.strip()[-150:]}") if status else ("silent", "not refused")
    status, again = run_cli(train_argv(run))
    if status != 0:
        return "lost", f"resume after EFBIG: {again.strip()[-150:]}"
    kind, detail = same_run(run, reference_run(folder))
    return kind, f"{lines[0][:90]}; resumed: {detail}"


MACHINE = [
    ("8", "analyze a run whose metrics.jsonl is a FIFO", fifo_at("study/runs/mqa-seed0/metrics.jsonl", "analyze")),
    ("8", "report where the study's summary.csv is a FIFO", fifo_at("study/summary.csv", "report", "summary.csv")),
    ("8", "analyze a run whose config.json is a Unix socket", socket_config),
    ("8", "report where report.md is a hard link to a user's file", hard_linked_report),
    ("8", "train --resume superseding a checkpoint whose weights the user hard-linked", hard_linked_weights),
    ("8", "docs --out a FIFO", docs_out_fifo),
    ("8", "analyze a run named through a link to its folder", analyze_linked_run),
    *[("8", f"kill -9 at {share:.0%} of docs's writes, then docs", killed_command("docs", share))
      for share in sorted(RANDOM.sample([0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95], 3))],
    *[("8", f"kill -9 at {share:.0%} of report's writes, then report", killed_command("report", share))
      for share in sorted(RANDOM.sample([0.1, 0.3, 0.6, 0.9, 1.0], 2))],
    ("8", "kill -9 at the last write of analyze, then analyze", killed_command("analyze", 1.0)),
    *[("8", f"kill -9 at {share:.0%} of train's writes, then train --resume", killed_train(share))
      for share in sorted(RANDOM.sample([0.03, 0.15, 0.4, 0.55, 0.7, 0.99], 3))],
    ("8", "full disk at the 3rd os.write of docs, then docs", full_disk("docs", 3)),
    ("8", "full disk at the 2nd os.write of report, then report", full_disk("report", 2)),
    ("8", "file-size limit of half a checkpoint during train, then resume", file_size_limit_train),
]

CASES = [Case(cls, name, inflict) for cls, name, inflict in MACHINE]


def run(root: Path) -> list[tuple[str, str, str]]:
    results = []
    PLACE["root"] = root / "issue45"
    run_cases(CASES, PLACE["root"] / NAME, recorder(results, width=72))
    return results
