"""A run folder never loses work, and no bad input gives a silent wrong answer.

One test (or more) per numbered finding of the issue, then faults at many instants: random
SIGKILLs of a checkpoint-every-step run, a full disk at each write of a checkpoint (simulated),
and a real full tmpfs where the machine allows mounting one."""

import contextlib
import errno
import json
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

import headlab
import headlab.runs.checkpoints
from headlab import TrainingDiverged, load_corpus, load_run, preset, train, train_preset
from headlab.cli.main import main
from headlab.model.gpt import GPT
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.metrics import read_metrics

TINY = train_preset("tiny", steps=12, batch_size=4, eval_every=4, eval_batches=1, checkpoint_every=4, log_every=1)
VOLATILE = ("tokens_per_s", "elapsed_s")  # wall-clock fields of a metrics record


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("synthetic", n_chars=30_000)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted run every interrupted one must end up equal to."""
    return train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path_factory.mktemp("ref") / "run", progress=False)


def _strip(records):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records]


def _assert_same_run(folder: Path, reference) -> None:
    """Bit-identical weights and metrics (less wall-clock fields) to the uninterrupted run."""
    loaded = load_run(folder)
    assert loaded.step == TINY.steps
    for name, tensor in reference.model.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[name]), name
    assert _strip(read_metrics(folder / "metrics.jsonl")) == _strip(reference.metrics)


class _Interrupt(Exception):
    pass


def _interrupt_at_step(monkeypatch, step: int):
    """GPT.forward raises on its `step`-th training call (0-based)."""
    original, calls = GPT.forward, {"n": 0}

    def forward(self, idx, *args, **kwargs):
        if self.training:
            calls["n"] += 1
            if calls["n"] - 1 == step:
                raise _Interrupt
        return original(self, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)


def _full_disk(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def _weights_fail_then_resume(folder: Path, corpus, reference, monkeypatch, serialize) -> None:
    """Train with checkpoint weights written by `serialize` (which runs out of space when it
    chooses), see the disk's error, then resume to the uninterrupted run."""
    import headlab.runs.checkpoints

    with monkeypatch.context() as patch:
        patch.setattr(headlab.runs.checkpoints, "serialize_safetensors", serialize)
        with pytest.raises(Exception, match="No space left on device"):
            train(preset("tiny", "gqa"), TINY, corpus, out=folder, progress=False)
    train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=True, progress=False)
    _assert_same_run(folder, reference)


# ---- a checkpoint is one unit --------------------------------------------------------------

def test_full_disk_between_the_two_checkpoint_files_leaves_a_resumable_run(tmp_path, corpus, reference, monkeypatch):
    import headlab.runs.checkpoints

    real, calls = headlab.runs.checkpoints.serialize_safetensors, {"n": 0}

    def weights_fail_second_time(*args, **kwargs):  # state.pt of step 8 is written, its weights are not
        calls["n"] += 1
        if calls["n"] == 2:
            _full_disk()
        return real(*args, **kwargs)

    _weights_fail_then_resume(tmp_path / "run", corpus, reference, monkeypatch, weights_fail_second_time)


# ---- killed before the first checkpoint ------------------------------------------------------

def test_a_run_cut_short_inside_its_first_checkpoint_resumes_from_step_0(tmp_path, corpus, reference, monkeypatch):
    _weights_fail_then_resume(tmp_path / "run", corpus, reference, monkeypatch, _full_disk)  # state.pt may be written


def test_a_run_killed_before_any_checkpoint_restarts_with_or_without_resume(tmp_path, corpus, reference, monkeypatch):
    for resume in (True, False):
        folder = tmp_path / f"resume-{resume}"
        with monkeypatch.context() as patch:
            _interrupt_at_step(patch, 2)
            with pytest.raises(_Interrupt):
                train(preset("tiny", "gqa"), TINY, corpus, out=folder, progress=False)
        train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=resume, progress=False)
        _assert_same_run(folder, reference)


# ---- resume never silently starts over with other settings -----------------------------------

def test_resume_without_a_checkpoint_checks_the_saved_config(tmp_path, corpus, monkeypatch):
    with monkeypatch.context() as patch:
        _interrupt_at_step(patch, 2)
        with pytest.raises(_Interrupt):
            train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)
    saved = (tmp_path / "run" / "config.json").read_text()
    with pytest.raises(ValueError,
                       match=r"differ from the saved run: .*model.n_kv_head: saved 2, given 1"
                             r".*train.lr: saved 0.003, given 0.01"):
        train(preset("tiny", "gqa", n_kv_head=1), TINY.replace(lr=0.01), corpus, out=tmp_path / "run", resume=True,
              progress=False)
    assert (tmp_path / "run" / "config.json").read_text() == saved


def test_resume_with_weights_but_no_training_state_is_refused_and_keeps_the_metrics(tmp_path, corpus):
    train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    for state in (tmp_path / "run").rglob("state.pt"):
        state.unlink()
    with pytest.raises(ValueError, match=r"state\.pt is missing"):
        train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", resume=True, progress=False)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
    assert load_run(tmp_path / "run").step == TINY.steps  # the weights are still there


# ---- one writer per run folder -------------------------------------------------------------------

needs_fork = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks a trainer (Linux only)")


def _fork(function) -> int:
    """Run `function` in a forked child (torch already imported, so it starts in milliseconds).
    The child never returns into pytest; a failure is written to <pid>.err beside the test."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            function()
        except BaseException:
            Path(f"/tmp/headlab-child-{os.getpid()}.err").write_text(traceback.format_exc())
            code = 1
        finally:
            os._exit(code)
    return pid


def _child_error(pid: int) -> str:
    path = Path(f"/tmp/headlab-child-{pid}.err")
    text = path.read_text() if path.exists() else ""
    path.unlink(missing_ok=True)
    return text


@needs_fork
def test_a_second_trainer_on_a_busy_folder_is_refused_and_a_dead_ones_lock_is_not_obeyed(tmp_path, corpus, reference):
    def slow_trainer():
        original = GPT.forward
        GPT.forward = lambda self, *a, **k: (time.sleep(0.05), original(self, *a, **k))[1]
        train(preset("tiny", "gqa"), TINY.replace(steps=10_000), corpus, out=tmp_path / "run", progress=False)

    pid = _fork(slow_trainer)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "run" / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(RuntimeError, match=rf"run is being written by another trainer \(pid {pid}\b"):
            train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)
        with pytest.raises(RuntimeError, match="being written by another trainer"):
            train(preset("tiny", "gqa"), TINY.replace(steps=10_000), corpus, out=tmp_path / "run", resume=True,
                  progress=False)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert (tmp_path / "run" / ".lock").read_text().startswith(f"pid {pid} ")  # the dead trainer's lock file
    shutil.rmtree(tmp_path / "run")  # (its run had another step count)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text(f"pid {pid} on a host long gone\n")
    train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)
    _assert_same_run(tmp_path / "run", reference)


# ---- metrics are validated ---------------------------------------------------------------------

def test_a_corrupt_metrics_line_is_an_error_naming_file_and_line_and_a_torn_last_line_is_dropped(tmp_path, corpus):
    train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)
    path = tmp_path / "run" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + lines[-1][:20])  # a record cut short by a kill
    assert read_metrics(path) == [json.loads(line) for line in lines]
    after_checkpoint = "".join(lines + ['{"step": 13, "train_lo\n', lines[-1]])  # lines a cut-short run appended
    path.write_text(after_checkpoint)
    with pytest.raises(ValueError, match=rf"metrics\.jsonl line {len(lines) + 1} is not valid JSON"):
        load_run(tmp_path / "run")
    corrupt = "".join(lines[:2] + ['{"step": 3, "train_lo\n'] + lines[3:])  # a line the checkpoint hashed
    path.write_text(corrupt)
    with pytest.raises(ValueError, match=r"metrics\.jsonl does not match the SHA-256 recorded in .*manifest\.json"):
        load_run(tmp_path / "run")
    with pytest.raises(ValueError, match=r"metrics\.jsonl does not match the SHA-256"):
        train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", resume=True, progress=False)
    assert path.read_text() == corrupt  # nothing truncated


# ---- resume checks the data ------------------------------------------------------------------------

def test_resuming_on_other_data_is_refused_naming_the_difference(tmp_path, corpus, monkeypatch):
    with monkeypatch.context() as patch:
        _interrupt_at_step(patch, 6)
        with pytest.raises(_Interrupt):
            train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)
    other = load_corpus("synthetic", n_chars=30_000, seed=1)
    with pytest.raises(ValueError, match=r"data\.sha256: saved '[0-9a-f]{64}', given '[0-9a-f]{64}'"):
        train(preset("tiny", "gqa"), TINY, other, out=tmp_path / "run", resume=True, progress=False)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["sha256"] == corpus.sha256


# ---- text corpora ------------------------------------------------------------------------------------


def test_10_divergence_before_any_checkpoint_does_not_claim_one(tmp_path, corpus, monkeypatch):
    original = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, idx, targets=None, cache=None, loss_only=False: (
        original(self, idx, targets, cache, loss_only=True) * float("nan") if loss_only
        else (lambda out: (out[0], out[1] * float("nan")))(original(self, idx, targets, cache))))
    with pytest.raises(TrainingDiverged, match="loss is nan at step 0; no checkpoint was written before it"):
        train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", progress=False)



# ---- faults at any instant -----------------------------------------------------------------------------------

EVERY_STEP = TINY.replace(checkpoint_every=1)
CHILD_STALL_S = 60  # seconds a killed-at-random trainer may go without an fsync


@needs_fork
def test_random_kills_at_any_instant_resume_to_identical_weights(tmp_path, corpus):
    """SIGKILL a checkpoint-every-step run and resume it, again and again: the result equals an
    uninterrupted run. Every other kill comes at a random instant (the fsyncs slowed, so many land
    inside a write); the others at the child's n-th fsync for a random n, inside a write (the
    resume's or a checkpoint's) however fast or slow the machine."""
    reference = train(preset("tiny", "gqa"), EVERY_STEP, corpus, out=tmp_path / "ref", progress=False)
    folder, rng = tmp_path / "run", random.Random(0)

    def slow_trainer(writing):
        real_fsync = os.fsync

        def told_and_slow_fsync(fd):  # every fsync: files, folders, manifest.json
            with contextlib.suppress(OSError):  # the parent stopped listening (EPIPE)
                os.write(writing, b"f")
            time.sleep(0.002)
            real_fsync(fd)

        os.fsync = told_and_slow_fsync
        train(preset("tiny", "gqa"), EVERY_STEP, corpus, out=folder, resume=True, progress=False)

    def has_leftovers() -> bool:
        if not (folder / "manifest.json").exists() or (checkpoint := current_checkpoint(folder)) is None:
            return False
        current = checkpoint.name
        return any(p.name.startswith(".") and p.name != ".lock"
                   or p.name.startswith("checkpoint-") and p.name != current for p in folder.iterdir())

    kills = leftovers = 0
    for attempt in range(200):
        listening, writing = os.pipe()
        pid = _fork(lambda: slow_trainer(writing))
        os.close(writing)
        if attempt % 2:
            for _ in range(rng.randint(1, 60)):  # a checkpoint takes about 25 fsyncs
                if not select.select([listening], [], [], CHILD_STALL_S)[0]:  # never wait on a hung child forever
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    pytest.fail(f"a resumed trainer went {CHILD_STALL_S} s without an fsync (attempt {attempt})")
                if not os.read(listening, 1):  # the child ended
                    break
        else:
            time.sleep(rng.uniform(0.0, 0.05 + 0.01 * attempt))
        os.close(listening)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0, _child_error(pid)
            break
        kills += 1
        leftovers += has_leftovers()
    assert kills >= 8, kills
    assert leftovers >= 1  # some kills did land inside a checkpoint write
    assert not [p for p in folder.iterdir() if p.name.startswith(".") and p.name != ".lock"]
    loaded = load_run(folder)
    for name, tensor in reference.model.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[name]), name
    assert _strip(read_metrics(folder / "metrics.jsonl")) == _strip(reference.metrics)


def test_a_run_without_a_progress_bar_never_takes_tqdms_lock(tmp_path, corpus, monkeypatch):
    """tqdm's lock is a semaphore shared across fork: a forked trainer SIGKILLed while holding it
    (the test above kills them at random instants) would freeze every later bar of its parent."""
    def no_tqdm(*args, **kwargs):
        raise AssertionError("a run with progress=False created a tqdm bar")

    monkeypatch.setattr(sys.modules["headlab.training.trainer"], "tqdm", no_tqdm)
    train(preset("tiny", "gqa"), TINY.replace(steps=2), corpus, out=tmp_path / "run", progress=False)
    with pytest.raises(AssertionError, match="created a tqdm bar"):
        train(preset("tiny", "gqa"), TINY.replace(steps=2), corpus, out=tmp_path / "shown", progress=True)


def test_a_full_disk_at_each_write_of_a_checkpoint_leaves_a_resumable_run(tmp_path, corpus, reference, monkeypatch):
    """ENOSPC (simulated) at the 1st, 2nd, ... write operation of the second checkpoint, each
    after half the bytes: every time the run resumes to the uninterrupted result."""
    def failing(real, counter, fail_at, half_written=False):
        def call(*args, **kwargs):
            if counter["saving"] and counter["saves"] == 2:  # only the second checkpoint's writes count
                counter["n"] += 1
                if counter["n"] == fail_at:
                    if half_written:  # os.write(fd, data): write half, then run out of space
                        real(args[0], args[1][:len(args[1]) // 2])
                    _full_disk()
            return real(*args, **kwargs)
        return call

    fail_at = 1
    while True:
        folder = tmp_path / f"fail-{fail_at}"
        counter = {"n": 0, "saves": 0, "saving": False}
        real_save_checkpoint = headlab.runs.checkpoints.save_checkpoint

        def counting_the_second(*args, **kwargs):
            counter["saves"], counter["saving"] = counter["saves"] + 1, True
            try:
                return real_save_checkpoint(*args, **kwargs)
            finally:
                counter["saving"] = False

        with monkeypatch.context() as patch:
            patch.setattr(sys.modules["headlab.runs.folder"], "save_checkpoint", counting_the_second)
            patch.setattr(os, "write", failing(os.write, counter, fail_at, half_written=True))
            patch.setattr(os, "replace", failing(os.replace, counter, fail_at))
            patch.setattr(os, "mkdir", failing(os.mkdir, counter, fail_at))
            try:
                train(preset("tiny", "gqa"), TINY, corpus, out=folder, progress=False)
                break  # the second checkpoint has fewer than fail_at writes: every one has failed once
            except Exception as error:
                assert "No space left on device" in str(error), error
        train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=True, progress=False)
        _assert_same_run(folder, reference)
        fail_at += 1
    assert fail_at > 4  # state.pt, model.safetensors, the folder, and the manifest (before and after)


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="mounting a tmpfs needs root on Linux")
@pytest.mark.parametrize("kib", [450, 700, 950])
def test_a_real_full_tmpfs_stops_the_run_cleanly_and_it_resumes_elsewhere(tmp_path, corpus, reference, kib):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(Exception) as failure:
            train(preset("tiny", "gqa"), TINY, corpus, out=mount / "run", progress=False)
        assert "No space left on device" in str(failure.value), failure.value
        del failure
        shutil.copytree(mount / "run", tmp_path / "run")  # space freed: the folder moved to a roomier disk
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)
    train(preset("tiny", "gqa"), TINY, corpus, out=tmp_path / "run", resume=True, progress=False)
    _assert_same_run(tmp_path / "run", reference)


def test_run_files_are_readable_by_others(tmp_path, corpus):
    train(preset("tiny", "gqa"), TINY.replace(steps=4), corpus, out=tmp_path / "run", progress=False)
    umask = os.umask(0)
    os.umask(umask)
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
    assert math.isfinite(load_run(tmp_path / "run").final_val_loss)



def test_a_file_system_without_flock_gets_one_line_saying_so(tmp_path, monkeypatch, capsys):
    """Lustre mounted without -o flock answers flock with ENOSYS: training there stops in one
    line naming the cause and the way out (not "[Errno 38] Function not implemented"), and no
    folder there counts as being written."""
    import fcntl

    from headlab.io.locks import being_written

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    assert main(["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "1", "--out",
                 str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "without flock (e.g. Lustre mounted without -o flock)" in lines[0], lines
    assert not being_written(tmp_path / "run")
