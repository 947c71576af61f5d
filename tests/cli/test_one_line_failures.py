"""Every error one line, also when the machine refuses rather than the input: memory that runs out
while headlab's libraries load (`ulimit -v`) or while a command runs, a terminal without UTF-8, a
refused read, a target that cannot be replaced (named by its own name, never its temporary), a
number beyond float range in a manifest, a damaged record of a study's tables; and a superseded
checkpoint that cannot be deleted is a warning, while training goes on."""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import headlab
from headlab import load_corpus, preset, train, train_preset
from headlab.analysis.tables import save_tables
from headlab.cli import model_commands
from headlab.cli.main import main
from headlab.io import writing
from headlab.runs.checkpoints import current_checkpoint
from headlab.study.table_files import MANIFEST, STUDY
from shared_fixtures import tiny_model, write_run


def one_line(capsys, argv) -> str:
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and err.startswith("headlab: error: "), (status, err)
    return err


def test_memory_running_out_while_torch_loads_is_one_line(tmp_path):
    def small_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, resource.RLIM_INFINITY))  # enough for Python, not torch
    argv = [sys.executable, "-m", "headlab", "analyze", tmp_path, "--out", tmp_path / "out"]  # a path that exists
    result = subprocess.run(argv, capture_output=True, text=True, preexec_fn=small_address_space, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(Path(headlab.__file__).parents[1])})
    err = result.stderr.strip()
    assert result.returncode == 2 and len(err.splitlines()) == 1, (result.returncode, err[-800:])
    assert err.startswith("headlab: error: memory ran out while loading") and "ulimit" in err


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:117] "
                                                               "DefaultCPUAllocator: can't allocate memory: you "
                                                               "tried to allocate 68719476736 bytes")])
def test_memory_running_out_in_a_command_is_said_so_not_called_a_bug(capsys, monkeypatch, error):
    def runs_out(args):
        raise error
    monkeypatch.setattr(model_commands, "cmd_info", runs_out)
    err = one_line(capsys, ["info"])
    assert "memory ran out while running info" in err and "bug" not in err


def test_a_terminal_without_utf8_shows_the_tables_in_plain_spelling(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", tiny_model("mha"))
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))  # LC_ALL=C without UTF-8 mode
    status = main(["analyze", str(run), "--out", str(tmp_path / "out")])
    sys.stdout.flush()
    assert status == 0 and (tmp_path / "out" / "summary.csv").exists()
    assert b"Standard MHA - qk - frobenius" in raw.getvalue()


@pytest.fixture
def study(tmp_path) -> Path:
    folder = tmp_path / "study"
    save_tables(folder, {"summary": pd.DataFrame({"layer": [0], "rank": [1.5]})}, MANIFEST, STUDY)
    return folder


def test_a_refused_read_says_permission_not_damage(study, capsys, monkeypatch):
    import headlab.io.manifest

    def refused(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    monkeypatch.setattr(headlab.io.manifest, "read_regular", refused)
    err = one_line(capsys, ["report", study])
    assert "Permission denied" in err and "study.json" in err and "not a readable manifest" not in err


def test_a_folder_where_a_listed_file_goes_is_named_by_its_own_name(study, capsys):
    with writing(study, MANIFEST, STUDY, "report writer") as manifest:
        manifest.write_bytes("report.md", b"# report\n")
    (study / "report.md").unlink()
    (study / "report.md").mkdir()
    with pytest.raises(ValueError, match=r"report\.md is not the file headlab wrote") as refused:
        with writing(study, MANIFEST, STUDY, "report writer") as manifest:
            manifest.write_bytes("report.md", b"# report\n")
    assert ".tmp" not in str(refused.value)


def test_an_immutable_target_is_named_by_its_own_name(study, monkeypatch):
    replace = os.replace

    def immutable(source, target):  # what renaming over a file under `chattr +i` does
        if Path(target).name != "report.md":
            return replace(source, target)
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(source), str(target))
    monkeypatch.setattr(os, "replace", immutable)
    with pytest.raises(OSError) as refused, writing(study, MANIFEST, STUDY, "report writer") as manifest:
        manifest.write_bytes("report.md", b"# report\n")
    assert refused.value.filename == str(study / "report.md") and refused.value.filename2 is None
    assert not list(study.glob(".report.md.*.tmp"))


def test_a_step_beyond_float_range_is_named(tmp_path, capsys):
    run = write_run(tmp_path / "run", tiny_model("mha"))
    path = run / "manifest.json"
    payload = json.loads(path.read_text())
    assert payload["meta"]["checkpoint"]["step"] == 0
    path.write_text(path.read_text().replace('"step": 0', '"step": 1e400'))
    err = one_line(capsys, ["analyze", run, "--out", tmp_path / "out"])
    assert "1e400" in err and "beyond the range" in err and "infinity to integer" not in err


def test_a_damaged_record_of_the_tables_is_named(study, capsys):
    path = study / "study.json"
    payload = json.loads(path.read_text())
    del payload["meta"]["tables"]["summary.csv"]["columns"]
    path.write_text(json.dumps(payload))
    err = one_line(capsys, ["report", study])
    assert "does not record its tables" in err and "'columns'" not in err


def test_a_superseded_checkpoint_that_cannot_be_deleted_is_a_warning(tmp_path, monkeypatch):
    import headlab.io.manifest

    def busy(path, entry):
        raise PermissionError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
    monkeypatch.setattr(headlab.io.manifest, "remove_verified", busy)
    config = train_preset("tiny", steps=4, batch_size=2, eval_every=4, eval_batches=1, checkpoint_every=2)
    with pytest.warns(UserWarning, match="could not delete .* the next write tries again"):
        train(preset("tiny", "mha"), config, load_corpus("synthetic", n_chars=20_000), out=tmp_path / "run",
              progress=False)
    assert current_checkpoint(tmp_path / "run").step == 4
    monkeypatch.undo()
    train(preset("tiny", "mha"), config, load_corpus("synthetic", n_chars=20_000), out=tmp_path / "run",
          resume=True, progress=False)  # the next writer deletes what was kept on record
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-00000004"]
