"""Issue 39's round of hostile inputs: diverged training reported as a result (class 2), and
grids and inputs (class 4)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

from hostile.harness import api, cli, faults, finished_run, judged

from headlab.cli.main import main
from headlab.runs.layout import MANIFEST

NAME = "issue39"


def run(root: Path) -> list[tuple[str, str, str]]:
    """Issue 39's classes 2 (diverged training reported as a result) and 4 (grids and inputs):
    members of none of the lists above, each judged by what it must do, not only by its exit."""
    finished_run(root)
    results = []
    for cls, members in (("diverged", diverged_runs(root)), ("grids and inputs", grids_and_inputs(root))):
        for name, outcome in members:
            results.append((f"[{cls}] {name}", *outcome))
            print(f"{outcome[0]:<10} [{cls}] {name:<60} {outcome[1][:110]}", flush=True)
    return results


STUDY39 = ["--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--only", "mha", "mla"]
SWEEP39 = ["sweep", "--preset", "tiny", "--lengths", "0.1", "--seeds", "1", "--only", "mha", "mla"]


def marked_diverged(run: Path) -> bool:
    """Whether a run folder's manifest records that it diverged (read as JSON: any version)."""
    return isinstance(json.loads((run / MANIFEST).read_text()).get("meta", {}).get("diverged"), dict)


def diverged_runs(root: Path):
    """Runs that end worse than a uniform guess, or at a non-finite loss, through every way in:
    each must be marked, refused as a result in one line, and never trained again."""
    run = root / "div-train"
    outcome = cli("train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--lr", "10", "--no-progress",
                  "--out", run)
    yield "train --lr 10: the run folder says diverged", (("clear", "marked") if outcome[0] == "silent" and
                                                          marked_diverged(run) else ("silent", "not marked"))
    outcome = cli("train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--lr", "10", "--no-progress",
                  "--resume", "--out", run)
    yield "train --resume of a finished diverged run keeps the mark", (
        ("clear", "still marked") if outcome[0] == "silent" and marked_diverged(run) else ("silent", "mark lost"))
    study = root / "div-study"
    for rerun in ("", " (rerun)"):
        before = {p: p.read_bytes() for p in study.rglob("metrics.jsonl")}
        outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", "lr=10", "--out", study)
        retrained = any(p.read_bytes() != data for p, data in before.items())
        yield f"reproduce --set lr=10{rerun}", judged(outcome, outcome[0] == "clear" and "diverged" in outcome[1]
                                                      and not retrained, f"reported as a result: {outcome[1][:80]}")
    outcome = cli("reproduce", *STUDY39, "--jobs", "2", "--set", "lr=10", "--out", root / "div-jobs")
    yield "reproduce --set lr=10 --jobs 2", judged(outcome, "diverged" in outcome[1], "not named as diverged")
    for lr in ("1e18", "1e6"):  # finite settings whose losses become NaN
        outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", f"lr={lr}", "--out", root / f"div-{lr}")
        yield f"reproduce --set lr={lr} (non-finite loss)", judged(outcome, "diverged" in outcome[1] or
                                                                   "loss is" in outcome[1], "not named")
        before = {p: p.read_bytes() for p in (root / f"div-{lr}").rglob("metrics.jsonl")}
        outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", f"lr={lr}", "--out", root / f"div-{lr}")
        retrained = any(p.read_bytes() != data for p, data in before.items())
        yield f"reproduce --set lr={lr} (rerun: not trained again)", judged(
            outcome, not retrained and "diverged" in outcome[1], "trained again, or not named")
    sweep = root / "div-sweep"
    for rerun in ("", " (rerun)"):
        outcome = cli(*SWEEP39, "--jobs", "1", "--set", "lr=0.003,10", "--out", sweep)
        written = (sweep / "sweep.csv").exists() and "lr10" not in (sweep / "sweep.csv").read_text()
        yield f"sweep --set lr=0.003,10{rerun}: the good point tabulated", (
            ("clear", "the other point written") if outcome[0] == "silent" and written else
            (outcome[0] if outcome[0] != "clear" else "silent", f"sweep.csv not written: {outcome[1][:80]}"))
    outcome = cli(*SWEEP39, "--jobs", "1", "--set", "lr=10,20", "--out", root / "div-sweep-all")
    yield "sweep --set lr=10,20 (every point diverged)", judged(outcome, "diverged" in outcome[1], "not named")
    outcome = cli(*SWEEP39, "--jobs", "2", "--set", "lr=10", "--out", root / "div-sweep-jobs")
    yield "sweep --set lr=10 --jobs 2 (worker processes)", judged(outcome, "diverged" in outcome[1], "not named")
    tampered = root / "div-tampered"
    shutil.copytree(study, tampered)
    for manifest in (tampered / "runs").glob("*/manifest.json"):
        faults.edit_json(manifest, lambda data: data["meta"].update(diverged={"step": "x"}))
    outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", "lr=10", "--out", tampered)
    yield "reproduce over runs whose divergence record is garbage", outcome


def grids_and_inputs(root: Path):
    """Grids that count one setting twice, study settings that cannot hold, refusals that leave a
    folder or say "reused" first, files that are not regular, a closed output, a damaged install."""
    import subprocess
    for flags in (["--set", "lr=0.001", "--set", "lr=0.002"], ["--set", "kv_residual_init=0,-0"],
                  ["--set", "weight_decay=0,-0.0"], ["--set", "rope_base=1e4,10000.0"],
                  ["--set", "lr=0.01", "--set", "weight_decay=0", "--set", "lr=0.02,0.03"],
                  ["--set", "attention=mla,mha"], ["--set", "device=meta"], ["--jobs", "99"],
                  ["--set", "kv_rank=2,4"], ["--set", "vocab_size=300,400"]):
        out = root / f"grid39-{abs(hash(str(flags))) % 10 ** 6}"
        outcome = cli(*SWEEP39, *flags, "--out", out)
        yield f"sweep {' '.join(flags)}", judged(outcome, not out.exists(), "refused, or accepted, leaving a folder")
    for setting in ("vocab_size=512", "kv_rank=8", "grad_accum=3", "n_kv_head=3", "device=meta", "attention=gqa"):
        out = root / f"study39-{setting.replace('=', '-')}"
        roles = ["--only", "mha", "lrkv-small", "lrkv-large"] if setting == "kv_rank=8" else []  # r = 8 for both
        outcome = cli("reproduce", *STUDY39, *roles, "--jobs", "1", "--set", setting, "--out", out)
        yield f"reproduce {' '.join(roles)} --set {setting}", judged(
            outcome, not out.exists() and "copy out of meta tensor" not in outcome[1],
            f"left a folder or a torch message: {outcome[1][:80]}")
    reused = root / "study39-reused"
    cli("reproduce", *STUDY39, "--jobs", "1", "--out", reused)
    said, err = io.StringIO(), io.StringIO()  # cli() keeps stdout to itself: what is said is read here
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(err):
        code = main(["reproduce", *STUDY39, "--jobs", "1", "--set", "lr=0.01", "--out", str(reused)])
    yield "reproduce of changed settings says nothing reused first", (
        ("clear", err.getvalue().strip()[-120:]) if code == 2 and "reused" not in said.getvalue() else
        ("silent", f"status {code}, said: {said.getvalue().strip()[-100:]}"))
    source = root / "finished"
    for what in ("config.json", "model.safetensors"):
        model = root / f"fifo39-{what}"
        shutil.copytree(source, model) if what != "config.json" else model.mkdir()
        if what == "config.json":
            os.mkfifo(model / what)
        else:  # a Hugging Face layout whose weights are a FIFO
            (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2,
                                                           "n_embd": 8, "vocab_size": 16, "n_positions": 8}))
            (model / "manifest.json").unlink()
            faults.remove(model / what) if (model / what).exists() else None
            os.mkfifo(model / what)
        yield f"analyze a folder whose {what} is a FIFO", cli("analyze", model, "--out", root / f"fifo39-{what}-out")
    linked = root / "fifo39-link"
    linked.mkdir()
    os.symlink(root / "fifo39-config.json" / "config.json", linked / "config.json")
    yield "analyze a folder whose config.json links to a FIFO", cli("analyze", linked, "--out", root / "fifo39-l-out")
    folder_config = root / "fifo39-folder"
    (folder_config / "config.json").mkdir(parents=True)
    yield "analyze a folder whose config.json is a folder", cli("analyze", folder_config, "--out", root / "f39-out")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for argv in (["info"], ["analyze", str(source), "--out", str(root / "pipe39")]):
        command = subprocess.Popen([sys.executable, "-m", "headlab", *argv], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env)
        command.stdout.close()
        err, status = command.stderr.read().decode(), command.wait()
        yield f"{' '.join(argv[:1])} | a reader that has gone", (
            ("clear", f"stopped quietly, status {status}") if not err else ("silent", err.strip()[-120:]))
    from headlab.study import tables as tables_module
    from headlab.study.study import Study
    from headlab.study.table_files import DEMO_PRESET, SHIPPED
    for damage in ("edited", "deleted"):
        package = root / f"demo39-{damage}" / DEMO_PRESET
        shutil.copytree(SHIPPED, package)
        summary = package / "summary.csv"
        summary.write_text(summary.read_text() + "0") if damage == "edited" else summary.unlink()
        shipped, tables_module.SHIPPED_ROOT = tables_module.SHIPPED_ROOT, package.parent
        try:
            outcome = api(lambda: tables_module.study_tables(Study(DEMO_PRESET, None, root / "demo39-study"), 3,
                                                             log=lambda line: None, train=False))
        finally:
            tables_module.SHIPPED_ROOT = shipped
        yield f"demo tables {damage} in the install", judged(outcome, "damaged" in outcome[1],
                                                             f"the install not named: {outcome[1][:80]}")

