"""Nothing is lost, one test per way it was: names read from a manifest reach only files strictly below the
folder that headlab wrote; every byte of a figure, report or docs page goes through one atomic,
owned, no-follow write; a failed rewrite keeps the good version."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

import treediff
from headlab import load_corpus, preset, train
from headlab.analysis.similarity import Analysis
from headlab.cli.main import main
from headlab.data import sources
from headlab.io import LOCK, ScratchFolder, make_folder
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.layout import MANIFEST
from headlab.study.study import Study
from headlab.study.table_files import MANIFEST as STUDY_MANIFEST
from headlab.study.table_files import read_study_tables
from headlab.training.runs import load_run
from shared_fixtures import TINY_CORPUS, TINY_STUDY, TINY_TRAINING

# what the commands do to files is judged here, not what their figures show (tests/stand_in_figures.py)
pytestmark = pytest.mark.usefixtures("figures_saved_as_stand_ins")

TINY = TINY_TRAINING
RESUME = ["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--batch-size", "4",
          "--eval-every", "2", "--checkpoint-every", "2", "--log-every", "1", "--no-progress", "--resume"]


@pytest.fixture(autouse=True)
def isolated_cache(own_cache):
    return own_cache


REPRODUCE = TINY_STUDY  # what wrote `tiny_study`: into a copy of it, its runs are reused


@pytest.fixture
def study(tmp_path, tiny_study):
    """A finished tiny study (one seed, few steps) with its tables and report, copied for this test."""
    folder = tmp_path / "scratch" / "study"
    shutil.copytree(tiny_study, folder, symlinks=True)
    return folder


def snapshot(root: Path) -> dict[str, str]:
    """`treediff.snapshot` but for locks (a lock's text names its latest holder: not content)."""
    return treediff.snapshot(root, skip=lambda path: path.name == LOCK)


def refused_in_one_line(capsys, argv) -> str:
    status = main([str(a) for a in argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("headlab: error: "), (status, lines)
    return lines[0]


def edit_manifest(path: Path, change) -> None:
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))


# ---- confinement: the folder itself, its parent, the current checkpoint, a user's file ----------

@pytest.mark.parametrize("name", [".", "./", "", "figures/.", "figures//report.md", "figures/..", "./report.md"])
def test_a_discard_entry_that_is_not_a_file_strictly_below_is_refused_and_nothing_is_deleted(study, capsys, name):
    (study / "notes.md").write_text("the user's own notes")
    edit_manifest(study / STUDY_MANIFEST, lambda m: m["discard"].append(name))
    before = snapshot(study.parent)
    assert "strictly below" in refused_in_one_line(capsys, ["report", study])
    assert snapshot(study.parent) == before


def test_a_discard_entry_naming_a_users_file_or_a_listed_file_deletes_neither(study, capsys):
    (study / "notes.md").write_text("the user's own notes")
    edit_manifest(study / STUDY_MANIFEST, lambda m: m["discard"].extend(["notes.md", "summary.csv", "runs"]))
    assert main([*REPRODUCE, "--out", str(study)]) == 0
    assert (study / "notes.md").read_text() == "the user's own notes"
    assert (study / "summary.csv").is_file() and any((study / "runs").iterdir())
    read_study_tables(study)  # the tables still verify (what `report` reads before it draws)


@pytest.fixture
def finished_run(tmp_path, tiny_run):
    """A finished tiny run of its own (a copy of `tiny_run`, trained as `TINY` on `TINY_CORPUS`)."""
    return shutil.copytree(tiny_run, tmp_path / "box" / "run", symlinks=True)


def test_a_files_key_of_dot_is_refused_before_anything_in_the_parent_is_touched(finished_run, capsys):
    (finished_run.parent / ".run.0123abcd.tmp").write_text("a user's file beside the run")
    edit_manifest(finished_run / MANIFEST, lambda m: m["files"].update({".": {"bytes": 1, "sha256": "0" * 64}}))
    before = snapshot(finished_run.parent)
    assert "strictly below" in refused_in_one_line(capsys, [*RESUME, "--out", finished_run])
    assert snapshot(finished_run.parent) == before


def test_a_discard_entry_naming_the_current_checkpoint_keeps_the_weights(finished_run, capsys):
    checkpoint = current_checkpoint(finished_run)
    edit_manifest(finished_run / MANIFEST, lambda m: m["discard"].append(checkpoint.name))
    train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS), out=finished_run, resume=True,
          progress=False)  # nothing left to train: the run is opened, cleaned and closed
    assert current_checkpoint(finished_run).name == checkpoint.name
    assert load_run(finished_run).step == TINY.steps  # weights and state still verify


def test_a_discard_entry_naming_a_users_empty_folder_keeps_it(finished_run):
    """Only a folder headlab made is removed once empty: a discard entry hand-edited to name the
    user's empty folder leaves it (the superseded checkpoints' folders are gone all the same)."""
    (finished_run / "my-empty-folder").mkdir()
    edit_manifest(finished_run / MANIFEST, lambda m: m["discard"].append("my-empty-folder"))
    train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS), out=finished_run, resume=True,
          progress=False)
    assert (finished_run / "my-empty-folder").is_dir()
    assert [p.name for p in finished_run.glob("checkpoint-*")] == [current_checkpoint(finished_run).name]


# ---- figures, report.md and docs: atomic, owned, never through a link -----------------------

def test_docs_into_a_folder_holding_the_users_headline_is_refused_and_keeps_it(study, tmp_path, capsys):
    docs = tmp_path / "scratch" / "docs"
    docs.mkdir()
    (docs / "headline.md").write_text("my own headline")
    refused_in_one_line(capsys, ["docs", study, "--out", docs])
    assert snapshot(docs) == {"headline.md": hashlib.sha256(b"my own headline").hexdigest()}


def test_docs_rewrites_its_own_folder_but_refuses_a_file_it_did_not_write_there(study, tmp_path, capsys,
                                                                               monkeypatch):
    """A listed name licenses nothing: the file there is replaced only while its bytes are the ones recorded.
    It is refused before anything is drawn or replaced (headline.md is written after the figures)."""
    docs = tmp_path / "scratch" / "docs"
    assert main(["docs", str(study), "--out", str(docs)]) == 0
    assert main(["docs", str(study), "--out", str(docs)]) == 0
    (docs / "headline.md").unlink()
    (docs / "headline.md").write_text("mine now")
    before, drawn = snapshot(docs), []
    with monkeypatch.context() as patch:
        patch.setattr(Figure, "savefig", lambda *args, **kwargs: drawn.append(args))
        assert "was changed since headlab wrote it" in refused_in_one_line(capsys, ["docs", study, "--out", docs])
    assert drawn == [] and snapshot(docs) == before
    assert (docs / "headline.md").read_text() == "mine now"
    edit_manifest(docs / "docs.json", lambda m: m["files"].pop("headline.md"))
    (docs / "headline.md").write_text("mine, and no longer listed")
    refused_in_one_line(capsys, ["docs", study, "--out", docs])
    assert (docs / "headline.md").read_text() == "mine, and no longer listed"


def test_a_figures_link_to_a_user_folder_is_never_followed(study, tmp_path, capsys):
    user = tmp_path / "scratch" / "holiday-photos"
    user.mkdir()
    (user / "beach.png").write_bytes(b"not a figure")
    shutil.rmtree(study / "figures")
    (study / "figures").symlink_to(user)
    before = snapshot(tmp_path / "scratch")
    refused_in_one_line(capsys, ["report", study])
    after = snapshot(tmp_path / "scratch")
    assert {k: v for k, v in after.items() if not k.startswith("study/")} == \
        {k: v for k, v in before.items() if not k.startswith("study/")}


def test_a_listed_figure_replaced_by_a_link_is_neither_replaced_nor_written_through(study, tmp_path, capsys,
                                                                                    monkeypatch):
    outside = tmp_path / "scratch" / "outside.png"
    outside.write_bytes(b"a file outside the study")
    figure = study / "figures" / "spectra_uncentered.png"
    figure.unlink()
    figure.symlink_to(outside)
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda *args, **kwargs: drawn.append(args))
    assert "is not the file headlab wrote" in refused_in_one_line(capsys, ["report", study])
    assert drawn == []  # refused before any figure is drawn
    assert outside.read_bytes() == b"a file outside the study"
    assert figure.is_symlink() and figure.resolve() == outside


def test_the_stand_in_figures_end_with_the_tests_own_patches(monkeypatch):
    """This module's tests patch `Figure.savefig` over the stand-in (tests/stand_in_figures.py),
    with a `monkeypatch` that an autouse fixture may have set up before it: undoing the test's
    patches must give back matplotlib's own savefig, not leave a stand-in to the tests that follow."""
    monkeypatch.setattr(Figure, "savefig", lambda *args, **kwargs: None)
    monkeypatch.undo()
    assert Figure.savefig.__module__ == "matplotlib.figure"


@pytest.mark.parametrize("options, failing", [([], "png"), (["--svg"], "svg")])
def test_a_figure_write_that_fails_midway_keeps_the_previous_figures_and_report(study, capsys, monkeypatch, options,
                                                                                failing):
    before = snapshot(study)
    original = Figure.savefig

    def cut_short(self, target, *args, **kwargs):
        original(self, target, *args, **kwargs)
        if str(kwargs.get("format", target)).endswith(failing):
            (target if hasattr(target, "truncate") else open(target, "r+b")).truncate(100)
            raise OSError(27, "File too large")
    monkeypatch.setattr(Figure, "savefig", cut_short)
    refused_in_one_line(capsys, ["report", study, *options])
    assert snapshot(study) == before


# ---- a failed rewrite keeps the good version -------------------------------------------------

def test_an_analysis_rewrite_that_fails_midway_leaves_the_earlier_one_loadable(finished_run, tmp_path, capsys,
                                                                               monkeypatch):
    out = tmp_path / "analysis"
    assert main(["analyze", str(finished_run), "--out", str(out)]) == 0
    capsys.readouterr()
    good = Analysis.load(out)
    calls = []
    original = pd.DataFrame.to_csv

    def fail_on_third(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return original(self, *args, **kwargs)
    monkeypatch.setattr(pd.DataFrame, "to_csv", fail_on_third)
    refused_in_one_line(capsys, ["analyze", finished_run, "--out", out, "--circuit", "both"])
    monkeypatch.undo()
    again = Analysis.load(out)
    pd.testing.assert_frame_equal(again.summary, good.summary)


# ---- silent wrongs in identity and reuse ------------------------------------------------------

def test_two_runs_with_one_base_name_are_two_models(finished_run, tmp_path, capsys):
    for seed in ("e3a", "e3b"):
        shutil.copytree(finished_run, tmp_path / seed / "run")
    assert main(["analyze", str(tmp_path / "e3a" / "run"), str(tmp_path / "e3b" / "run"),
                 "--out", str(tmp_path / "analysis")]) == 0
    assert sorted(Analysis.load(tmp_path / "analysis").summary["model"].unique()) == \
        ["Standard MHA [e3a/run]", "Standard MHA [e3b/run]"]
    refused_in_one_line(capsys, ["analyze", finished_run, finished_run, "--out", tmp_path / "again"])
    refused_in_one_line(capsys, ["analyze", tmp_path / "e3a" / "run", tmp_path / "e3b" / "run", "--label", "A",
                                 "--label", "A", "--out", tmp_path / "again"])


def test_study_tables_are_not_reused_for_other_roles(study):
    """The study's tables are of MHA and MLA: a study of MHA alone (a subset of those roles) gets its own."""
    from headlab.study.tables import study_tables
    tables = study_tables(Study("tiny", 4, study, corpus="synthetic", only=("mha",)), seeds=1, log=lambda m: None)
    assert list(tables["summary"]["model"].unique()) == ["Standard MHA"]


def test_a_corpus_edited_with_its_size_and_time_kept_is_tokenized_again(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    stat = text.stat()
    first = load_corpus(str(text))
    text.write_text("THE quick brown fox jumps over the lazy dog. "
                    + "the quick brown fox jumps over the lazy dog. " * 199)
    os.utime(text, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what `cp -p` and `rsync -a` keep
    assert text.stat().st_size == stat.st_size
    assert load_corpus(str(text)).sha256 != first.sha256


def test_a_folder_mixing_text_and_document_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("plain text the documents would hide " * 100)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(20)))
    with pytest.raises(ValueError, match="both document files"):
        load_corpus(str(tmp_path))


# ---- unbounded inputs ------------------------------------------------------------------------

def test_a_token_budget_of_years_is_refused_at_once(capsys):
    assert "more than the" in refused_in_one_line(capsys, ["reproduce", "--preset", "tiny", "--tokens",
                                                           "4611686018427387904", "--plan"])


@pytest.mark.parametrize("plan", [["--plan"], []])
def test_more_jobs_than_runs_or_cores_are_refused_on_stderr(capsys, tmp_path, plan):
    assert "--jobs 9664" in refused_in_one_line(capsys, ["reproduce", "--preset", "tiny", "--steps", "4", "--jobs",
                                                         "9664", "--out", tmp_path / "study", *plan])
    assert not (tmp_path / "study").exists()


# ---- one error path --------------------------------------------------------------------------

def test_ctrl_c_while_the_command_line_loads_is_one_line_and_130():
    import signal
    import subprocess
    import sys
    import time
    process = subprocess.Popen([sys.executable, "-m", "headlab", "info", "--preset", "tiny"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    time.sleep(0.5)  # Python is up, the command line (torch, pandas) is still loading
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert process.returncode == 130 and len(lines) == 1 and lines[0].startswith("headlab: error: "), lines


def _documents(n: int) -> bytes:
    return "".join(json.dumps({"text": f"document {i} " + "word " * 60}) + "\n" for i in range(n)).encode()


def _struct_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": [{"a": "x"}] * 20}), path)


HOSTILE_CORPORA = {
    "truncated.jsonl.gz": (lambda p: p.write_bytes(__import__("gzip").compress(_documents(30))[:-40]), "decompressed"),
    "gzip-named.jsonl.zst": (lambda p: p.write_bytes(__import__("gzip").compress(_documents(30))), "decompressed"),
    "structs.parquet": (_struct_parquet, "not text"),
    "bad-utf8.jsonl": (lambda p: p.write_bytes(_documents(30).replace(b"document 7 ", b"document 7 \xff", 1)),
                       "bad-utf8.jsonl line 8 is not valid UTF-8: byte 0xff at byte offset 21"),
    "number.jsonl": (lambda p: p.write_bytes(_documents(5) + b'{"text": 5}\n'), "line 6: field 'text' holds 5"),
    "null.jsonl": (lambda p: p.write_bytes(b'{"text": null}\n' + _documents(20)), "line 1: field 'text' holds null"),
    "five.jsonl": (lambda p: p.write_bytes(_documents(5)), "at least 10"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CORPORA))
def test_a_damaged_or_odd_document_corpus_is_one_line_with_status_2(tmp_path, capsys, name):
    make, expected = HOSTILE_CORPORA[name]
    make(tmp_path / name)
    line = refused_in_one_line(capsys, ["train", "--preset", "tiny", "--corpus", tmp_path / name, "--steps", "1",
                                        "--no-progress"])
    assert expected in line, line


def test_a_scratch_folder_that_loses_the_race_deletes_only_what_it_made(tmp_path):
    """The token cache is built privately and renamed into place: the second builder's folder
    is removed, but a file it did not make (dropped into it meanwhile) stays."""
    final = tmp_path / "cache" / "tokens"
    first, second = ScratchFolder(final).__enter__(), ScratchFolder(final).__enter__()
    first.write_bytes("meta.json", b"first")
    second.write_bytes("meta.json", b"second")
    (second.path / "users.txt").write_text("not the builder's")
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    assert (final / "meta.json").read_bytes() == b"first"
    assert sorted(p.name for p in second.path.iterdir()) == ["users.txt"]
    with pytest.raises(ValueError, match="did not make"):
        second.remove("users.txt")


def test_a_link_where_headlab_makes_a_folder_is_refused(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="symbolic link or a file is in the way"):
        make_folder(tmp_path / "run")
    assert main(["train", "--preset", "tiny", "--steps", "1", "--corpus", "synthetic", "--no-progress",
                 "--out", str(tmp_path / "run")]) == 2
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert "symbolic link" in capsys.readouterr().err


@pytest.mark.parametrize("edit", [
    {"preset": "paper-6.3b"},  # the study's shape kept: the preset is not this shape
    {"preset": "paper-6.3b", "n_layer": 32, "n_head": 32, "d_model": 4096, "head_dim": 128},  # tables: 2 layers
    {"preset": "no-such-preset"},
    {"seeds": [0, 1, 2]},
])
def test_a_hand_edited_study_meta_is_refused_not_reported(study, capsys, edit):
    edit_manifest(study / STUDY_MANIFEST, lambda payload: payload["meta"]["meta"].update(edit))
    before = snapshot(study)
    assert "edited by hand" in refused_in_one_line(capsys, ["report", study])
    assert "paper-6.3b" not in (study / "report.md").read_text()
    assert snapshot(study) == before


def test_resuming_a_run_leaves_a_hard_linked_backup_as_it_was(finished_run, tmp_path):
    """`cp -al run backup` (or `rsync --link-dest`) shares every file's inode with the backup:
    what headlab appends to the run's logs must not appear in the backup."""
    backup = tmp_path / "backup"
    shutil.copytree(finished_run, backup, copy_function=os.link)
    before = snapshot(backup)
    train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS), out=finished_run, resume=True,
          progress=False)
    assert snapshot(backup) == before
    assert (finished_run / "starts.jsonl").read_bytes().startswith((backup / "starts.jsonl").read_bytes())


def test_resuming_a_run_leaves_the_lock_a_hard_linked_backup_shares_as_it_was(finished_run, tmp_path):
    """The lock's text names its holder: a `.lock` shared with a `cp -al` backup is replaced by
    the run's own before it is written, so the backup's keeps its bytes."""
    backup = tmp_path / "backup"
    shutil.copytree(finished_run, backup, copy_function=os.link)
    holder = "pid 1 on elsewhere since 2020-01-01 00:00:00\n"
    (backup / ".lock").write_text(holder)  # one inode: the run's lock reads the same
    train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS), out=finished_run, resume=True,
          progress=False)
    assert (backup / ".lock").read_text() == holder
    lock = finished_run / ".lock"
    assert lock.stat().st_nlink == 1 and lock.read_text().startswith(f"pid {os.getpid()} ")


@pytest.mark.parametrize("blank", ["", " "])
def test_a_blank_cache_variable_means_the_default_cache_not_the_working_folder(tmp_path, monkeypatch, blank):
    monkeypatch.setenv(sources.CACHE_ENV, blank)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert sources.cache_dir() == tmp_path / "home" / ".cache" / "headlab"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_a_start_log_cut_mid_line_gets_its_next_record_on_a_line_of_its_own(finished_run):
    starts = finished_run / "starts.jsonl"
    os.truncate(starts, 5)
    train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS), out=finished_run, resume=True,
          progress=False)
    assert json.loads(starts.read_text().splitlines()[-1])["step"] == TINY.steps


def test_a_studys_runs_folder_linked_into_another_study_is_refused_and_that_study_is_untouched(study, capsys):
    """A study's runs/ is headlab's own folder: replaced by a link (a copy made with the link kept,
    a hand tidying up), neither its run folders nor the ones it points to are read or written."""
    second = study.with_name("second")
    shutil.copytree(study, second, ignore=shutil.ignore_patterns("runs"))
    (second / "runs").symlink_to(study / "runs")
    before = treediff.snapshot(study)
    assert "runs is a symbolic link" in refused_in_one_line(capsys, [*REPRODUCE, "--out", second])
    assert treediff.snapshot(study) == before


def test_reproduce_of_roles_without_a_comparison_is_refused_before_training(tmp_path, capsys):
    """Every comparison is with Standard MHA: `--only` without it, or with it alone, is one line
    before anything is trained (it trained, then failed to report)."""
    for only in (["mha"], ["mqa", "gqa"]):
        line = refused_in_one_line(capsys, ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "2",
                                            "--only", *only, "--out", tmp_path / "study"])
        assert "include 'mha' and at least one variant" in line and not (tmp_path / "study").exists()
