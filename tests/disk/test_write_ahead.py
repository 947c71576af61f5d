"""A kill -9 right after any write leaves a folder its next writer finishes: every file a writer
was writing is recorded in the folder's manifest before its bytes exist (`Manifest.intended`),
so the file a kill leaves at its name is headlab's to replace, while a file nobody recorded is
still refused. Checked at every write point of a study-shaped sequence (tables, then a report's
figures into the same folder, whose table writer rewrites the manifest's other records) and of a
checkpointing run, each kill judged by the tree-diff checker and each rerun compared, byte for
byte, with a run that was never killed."""

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

import faults
from headlab.analysis.tables import save_tables
from headlab.io import Manifest, writing
from headlab.runs.checkpoints import checkpoint_step, parse_weights, save_checkpoint
from headlab.runs.layout import run_manifest
from headlab.runs.metrics import MetricsLog
from headlab.study.table_files import MANIFEST, STUDY
from shared_fixtures import tiny_model, write_run
from treediff import Tree, check

TABLES = {"summary": pd.DataFrame({"layer": [0, 1], "rank": [1.5, 2.25]}),
          "spectra": pd.DataFrame({"layer": [0, 0, 1], "eigenvalue": [3.0, 1.0, 0.5]})}


FIGURE = {".png": b"\x89PNG drawn", ".svg": b"<svg>drawn</svg>"}  # what `save_figure(svg=True)` hands `write_all`


def write_study(folder: Path) -> None:
    """What `reproduce --svg` writes into a study folder, in its order: the tables, then the report
    (a figure as PNG and SVG in figures/, then report.md) under the report writer's lock."""
    save_tables(folder, TABLES, MANIFEST, STUDY, meta={"preset": "tiny"})
    with writing(folder, MANIFEST, STUDY, "report writer") as manifest:
        manifest.write_all({f"figures/spectra{suffix}": lambda file, data=data: file.write(data)
                            for suffix, data in FIGURE.items()})
        manifest.write_bytes("report.md", b"# report\n\n![spectra](figures/spectra.png)\n")


CHECKPOINT_2 = "checkpoint-00000002/model.safetensors"
WEIGHTS = {name: tensor.contiguous() for name, tensor in tiny_model("mha").state_dict().items()}


def checkpoint_step_2(run: Path) -> None:
    """A trainer's step-2 checkpoint of a run at step 0, as a resume writes it: not once it is there."""
    if checkpoint_step(run) < 2:
        save_checkpoint(run, WEIGHTS, [], torch.Generator().manual_seed(2), step=2, metrics=MetricsLog(None))


def listed_content(manifest: Manifest) -> dict[str, str]:
    """Each file `manifest` lists, with the SHA-256 of what is there now (verified)."""
    return {name: hashlib.sha256(manifest.read_bytes(name)).hexdigest() for name in manifest.files}


def run_content(run: Path) -> tuple[dict[str, str], dict[str, bytes], dict]:
    """What a run's manifest lists: the weights and their metadata parsed (safetensors writes
    the metadata's keys in an order of its own), every other file's SHA-256."""
    manifest = run_manifest(run)
    weights, metadata = parse_weights(manifest.read_bytes(CHECKPOINT_2), manifest.file(CHECKPOINT_2))
    return ({name: sha for name, sha in listed_content(manifest).items() if name != CHECKPOINT_2},
            {name: tensor.numpy().tobytes() for name, tensor in weights.items()}, metadata)


def study_content(folder: Path) -> dict[str, str]:
    return listed_content(Manifest.read(folder, MANIFEST, STUDY))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict[str, str]:
    """What an uninterrupted `write_study` lists."""
    folder = tmp_path_factory.mktemp("clean") / "study"
    write_study(folder)
    return study_content(folder)


def kill_at_every_write(root: Path, start: callable, work: callable, rerun: callable) -> int:
    """For every n: make the tree with `start(root)`, kill -9 `work()` right after its n-th write
    below `root`, then `rerun()`. Each kill and each rerun must lose nothing (treediff); returns
    how many writes there were (`work` finishes once n is past the last)."""
    points = 0
    while True:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        start(root)
        before = Tree.read(root)
        status = faults.kill_after_write(work, root, points + 1)
        if status != faults.KILLED:
            assert status == 0
            return points
        points += 1
        killed = Tree.read(root)
        assert not check(before, killed, 0, ""), (points, check(before, killed, 0, ""))
        rerun()
        assert not check(killed, Tree.read(root), 0, ""), (points, check(killed, Tree.read(root), 0, ""))


def test_a_kill_after_any_write_of_a_study_leaves_a_folder_its_rerun_finishes_identically(tmp_path, clean):
    """For every n, kill -9 right after the n-th write below the root, then write again: the
    kill loses nothing (treediff), the rerun succeeds, and its files are a clean run's."""
    root, study = tmp_path / "root", tmp_path / "root" / "study"

    def rerun():
        write_study(study)
        assert study_content(study) == clean
        assert (root / "notes.md").read_text() == "a user's notes beside the study"
    points = kill_at_every_write(root, lambda root: (root / "notes.md").write_text("a user's notes beside the study"),
                                 lambda: write_study(study), rerun)
    assert points > 40  # every kind of write was reached: manifests, locks, folders, temporaries, renames


def test_a_kill_after_any_write_of_a_checkpoint_leaves_a_run_its_resume_finishes_identically(tmp_path):
    at_step_0 = write_run(tmp_path / "template" / "run", tiny_model("mha"))
    (at_step_0 / "metrics.jsonl").write_bytes(b"")  # the log its manifest lists, empty at step 0
    clean = tmp_path / "clean"
    shutil.copytree(at_step_0, clean)
    checkpoint_step_2(clean)
    run = tmp_path / "root" / "run"

    def rerun():
        checkpoint_step_2(run)
        assert run_content(run) == run_content(clean)
    points = kill_at_every_write(tmp_path / "root", lambda root: shutil.copytree(at_step_0, run),
                                 lambda: checkpoint_step_2(run), rerun)
    assert points > 10


def test_a_file_no_manifest_recorded_is_still_refused_where_a_figure_goes(tmp_path):
    folder = tmp_path / "study"
    save_tables(folder, TABLES, MANIFEST, STUDY)
    (folder / "figures").mkdir()
    (folder / "figures" / "spectra.png").write_bytes(b"the user's picture")
    with pytest.raises(ValueError, match="does not list it"), writing(folder, MANIFEST, STUDY, "report writer") as m:
        m.write_bytes("figures/spectra.png", FIGURE[".png"])
    assert (folder / "figures" / "spectra.png").read_bytes() == b"the user's picture"


def test_a_manifest_without_the_write_ahead_record_reads_as_before(tmp_path, clean):
    """Folders written before `intended` existed keep working: read, verified, rewritten."""
    folder = tmp_path / "study"
    write_study(folder)
    path = folder / MANIFEST
    payload = json.loads(path.read_text())
    del payload["intended"]
    path.write_text(json.dumps(payload))
    assert study_content(folder) == clean
    write_study(folder)
    assert study_content(folder) == clean and "intended" in json.loads(path.read_text())
