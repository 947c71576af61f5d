"""The ownership invariants, one test each: headlab deletes or overwrites only what its
manifest says it wrote, verifies content (not size) on every read, never writes through a
link, and lets one writer at a time into an analysis folder."""

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

import headlab.io
from headlab import load_corpus, load_run, preset, train
from headlab.analysis.similarity import Analysis
from headlab.cli.main import main
from headlab.data.bpe import TOKENIZER_FILE
from headlab.io import Manifest
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.layout import MANIFEST
from headlab.study.study import Study
from headlab.study.table_files import MANIFEST as STUDY_MANIFEST
from headlab.study.table_files import STUDY
from shared_fixtures import TINY_CORPUS, TINY_TRAINING, tiny_model, write_run
from treediff import snapshot

TINY = TINY_TRAINING
TRAIN = ["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "2", "--no-progress"]


@pytest.fixture(autouse=True)
def isolated_cache(own_cache):
    return own_cache


@pytest.fixture
def finished_run(tmp_path, tiny_run):
    """A finished tiny run of its own (a copy of `tiny_run`, trained as `TINY` on `TINY_CORPUS`)."""
    return shutil.copytree(tiny_run, tmp_path / "run", symlinks=True)


def refused_in_one_line(capsys, argv) -> str:
    """Run the CLI; it must exit 2 with exactly one line on stderr, which is returned."""
    assert main([str(a) for a in argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlab: error: "), lines
    return lines[0]


def flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


# ---- ownership -------------------------------------------------------------------------------------------------

def test_a_foreign_folder_is_refused_as_train_out_and_left_unchanged(tmp_path, capsys):
    hf = tmp_path / "hf-trainer-output"
    (hf / "checkpoint-500").mkdir(parents=True)
    (hf / "checkpoint-500" / "model.safetensors").write_bytes(b"weights of another tool")
    (hf / "checkpoint-500" / "optimizer.pt").write_bytes(b"optimizer of another tool")
    (hf / "config.json").write_text('{"model_type": "gpt2"}')
    (hf / ".config.json.0123abcd.tmp").write_text("named as headlab names its temporaries")
    (hf / "trainer.tmp").write_text("another tool's temporary")
    before = snapshot(hf)
    assert "holds files headlab did not write" in refused_in_one_line(capsys, [*TRAIN, "--out", hf])
    assert snapshot(hf) == before  # not even a .lock


@pytest.mark.parametrize("command", ["train", "train --resume", "reproduce"])
def test_a_run_whose_manifest_is_gone_is_refused_and_nothing_is_deleted(tmp_path, finished_run, capsys, command):
    if command == "reproduce":  # a study whose first run lost its manifest
        study = Study("tiny", 2, tmp_path / "study")
        study.folder.mkdir()
        Manifest.claim(study.folder, STUDY_MANIFEST, STUDY)
        run = study.run_folder(next(iter(study.roles.values())))
        run.parent.mkdir()
        shutil.copytree(finished_run, run)
        argv = ["reproduce", "--preset", "tiny", "--steps", "2", "--seeds", "1", "--corpus", "synthetic",
                "--jobs", "1",  # worker processes would import torch again, and train the other runs first
                "--out", study.folder]
    else:
        run = finished_run
        argv = [*TRAIN, "--out", run, *(["--resume"] if command.endswith("--resume") else [])]
    (run / MANIFEST).unlink()
    before = snapshot(run)
    assert "checkpoint-00000004" in before
    assert "holds files headlab did not write" in refused_in_one_line(capsys, argv)
    assert snapshot(run) == before


def test_a_run_killed_while_claiming_its_folder_resumes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").touch()
    (run / ".manifest.json.0123abcd.tmp").write_text('{"format": "hea')  # the kill came mid-write
    train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS), out=run, resume=True, progress=False)
    assert current_checkpoint(run).step == TINY.steps
    # no manifest recorded that temporary and this process did not make it: headlab cannot tell it from a user's
    assert [p.name for p in run.glob(".*.tmp")] == [".manifest.json.0123abcd.tmp"]


# ---- confinement -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["train", "analyze"])
def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path, capsys, command):
    target = tmp_path / "precious.txt"
    target.write_text("not headlab's")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(target)
    model = write_run(tmp_path / "model", tiny_model("mha"))
    argv = [*TRAIN, "--out", out] if command == "train" else ["analyze", model, "--out", out]
    assert "symbolic link" in refused_in_one_line(capsys, argv)
    assert target.read_text() == "not headlab's" and snapshot(out) == {".lock": f"-> {target}"}


@pytest.mark.parametrize("entry", ["fifo", "symlink", "folder"])
def test_a_corpus_folder_with_a_txt_that_is_not_a_regular_file_is_refused(tmp_path, capsys, entry):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("plain words " * 400)
    make = {"fifo": os.mkfifo, "symlink": lambda p: p.symlink_to(texts / "a.txt"), "folder": Path.mkdir}[entry]
    make(texts / "x.txt")
    line = refused_in_one_line(capsys,
                               ["train", "--preset", "tiny", "--corpus", texts, "--steps", "1", "--no-progress"])
    assert "x.txt" in line and "not regular files" in line


# ---- content, not size -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [True, -1, 1.0, "1", None], ids=repr)
def test_a_manifest_entry_whose_size_is_not_a_size_is_refused(tmp_path, size):
    manifest = Manifest.claim(tmp_path, "manifest.json", "a test folder")
    manifest.write_bytes("a.txt", b"a")
    manifest.save()
    payload = json.loads((tmp_path / "manifest.json").read_text())
    payload["files"]["a.txt"]["bytes"] = size
    (tmp_path / "manifest.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="manifest.json is not the manifest of a test folder"):
        Manifest.read(tmp_path, "manifest.json", "a test folder")


def test_a_bit_flip_in_the_weights_is_refused_naming_the_file(finished_run):
    checkpoint = current_checkpoint(finished_run)
    flip_one_bit(checkpoint.manifest.file(checkpoint.weights))
    with pytest.raises(ValueError, match=r"model\.safetensors does not match the SHA-256") as error:
        load_run(finished_run)
    assert "\n" not in str(error.value)


def test_a_bit_flip_in_the_training_state_is_refused_naming_the_file(finished_run):
    checkpoint = current_checkpoint(finished_run)
    flip_one_bit(checkpoint.manifest.file(checkpoint.state))
    with pytest.raises(ValueError, match=r"state\.pt does not match the SHA-256") as error:
        train(preset("tiny", "mha"), TINY, load_corpus(**TINY_CORPUS),
              out=finished_run, resume=True, progress=False)
    assert "\n" not in str(error.value)


def test_a_config_edited_after_training_is_refused(finished_run):
    config = json.loads((finished_run / "config.json").read_text())
    config["train"]["lr"] *= 2  # still a valid config: only its hash tells
    (finished_run / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(ValueError, match=r"config\.json does not match the SHA-256"):
        load_run(finished_run)


def test_an_edited_bpe_tokenizer_is_refused():
    tokenizer = load_corpus("synthetic", tokenizer="bpe:300").folder / TOKENIZER_FILE
    edited = json.loads(tokenizer.read_text())
    tokenizer.write_text(json.dumps(edited, indent=1))  # the same merges, other bytes: still an edit
    with pytest.raises(ValueError, match=r"tokenizer\.json does not match the SHA-256"):
        load_corpus("synthetic", tokenizer="bpe:300")


def test_a_corrupted_token_shard_is_refused_and_not_trained_on(tmp_path, capsys):
    shard = load_corpus("synthetic").folder / "train_000.bin"
    flip_one_bit(shard)
    line = refused_in_one_line(capsys, [*TRAIN, "--out", tmp_path / "run"])
    assert "train_000.bin does not match the SHA-256" in line
    assert not (tmp_path / "run" / MANIFEST).exists()  # no step was trained


# ---- one writer per analysis folder ----------------------------------------------------------------------------

def test_a_second_analysis_into_the_same_folder_is_refused_while_the_first_writes(tmp_path, capsys, monkeypatch):
    first, second = write_run(tmp_path / "mha", tiny_model("mha")), write_run(tmp_path / "mqa", tiny_model("mqa"))
    out = tmp_path / "analysis"
    writing, release = threading.Event(), threading.Event()
    real_write = headlab.io.HashingFile.write

    def paused_write(self, data):  # the first analysis (in its own thread) stops at its first write
        if threading.current_thread() is not threading.main_thread():
            writing.set()
            release.wait(timeout=120)
        return real_write(self, data)

    monkeypatch.setattr(headlab.io.HashingFile, "write", paused_write)
    codes = []
    writer = threading.Thread(target=lambda: codes.append(main(["analyze", str(first), "--out", str(out)])))
    writer.start()
    try:
        assert writing.wait(timeout=120)
        assert main(["analyze", str(second), "--out", str(out)]) == 2
    finally:
        release.set()
        writer.join()
    errors = capsys.readouterr().err.strip().splitlines()
    assert codes == [0] and len(errors) == 1 and "being written by another" in errors[0], errors
    written = Analysis.load(out)
    assert written.models == ["Standard MHA"] and set(written.summary["model"]) == {"Standard MHA"}
