"""A study compares only runs that learned something and were trained alike (issue 45, class 4):
runs that ended at the uniform guess (lr = 1e-12) are named and refused, as diverged ones are,
through the API, the CLI and a sweep (which leaves the point out); runs of other steps are never
paired; a step-0 snapshot swapped for another seed's, its hash listed anew, is not taken as the
random-initialisation baseline: the run's own draw is made again and compared."""

from __future__ import annotations

import shutil

import pytest

from headlab.analysis.snapshots import snapshot_heads
from headlab.cli.main import main
from headlab.model.config import preset
from headlab.runs.snapshots import snapshot_name
from headlab.study.comparable import UnlearnedRuns
from headlab.study.study import Study, StudyRun
from headlab.study.tables import analyze_study, init_tables, tabulate_study
from headlab.training.config import train_preset
from headlab.training.trainer import train
from shared_fixtures import forge_manifest_entry

pytestmark = pytest.mark.xdist_group("comparable_runs")  # the module's fixture trains runs: made once (conftest)
ONLY = ("mha", "mqa")


def trained(folder, steps: int = 4, seeds: int = 1, **train_overrides):
    study = Study("tiny", steps, folder, corpus="synthetic", train_overrides=train_overrides, only=ONLY)
    return study, study.train(seeds, progress=False, log=lambda line: None)


@pytest.fixture(scope="module")
def alike(tmp_path_factory):
    """A tiny study of MHA and MQA, 4 steps, seeds 0 and 1 (snapshots at step 0 kept)."""
    return trained(tmp_path_factory.mktemp("alike") / "study", seeds=2)


def test_runs_that_learned_nothing_are_named_and_never_compared(tmp_path, capsys):
    """lr = 1e-12: every run ends at its step-0 loss, a uniform guess; the report gave verdicts."""
    study, runs = trained(tmp_path / "still", lr=1e-12)
    with pytest.raises(UnlearnedRuns, match=r"2 run\(s\) learned nothing") as refused:
        tabulate_study(runs, study.load_corpus(), "tiny", study.folder)
    assert {folder.name for folder in refused.value.runs} == {r.folder.name for r in runs}
    assert "ln 256 = 5.545" in str(refused.value) and not (study.folder / "summary.csv").exists()
    argv = ["reproduce", "--preset", "tiny", "--steps", "4", "--seeds", "1", "--corpus", "synthetic", "--jobs", "1",
            "--only", *ONLY, "--set", "lr=1e-12", "--out", str(study.folder)]
    assert main(argv) == 2  # the runs are reused, and refused again, in one line
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "learned nothing" in said[0] and not (study.folder / "report.md").exists()


def test_a_sweep_leaves_out_a_point_that_learned_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", "tiny", "--lengths", "0.1", "--seeds", "1", "--only", *ONLY, "--jobs", "1",
                 "--set", "lr=0.003,1e-12", "--out", str(out)]) == 0
    assert "1 of 2 grid point(s) learned nothing (x0.1-lr1e-12): left out" in capsys.readouterr().out
    assert "lr1e-12" not in (out / "sweep.csv").read_text()


def test_runs_of_other_steps_or_seeds_are_refused_naming_how_they_differ(alike, tmp_path):
    study, runs = alike
    _, short = trained(tmp_path / "short", steps=2)
    mha = [r for r in runs if r.role == "mha" and r.seed == 0]
    mqa = [r for r in short if r.role == "mqa"]
    with pytest.raises(ValueError, match=r"differ in steps \(2 against 4\)"):
        analyze_study(mha + mqa, study.load_corpus(), "tiny")
    with pytest.raises(ValueError, match=r"role mha has the runs of seeds \[0\], the study's roles those of seeds"):
        analyze_study([r for r in runs if not (r.role == "mha" and r.seed == 1)], study.load_corpus(), "tiny")


def test_an_unfinished_run_is_named_and_never_compared(alike, tmp_path):
    """An MQA run of 4 steps stopped after its step-2 checkpoint (what a kill leaves): refused,
    naming it and how far it got, even where every other run stopped there too."""
    study, runs = alike

    class Stopped(Exception):
        pass

    def stop_at_step_3(model, step):
        if step == 3:
            raise Stopped

    mqa = StudyRun("mqa", preset("tiny", "mqa"), 0, tmp_path / "mqa-0")
    with pytest.raises(Stopped):
        train(mqa.config, train_preset("tiny", steps=4, checkpoint_every=2, snapshot_every=1), "synthetic",
              out=mqa.folder, progress=False, observe=stop_at_step_3)
    mha = [r for r in runs if r.role == "mha" and r.seed == 0]
    with pytest.raises(ValueError, match=r"run .*mqa-0 stopped at step 2 of its 4: an unfinished run is not compared"):
        analyze_study(mha + [mqa], study.load_corpus(), "tiny")


def test_a_swapped_step0_snapshot_is_not_taken_for_the_baseline(alike, tmp_path):
    study, runs = alike
    seed0, seed1 = (next(r for r in runs if r.role == "mha" and r.seed == seed) for seed in (0, 1))
    assert snapshot_heads(seed0.folder, 0) is not None  # the run's own snapshot is its draw: read
    swapped = seed0.__class__(seed0.role, seed0.config, 0, tmp_path / "swapped")
    shutil.copytree(seed0.folder, swapped.folder)
    shutil.copy(seed1.folder / snapshot_name(0), swapped.folder / snapshot_name(0))
    forge_manifest_entry(swapped.folder, snapshot_name(0))  # its hash listed anew: the manifest vouches for it
    for read in (lambda: snapshot_heads(swapped.folder, 0), lambda: init_tables([swapped])):
        with pytest.raises(ValueError, match="is not the step-0 weights of the run .* seed 0 draw other weights"):
            read()
