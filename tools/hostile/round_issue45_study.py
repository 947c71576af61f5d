"""Issue 45's study round of hostile inputs (classes 4, 6, 7 and 9), none of them in an earlier
list, each judged by what it must do, not by its exit alone:

    4  runs that never learned, and comparisons of unequal runs (API, CLI, sweeps, step-0 snapshots)
    6  settings that say more than they do (unread settings, identical sweep points, the plan)
    7  undefined values half counted (a layer without a circuit in one seed, dead heads)
    9  the previous release (91a3e0b) reading today's runs, and today's reading a newer one's

A bad input must be refused in one line that names what is wrong (clear; vague when the line
does not name it; silent when accepted); a valid one must do what it says (OK; silent when it
does something else, or is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from hostile.harness import api as api_within
from hostile.harness import cli as cli_within
from hostile.harness import faults, recorder
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from headlab import load_corpus, load_run, preset, train, train_preset
from headlab.report.writer import write_report
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.layout import run_manifest
from headlab.runs.snapshots import snapshot_name
from headlab.study.claims import per_seed_metrics
from headlab.study.conclusions import distance_table, rank_table
from headlab.study.seed_distance import seed_distance
from headlab.study.study import Study, StudyRun
from headlab.study.tables import tabulate_study

NAME = "issue45_study"
ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "91a3e0b"
REPRODUCE = ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--jobs", "1"]
SWEEP = ["sweep", "--preset", "tiny", "--lengths", "0.1", "--seeds", "1", "--jobs", "1", "--only", "mha", "mqa"]


def cli(*argv) -> tuple[str, str]:
    """`hostile.harness.cli` with room for a case that trains a study on a busy machine (a hang
    is no answer within 15 minutes)."""
    return cli_within(*argv, seconds=900)


def api(make) -> tuple[str, str]:
    """`hostile.harness.api`, with the same room as `cli`."""
    return api_within(make, seconds=900)


def refused(outcome: tuple[str, str], *words: str) -> tuple[str, str]:
    """A bad input's outcome: clear when refused in one line naming every one of `words`, vague when
    the line leaves one out, silent when the input was accepted."""
    kind, detail = outcome
    if kind == "clear":
        return outcome if all(word.lower() in detail.lower() for word in words) else ("vague", detail)
    return ("silent", f"accepted: {detail}") if kind == "silent" else outcome


def accepted(outcome: tuple[str, str], holds, what: str) -> tuple[str, str]:
    """A valid input's outcome: OK when it ran and `holds()` (what it must have done, `what`)."""
    kind, detail = outcome
    if kind == "silent":
        return ("OK", what) if holds() else ("silent", f"ran, but not: {what}")
    return outcome if kind in ("traceback", "hang") else ("silent", f"a valid input was refused: {detail}")


def run(root: Path) -> list[tuple[str, str, str]]:
    results = []
    record = recorder(results, width=66)
    for cls, members in (("4", never_learned(root)), ("4", unequal_runs(root)), ("6", settings(root)),
                         ("7", undefined(root)), ("9", releases(root))):
        for name, outcome in members:
            record(f"[{cls}] {name}", outcome)
    return results


def study_runs(folder: Path, steps: int = 4, seeds: int = 1, only=("mha", "mqa"), **train_overrides):
    study = Study("tiny", steps, folder, corpus="synthetic", train_overrides=train_overrides, only=only)
    return study, study.train(seeds, progress=False, log=lambda line: None)


def tabulated(runs, folder: Path):
    return lambda: tabulate_study(runs, load_corpus("synthetic"), "tiny", folder)


def never_learned(root: Path):
    """Runs that end at their step-0 loss or at ln V: named, never compared."""
    for flags, name in ((["--set", "lr=1e-9"], "lr=1e-9"), (["--set", "lr=1e-12", "--seeds", "2"], "lr=1e-12, 2 seeds"),
                        (["--set", "warmup_steps=100000"], "warmup longer than the run"),
                        (["--steps", "1"], "one step")):
        out = root / f"still-{name.replace(' ', '').replace(',', '')}"
        outcome = refused(cli(*REPRODUCE, "--only", "mha", "mqa", *flags, "--out", out), "learned nothing")
        yield f"reproduce {name}: refused, no report", outcome if not (out / "report.md").exists() else (
            "silent", "report written")
    out = root / "clipped"  # gradients of norm 1e-12 against AdamW's eps = 1e-8: steps of 1e-4 lr, nothing learned
    yield "reproduce --set grad_clip=1e-12", refused(
        cli(*REPRODUCE, "--only", "mha", "mqa", "--set", "grad_clip=1e-12", "--out", out), "learned nothing")
    runs = [StudyRun("mha", preset("tiny", "mha"), 0, root / "api-still-mha"),
            StudyRun("mqa", preset("tiny", "mqa"), 0, root / "api-still-mqa")]
    for r in runs:
        train(r.config, train_preset("tiny", steps=4, lr=1e-12), load_corpus("synthetic"), out=r.folder,
              progress=False)
    yield "tabulate_study of train()'s lr=1e-12 runs", refused(api(tabulated(runs, root / "api-still")),
                                                             "learned nothing")
    yield "sweep --set lr=0.003,1e-12: the learning point alone", accepted(
        cli(*SWEEP, "--set", "lr=0.003,1e-12", "--out", root / "sweep-still"),
        lambda: "1e-12" not in (root / "sweep-still" / "sweep.csv").read_text(), "sweep.csv without the still point")
    yield "sweep --set lr=1e-12,1e-11 (no point learned)", refused(
        cli(*SWEEP, "--set", "lr=1e-12,1e-11", "--out", root / "sweep-all-still"), "learned nothing")
    hot = [StudyRun(role, preset("tiny", role), 0, root / f"api-lr10-{role}") for role in ("mha", "mqa")]
    for r in hot:
        train(r.config, train_preset("tiny", steps=4, lr=10.0), load_corpus("synthetic"), out=r.folder,
              progress=False)
    yield "tabulate_study of train()'s lr=10 runs", refused(api(tabulated(hot, root / "api-lr10")), "run(s) diverged")


def rehash(folder: Path, name: str) -> None:
    """List file `name`'s present content in `folder`'s manifest, as a forger would."""
    data = (folder / name).read_bytes()
    faults.edit_json(folder / "manifest.json", lambda manifest: manifest["files"].__setitem__(
        name, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}))


def swap_snapshot(source: Path, into: Path, from_step: int = 0) -> None:
    """`source`'s snapshot of `from_step` in place of `into`'s step-0 snapshot, its hash listed anew."""
    shutil.copy(source / snapshot_name(from_step), into / snapshot_name(0))
    rehash(into, snapshot_name(0))


def unequal_runs(root: Path):
    """Runs paired though they were not trained alike, and step-0 baselines that are not the run's."""
    _, four = study_runs(root / "alike", seeds=2)
    mha0, mqa0 = four[0], four[1]
    variants = {"steps": {"steps": 2}, "tokens per step": {"batch_size": 4}, "recipe (lr)": {"lr": 0.01},
                "recipe (weight_decay)": {"weight_decay": 0.0}}
    for what, change in variants.items():
        _, other = study_runs(root / f"other-{what.split()[-1].strip('()')}", change.get("steps", 4), only=("mqa",),
                              **{k: v for k, v in change.items() if k != "steps"})
        yield f"tabulate_study: MHA and an MQA of other {what}", refused(
            api(tabulated([mha0, other[0]], root / f"api-{len(what)}")), "differ in", what.split(" (")[0])
    shakespeare = Study("tiny", 4, root / "other-corpus", only=("mqa",))
    other = shakespeare.train(1, progress=False, log=lambda line: None)
    yield "tabulate_study: MHA on synthetic, MQA on Shakespeare", refused(
        api(tabulated([mha0, other[0]], root / "api-corpus")), "differ in data")
    deep = Study("tiny", 4, root / "other-depth", corpus="synthetic", model_overrides={"n_layer": 1}, only=("mqa",))
    yield "tabulate_study: MHA of 2 layers, MQA of 1", refused(
        api(tabulated([mha0, deep.train(1, progress=False, log=lambda line: None)[0]], root / "api-depth")),
        "differ in shape", "n_layer")
    yield "tabulate_study: one MHA run given twice", refused(api(tabulated([mha0, mha0, mqa0], root / "api-twice")),
                                                            "seeds")
    yield "tabulate_study: MQA without seed 1", refused(api(tabulated(four[:3], root / "api-seed")), "seeds")
    for n, (name, source, step_from) in enumerate((("another seed's", four[2].folder, 0),
                                                   ("another family's", mqa0.folder, 0),
                                                   ("its own step 1", mha0.folder, 1))):
        target = root / f"swapped-{n}"
        shutil.copytree(mha0.folder, target)
        swap_snapshot(source, target, step_from)
        yield f"tabulate_study: step-0 snapshot swapped for {name}", refused(
            api(tabulated([StudyRun("mha", mha0.config, 0, target), mqa0], root / f"api-{target.name}")),
            "is not the step-0 weights")
    yield "analyze --snapshots of a run whose step-0 snapshot was swapped", refused(
        cli("analyze", root / "swapped-0", "--snapshots", "--out", root / "snap-analysis"), "is not the step-0 weights")


def settings(root: Path):
    """Settings that would train nothing different, or that another needs, and the plan in the report."""
    for flags, words in ((["--set", "matrix_lr=0.05"], ("matrix_lr", "changes none")),
                         (["--set", "unembedding_lr=0.01"], ("unembedding_lr",)),
                         (["--set", "lrkv_factor_decay=false", "--only", "mha", "mqa"], ("lrkv_factor_decay", "lrkv")),
                         (["--set", "optimizer=muon", "--set", "lrkv_b_optimizer=muon", "--only", "mha", "mla"],
                          ("lrkv_b_optimizer",)),
                         (["--set", "arch=nanochat", "--set", "optimizer=muon", "--set", "lr=0.01", "--only", "mha",
                           "mqa"], ("lr = 0.01", "changes none")),
                         (["--set", "n_head=3", "--only", "mha", "mqa"], ("n_kv_head", "divide"))):
        out = root / f"unread-{abs(hash(str(flags))) % 10 ** 6}"
        yield f"reproduce {' '.join(flags)}", refused(cli(*REPRODUCE, *flags, "--out", out), *words)
    out = root / "heads3"
    yield "reproduce --set n_head=3 --set n_kv_head=3 --only mha mqa (trains)", accepted(
        cli(*REPRODUCE, "--set", "n_head=3", "--set", "n_kv_head=3", "--only", "mha", "mqa", "--out", out),
        lambda: (out / "report.md").exists(), "report written")
    for axis in ("device=cpu,auto", "snapshot_every=0,5", "embedding_lr=0.1,0.3", "compile=off,aot_eager"):
        yield f"sweep --set {axis}", refused(cli(*SWEEP, "--set", axis, "--out", root / f"same-{axis[:6]}"),
                                             axis.split("=")[0])
    yield "train --compile ''", refused(cli("train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "1",
                                            "--compile", "", "--out", root / "compile-empty"), "compile")
    out = root / "qk-adamw"
    yield "reproduce --set optimizer=muon --set muon_qk=false --only mha mla: MLA's latents shown on Muon", accepted(
        cli(*REPRODUCE, "--set", "optimizer=muon", "--set", "muon_qk=false", "--only", "mha", "mla", "--out", out),
        lambda: "| Muon | 0.02 (matrix_lr) | 0.1 (weight_decay) | attn.wkv_a, attn.wkv_b" in (
            out / "report.md").read_text() and "W_Q, W_K" not in (out / "report.md").read_text(),
        "the plan's MLA row on Muon, no study-wide W_Q, W_K")
    runs = [StudyRun(role, preset("tiny", role), 0, root / f"api-matrix-{role}") for role in ("mha", "mqa")]
    for r in runs:
        train(r.config, train_preset("tiny", steps=4, matrix_lr=0.05), load_corpus("synthetic"), out=r.folder,
              progress=False)
    folder = root / "api-matrix"
    yield "report of train()'s runs with matrix_lr=0.05 under AdamW", accepted(
        api(lambda: write_report(tabulated(runs, folder)(), folder)),
        lambda: "read by none of these runs (nothing trained differs for it): `matrix_lr = 0.05`" in (
            folder / "report.md").read_text() and "Changed from the preset" not in (folder / "report.md").read_text(),
        "matrix_lr named as read by no run, not as changed")


def kill_layer(run: Path, layer: int) -> None:
    """Zero the query matrix of `layer` in a run's current weights (no circuit there), their hash
    listed anew, as a forger would."""
    name = f"{current_checkpoint(run).folder.name}/model.safetensors"
    with safe_open(str(run / name), framework="pt") as weights:
        metadata = weights.metadata()
    tensors = load_file(str(run / name))
    tensors[f"blocks.{layer}.attn.c_q.weight"].zero_()
    save_file(tensors, str(run / name), metadata=metadata)
    rehash(run, name)


def undefined(root: Path):
    """A layer without a circuit in one seed's run, and a dead head: counted, named, drawn apart."""
    study, runs = study_runs(root / "dead", seeds=2)
    for r in runs:
        if r.seed == 1 and r.role == "mqa":
            kill_layer(r.folder, 1)
    tables = api(lambda: write_report(tabulated(runs, study.folder)(), study.folder))
    report = (study.folder / "report.md").read_text() if (study.folder / "report.md").exists() else ""
    yield "report of a study whose MQA seed 1 has no circuit at layer 1", accepted(
        tables, lambda: not re.search(r"\bnan\b", report) and "1 undefined" in report,
        "no nan in the report, the undefined seed counted")
    from headlab.study.table_files import read_study_tables
    read = read_study_tables(study.folder)
    metrics = per_seed_metrics(read["summary"], read["training"])
    ranks = rank_table(read["summary"], metrics)
    yield "rank table (notebook 03) names layer 1 of MQA", accepted(
        ("silent", ""), lambda: "layer 1 in 1 of 2 seeds" in ranks[ranks["role"] == "mqa"].iloc[0]["uncentered % of H"],
        "the layer named")
    distances = seed_distance(read["spectra"], read["init_spectra"], {"Early": 0, "Late": 1}, "included")
    rows = distance_table(distances)
    yield "seed distance of MQA's late layer keeps seed 0", accepted(
        ("silent", ""), lambda: not rows.astype(str).apply(lambda c: c.str.contains("nan")).any().any(),
        "no nan in the seed-distance table")
    from headlab.report import plots
    similarity = read["similarity"]
    one = similarity[(similarity["seed"] == 1) & (similarity["role"] == "mqa") & (similarity["circuit"] == "qk")
                     & (similarity["mla_rope"] == "included")].drop(columns=["seed", "mla_rope"])
    figure = api(lambda: plots.similarity_heatmaps(one, layer=1))
    yield "heatmap of MQA seed 1 layer 1 (every head dead)", accepted(
        figure, lambda: plots.similarity_heatmaps(one, layer=1).legends != [], "a legend names the dead heads")


def releases(root: Path):
    """The previous release reading runs written today, and today reading a newer release's."""
    archive = subprocess.run(["git", "archive", PREVIOUS_RELEASE, "headlab"], cwd=ROOT, capture_output=True)
    if archive.returncode:
        return
    release = root / "release-91a3e0b"
    release.mkdir(exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(release)], input=archive.stdout, check=True)

    def then(*argv) -> tuple[int, str]:
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=release, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(release)})
        return done.returncode, (done.stderr.strip().splitlines() or [""])[-1]

    read = ["-c", "import sys; from headlab import load_run; r = load_run(sys.argv[1]); print(r.step)"]
    corpus = load_corpus("synthetic")
    short = dict(steps=2, eval_every=2, checkpoint_every=2)
    for name, model, training in (("default", preset("tiny", "gqa"), train_preset("tiny", **short)),
                                  ("muon", preset("tiny", "lrkv"), train_preset("tiny", optimizer="muon", **short))):
        folder = root / f"today-{name}"
        train(model, training, corpus, out=folder, progress=False)
        status, said = then(*read, str(folder))
        yield f"previous release reads today's {name} run", ("OK", "read") if status == 0 else ("silent", said)
    status, said = then("-m", "headlab", "analyze", str(root / "today-default"), "--out", str(root / "old-analysis"))
    yield "previous release: headlab analyze of today's run", ("OK", "analysed") if status == 0 else ("silent", said)
    for name, model, training, field in (
            ("muon_qk False", preset("tiny", "mha"), train_preset("tiny", optimizer="muon", muon_qk=False, **short),
             "muon_qk"),
            ("checkpoint_minutes 5", preset("tiny", "mha"), train_preset("tiny", checkpoint_minutes=5.0, **short),
             "checkpoint_minutes"),
            ("compile aot_eager", preset("tiny", "mha"), train_preset("tiny", compile="aot_eager", **short),
             "compile")):
        folder = root / f"today-{field}"
        train(model, training, corpus, out=folder, progress=False)
        status, said = then(*read, str(folder))
        yield f"previous release on a run with {name}", ("clear", said) if status and field in said else (
            ("silent", "read as another recipe") if status == 0 else ("vague", said))
    for section, field in (("model", "window"), ("train", "ema_decay")):
        folder = root / f"newer-{section}"
        shutil.copytree(root / "today-default", folder)
        manifest = run_manifest(folder)
        payload = json.loads(manifest.read_bytes("config.json"))
        payload[section][field] = 1
        manifest.write_bytes("config.json", json.dumps(payload).encode())
        manifest.save()
        yield f"load a run a newer headlab wrote ({section}.{field})", refused(
            api(lambda: load_run(folder)), "newer headlab", field)
    yield "analyze a run a newer headlab wrote (model.window)", refused(
        cli("analyze", root / "newer-model", "--out", root / "newer-model-out"), "newer headlab", "window")
