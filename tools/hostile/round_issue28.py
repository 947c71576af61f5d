"""Issue 28's round of hostile inputs: confinement, writes outside the writer, a failed
rewrite, identity and reuse, the sweep's grid, unbounded inputs, error paths; each class a
generator of members (tests/faults.py inflicts the faults)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hostile.harness import TINY, api, cli, copy_of, faults, finished_run, recorder, untouched

from headlab import load_corpus, preset, train
from headlab.analysis.similarity import Analysis
from headlab.runs.checkpoints import current_checkpoint

NAME = "issue28"


def run(root: Path) -> list[tuple[str, str, str]]:
    """Issue 28's classes, each a generator of members (tests/faults.py inflicts the faults)."""
    results = []
    record, corpus, finished = recorder(results), load_corpus("synthetic"), finished_run(root)
    outside = root / "outside"  # what no case may touch (the first round made it already)
    if not outside.exists():
        outside.mkdir()
        (outside / "victim.txt").write_text("not headlab's")

    def copy_of_finished(name: str) -> Path:
        return copy_of(root, finished, name)

    from headlab.report.writer import write_report
    from headlab.study.study import Study
    from headlab.study.tables import tabulate_study
    study = Study("tiny", 2, root / "study28", corpus="synthetic", only=("mha", "mla"))
    write_report(tabulate_study(study.train(seeds=1, progress=False, log=lambda m: None), study.load_corpus(), "tiny",
                                study.folder), study.folder)
    user = root / "user28"
    user.mkdir()
    (user / "headline.md").write_text("the user's own headline")
    (user / "photo.png").write_bytes(b"the user's photo")
    for members in (confinement(root, corpus, copy_of_finished), writes_outside_the_writer(root, study.folder, user),
                    failed_rewrite(root, copy_of_finished), identity_and_reuse(root, study.folder),
                    sweep_grid(root), unbounded_inputs(root), error_paths(root)):
        for name, outcome in members:
            record(name, outcome)
    return results


NOT_STRICTLY_BELOW = (".", "./", "", "x/..", "a//b", "./config.json", "..", "../outside/victim.txt", "/etc/hostname")


def confinement(root: Path, corpus, copy_of_finished):
    """Every name that is not a regular file strictly below the folder, in every listed field of
    a run's manifest, and the current checkpoint named for deletion: nothing outside, no user's
    file and no current weights are touched."""
    for field in ("discard", "files"):
        for name in (*NOT_STRICTLY_BELOW, "checkpoint-00000008/.", "checkpoint-00000008"):
            folder = copy_of_finished(f"strict-{field}-{abs(hash(name)) % 10 ** 6}")
            kept = current_checkpoint(folder).folder
            faults.list_in_manifest(folder, field, name)
            (folder / "notes.md").write_text("the user's notes beside the run's files")
            yield (f"train --resume, manifest {field} {name!r}",
                   untouched(lambda: api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=True,
                                                       progress=False)), root / "outside", folder / "notes.md", kept))


def writes_outside_the_writer(root: Path, study: Path, user: Path):
    """Every file kind `report` and `docs` write (figure, report, docs) where a link to a user's
    file or folder, or a user's own file, stands: written around, never through or over."""
    yield "docs --out <a user's folder with headline.md>", untouched(lambda: cli("docs", study, "--out", user), user)
    for what in ("figures", "figures/spectra_uncentered.png", "report.md", "headline.md"):
        target, saved = study / what, root / f"saved28-{what.replace('/', '_')}"
        if os.path.lexists(target):
            shutil.move(target, saved)
        faults.link(target, user if what == "figures" else user / "photo.png")
        outcome = untouched(lambda: cli("report", study), user)
        if outcome[0] == "silent" and not target.is_symlink():
            outcome = ("clear", "the link was replaced, not written through")
        yield f"report with {what} a link to a user's file", outcome
        faults.remove(target) if target.is_symlink() else None
        if saved.exists() and not target.exists():
            shutil.move(saved, target)


def failed_rewrite(root: Path, copy_of_finished):
    """A rewrite that fails at its nth table (a full disk) keeps the earlier version loadable."""
    import pandas as pd
    analysis = root / "analysis28"
    cli("analyze", copy_of_finished("analysis28-source"), "--out", analysis)
    good = Analysis.load(analysis).summary
    for nth in (1, 3, 5):
        with faults.failing_call(pd.DataFrame, "to_csv", nth):
            outcome = cli("analyze", root / "analysis28-source", "--out", analysis, "--circuit", "both")
        try:
            kept = Analysis.load(analysis).summary.equals(good)
        except ValueError as error:
            kept, outcome = False, ("lost", str(error)[:200])
        yield f"analyze rewrite, full disk at table {nth}", outcome if kept else ("lost", outcome[1])


def identity_and_reuse(root: Path, study: Path):
    """Sources that share a base name are distinct models (or refused); a study.json stating what
    its tables are not (another preset or shape, other seeds) is never reported."""
    for a, b in (("e3a/run", "e3b/run"), ("x/y/run", "z/y/run")):
        for part in (a, b):
            shutil.copytree(root / "analysis28-source", root / "same28" / part)
        out_ = root / f"same28-{a.replace('/', '_')}"
        outcome = cli("analyze", root / "same28" / a, root / "same28" / b, "--out", out_)
        if outcome[0] == "silent":
            outcome = ("clear", "two models") if Analysis.load(out_).summary["model"].nunique() == 2 else (
                "silent", "one model")
        yield f"analyze {a} {b}", outcome
    for edit in ({"preset": "paper-6.3b"}, {"preset": "cpu-small", "n_layer": 4, "n_head": 6, "d_model": 128},
                 {"seeds": [0, 1, 2], "n_runs": 6}, {"preset": None}):
        edited = root / f"meta28-{abs(hash(str(edit))) % 10 ** 6}"
        shutil.copytree(study, edited, symlinks=True)
        faults.edit_study_meta(edited, **edit)
        outcome = cli("report", edited)
        if outcome[0] == "silent" and str(edit.get("preset")) in (edited / "report.md").read_text():
            outcome = ("silent", f"the report states {edit}")
        yield f"report after study.json edited to {edit}", outcome


def sweep_grid(root: Path):
    """Grids that are not what they say: lengths that round to one step count, duplicates,
    values that map to one folder, a depth overridden by --set, lengths too long to train."""
    base = ["sweep", "--preset", "tiny", "--seeds", "1", "--only", "mha", "mla", "--out", root / "sweep28"]
    for flags in (["--lengths", "0.001", "0.01"], ["--lengths", "1", "1"], ["--lengths", "0.5", "0.50001"],
                  ["--depths", "2", "--set", "n_layer=1,2"], ["--set", "rope_base=100000,100000.4"],
                  ["--lengths", "1e9"], ["--set", "lr=0.003,0.003"]):
        yield f"sweep {' '.join(flags)}", cli(*base, *flags, "--jobs", "1")


def unbounded_inputs(root: Path):
    """Counts so large that planning or training them would run for ever: refused at once."""
    for flag, value in (("--tokens", 2 ** 62), ("--steps", 2 ** 40), ("--jobs", 9664), ("--tokens", 10 ** 30)):
        for plan in (["--plan"], []):
            yield (f"reproduce {flag} {value} {' '.join(plan)}",
                   cli("reproduce", "--preset", "tiny", "--out", root / "unbounded28", flag, value, *plan))


def error_paths(root: Path):
    """Every way a document corpus can be damaged or odd: one line, status 2."""
    import gzip
    documents = "".join(json.dumps({"text": f"document {i} " + "word " * 60}) + "\n" for i in range(30)).encode()
    corpora = {"truncated.jsonl.gz": gzip.compress(documents)[:-40], "gzip.jsonl.zst": gzip.compress(documents),
               "latin1.jsonl": documents.replace(b"document 7 ", b"document 7 \xe9", 1),
               "number.jsonl": documents + b'{"text": 5}\n', "null.jsonl": b'{"text": null}\n' + documents,
               "list.jsonl": b'{"text": ["a"]}\n' + documents, "three.jsonl": documents[:300],
               "not-json.jsonl": documents + b"{oops\n", "empty.jsonl.gz": gzip.compress(b"")}
    for name, data in corpora.items():
        (root / name).write_bytes(data)
        yield f"train --corpus {name}", cli("train", "--preset", "tiny", "--corpus", root / name, "--steps", "1",
                                            "--no-progress")

