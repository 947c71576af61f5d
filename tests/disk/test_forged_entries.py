"""Write-ahead and retired records are no licences: headlab replaces or deletes a file only while
its bytes are what a manifest recorded for that name, or a temporary whose inode it recorded when
it made it; and a folder's manifest owns nothing inside a sub-folder that holds a manifest of its
own. Every record a manifest keeps of a write (files, intended, retired, discard, staging) is
forged in every state (no content, the true record of what is there, a false one) naming each
kind of file (headlab's, a user's, one put where a killed write was going, a user's file named
like a temporary, a nested run's manifest, weights and temporary), then the folder is written
again; the tree-diff checker (tests/treediff.py) judges each. A study's `headlab report` is
checked the same way against its runs' files (the study fixture of test_nothing_lost)."""

import shutil
from pathlib import Path

import pytest

import faults
from headlab.analysis.tables import save_tables
from headlab.cli.main import _one_line
from headlab.io import Manifest, writing
from headlab.runs.layout import MANIFEST as RUN_MANIFEST
from headlab.runs.layout import RUN
from headlab.study.table_files import MANIFEST, STUDY
from treediff import Tree, check

WEIGHTS = "runs/r/checkpoint-00000002/model.safetensors"
NAMES = ["report.md",  # headlab's, verified
         "notes.md",  # a user's, never listed
         "late.md",  # a user's, put where a killed write was going
         ".report.md.0123abcd.tmp", "figures/.a.png.0123abcd.tmp",  # a user's, named like temporaries
         "runs/r/manifest.json", WEIGHTS, "runs/r/.config.json.0123abcd.tmp"]  # a nested run's


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """root/study: a study's tables, report and figure, a user's files beside them, and a run
    folder with its own manifest inside (its config and weights)."""
    study = tmp_path_factory.mktemp("template") / "root" / "study"
    save_tables(study, {}, MANIFEST, STUDY)
    with writing(study, MANIFEST, STUDY, "report writer") as manifest:
        manifest.write_all({"figures/a.png": lambda file: file.write(b"\x89PNG a figure"),
                            "report.md": lambda file: file.write(b"# report\n")})
    run = study / "runs" / "r"
    run.mkdir(parents=True)
    manifest = Manifest.claim(run, RUN_MANIFEST, RUN)
    manifest.write_bytes("config.json", b'{"format": "headlab"}')
    manifest.write_bytes("checkpoint-00000002/model.safetensors", b"weights")
    manifest.save()
    for name, text in (("notes.md", "a user's notes"), ("late.md", "a user's own, after a kill"),
                       (".report.md.0123abcd.tmp", "a user's, named like a temporary"),
                       ("figures/.a.png.0123abcd.tmp", "a user's too"), ("runs/r/.config.json.0123abcd.tmp", "x")):
        (study / name).write_text(text)
    return study


def attempt(work) -> tuple[int, str]:
    """(status, stderr) as the command line would end `work()`: 0, or 2 and one line."""
    try:
        work()
    except (ValueError, OSError) as error:
        return 2, f"headlab: error: {_one_line(error)}"
    return 0, ""


def write_study_again(study: Path, name: str | None) -> None:
    """What `report` does to the study's own folder: its leftovers removed, then (with `name`) a file written."""
    with writing(study, MANIFEST, STUDY, "report writer") as manifest:
        if name is not None:
            manifest.write_bytes(name, b"headlab's new version")


@pytest.mark.parametrize("state", faults.STATES)
@pytest.mark.parametrize("field", faults.FIELDS)
@pytest.mark.parametrize("name", NAMES)
def test_a_forged_record_licenses_nothing_its_bytes_do_not(tmp_path, template, name, field, state):
    root = tmp_path / "root"
    shutil.copytree(template.parent, root, symlinks=True)
    study = root / "study"
    faults.forge_entry(study, field, name, state)
    for write in (None, name):
        before = Tree.read(root)
        status, err = attempt(lambda: write_study_again(study, write))
        broken = check(before, Tree.read(root), status, err)
        assert not broken, (name, field, state, write, err, broken)
    for kept in ("notes.md", ".report.md.0123abcd.tmp", "runs/r/manifest.json", WEIGHTS):
        if not (kept == name and field in ("retired", "files", "intended") and state == "true" and "/" not in kept):
            assert (study / kept).exists(), (kept, name, field, state)


def test_a_content_less_write_ahead_record_never_overwrites_a_users_file(tmp_path, template):
    """The issue's case: killed after recording `late.md` as about to be written, before any byte;
    the user then wrote their own late.md. Rewriting it is refused, and the file kept."""
    study = tmp_path / "study"
    shutil.copytree(template, study, symlinks=True)
    faults.forge_entry(study, "intended", "late.md", "no content")
    status, err = attempt(lambda: write_study_again(study, "late.md"))
    assert status == 2 and "does not list it" in err  # the content-less record is dropped as the folder is opened
    assert (study / "late.md").read_text() == "a user's own, after a kill"


def test_a_write_ahead_record_is_compared_with_the_bytes_on_disk(tmp_path, template):
    study = tmp_path / "study"
    shutil.copytree(template, study, symlinks=True)
    faults.forge_entry(study, "intended", "late.md", "false")
    status, err = attempt(lambda: write_study_again(study, "late.md"))
    assert status == 2 and "was changed since headlab wrote it" in err
    faults.forge_entry(study, "intended", "late.md", "true")  # what is there is now what headlab recorded
    assert attempt(lambda: write_study_again(study, "late.md")) == (0, "")
    assert (study / "late.md").read_bytes() == b"headlab's new version"


def test_a_temporary_is_deleted_only_while_it_is_the_one_headlab_recorded(tmp_path, template):
    study = tmp_path / "study"
    shutil.copytree(template, study, symlinks=True)
    write_study_again(study, None)
    assert (study / ".report.md.0123abcd.tmp").exists()  # a name alone: kept
    faults.forge_entry(study, "staging", ".report.md.0123abcd.tmp", "false")
    write_study_again(study, None)
    assert (study / ".report.md.0123abcd.tmp").exists()  # another file's inode: kept
    faults.forge_entry(study, "staging", ".report.md.0123abcd.tmp", "true")
    write_study_again(study, None)
    assert not (study / ".report.md.0123abcd.tmp").exists()  # the one recorded


@pytest.mark.parametrize("name", ["runs/r/manifest.json", WEIGHTS])
def test_a_study_manifest_never_deletes_a_file_of_a_run_inside_it(tmp_path, template, name):
    study = tmp_path / "study"
    shutil.copytree(template, study, symlinks=True)
    faults.forge_entry(study, "retired", name, "true")
    write_study_again(study, None)
    assert (study / name).exists() and Manifest.read(study / "runs" / "r", RUN_MANIFEST, RUN).verify(
        "checkpoint-00000002/model.safetensors")
