"""Sequences of CLI commands (train, resume, analyze, report, docs) and hostile edits (manifest
fields, links, truncations, a user's files) on the tiny preset, each command judged by the
tree-diff checker (`treediff.check`): nothing headlab did not write changes, nothing good is lost
unless a verified version replaces it, every error is one line with status 2 (or 130).
Derandomized (a fixed sequence of examples) when the CI environment variable is set, exploring
otherwise (the profiles of tests/conftest.py)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from headlab import train_preset
from headlab.data import sources
from headlab.report.writer import write_report
from headlab.study.study import Study
from headlab.study.tables import tabulate_study
from treediff import Tree, check, run_cli

TINY = train_preset("tiny", steps=4, batch_size=4, eval_every=2, eval_batches=1, checkpoint_every=2, log_every=1)
TRAIN = ["train", "--preset", "tiny", "--corpus", "synthetic", "--batch-size", "4", "--eval-every", "2",
         "--checkpoint-every", "2", "--log-every", "1", "--no-progress"]
# Each example trains and analyses tiny runs: a sixth of the profile's examples (tests/conftest.py: 3 in CI).
EXAMPLES = settings(max_examples=max(1, settings.default.max_examples // 6),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """A finished tiny run (trained as `TRAIN` trains it) and a two-variant study with its report."""
    root = tmp_path_factory.mktemp("templates")
    os.environ[sources.CACHE_ENV] = str(root / "cache")
    try:
        status, err = run_cli([*TRAIN, "--steps", "4", "--out", root / "run"])
        assert status == 0, err
        study = Study("tiny", 4, root / "study", corpus="synthetic", only=("mha", "mla"))
        runs = study.train(seeds=1, progress=False, log=lambda m: None)
        write_report(tabulate_study(runs, study.load_corpus(), "tiny", study.folder), study.folder)
    finally:
        del os.environ[sources.CACHE_ENV]
    return root


HOSTILE_NAMES = st.sampled_from([".", "./", "..", "", "../outside.txt", "notes.md", "figures", "runs",
                                 "checkpoint-00000004", "/etc/passwd", "a//b", "report.md"])


class Disk(RuleBasedStateMachine):
    """One scratch root: box/run, box/study, box/analysis, box/docs, and user files around them."""
    templates: Path

    @initialize()
    def scratch(self):
        self.root = Path(self.templates).parent / f"scratch-{os.getpid()}-{id(self)}"
        shutil.rmtree(self.root, ignore_errors=True)
        box = self.root / "box"
        box.mkdir(parents=True)
        for name in ("run", "study"):
            shutil.copytree(self.templates / name, box / name, symlinks=True)
        (self.root / "outside.txt").write_text("a user's file beside the box")
        (box / "notes.md").write_text("a user's notes")
        (box / "study" / "notes.md").write_text("a user's notes inside the study")
        self.box = box

    def command(self, argv):
        before = Tree.read(self.root)
        status, err = run_cli(argv)
        broken = check(before, Tree.read(self.root), status, err)
        assert not broken, (argv, broken)

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

    # ---- hostile edits (they are the user's: not judged) ----
    @rule(folder=st.sampled_from(["run", "study", "analysis", "docs"]), field=st.sampled_from(["discard", "files"]),
          name=HOSTILE_NAMES)
    def edit_manifest(self, folder, field, name):
        manifests = [p for p in (self.box / folder).glob("*.json") if p.name in ("manifest.json", "study.json",
                                                                                 "analysis.json", "docs.json")]
        if not manifests or manifests[0].is_symlink():
            return
        payload = json.loads(manifests[0].read_text())
        if field == "discard":
            payload["discard"].append(name)
        else:
            payload["files"][name] = {"bytes": 1, "sha256": "0" * 64}
        manifests[0].write_text(json.dumps(payload))

    @rule(where=st.sampled_from(["study/figures", "docs", "analysis", "study/report.md", "run/config.json"]))
    def link_to_the_user(self, where):
        path = self.box / where
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(self.root / "outside.txt" if path.suffix else self.root)

    @rule(where=st.sampled_from(["study/summary.csv", "study/figures/loss_curves.png", "run/metrics.jsonl",
                                  "study/study.json", "analysis/summary.csv"]), keep=st.sampled_from([0, 10, 100]))
    def truncate(self, where, keep):
        path = self.box / where
        if path.is_file() and not path.is_symlink():
            path.write_bytes(path.read_bytes()[:keep])

    @rule(where=st.sampled_from(["docs/headline.md", "analysis/similarity.csv", "study/figures/sweep.png"]))
    def users_file_where_headlab_writes(self, where):
        path = self.box / where
        if not path.exists() and not path.is_symlink() and path.parent.is_dir() and not path.parent.is_symlink():
            path.write_text("the user's own")

    def teardown(self):
        shutil.rmtree(getattr(self, "root", Path("/nonexistent")), ignore_errors=True)


def test_no_sequence_of_commands_and_hostile_edits_loses_or_leaks_anything(templates, monkeypatch):
    monkeypatch.setenv(sources.CACHE_ENV, str(templates / "cache"))
    Disk.templates = templates
    run_state_machine_as_test(Disk, settings=EXAMPLES)
