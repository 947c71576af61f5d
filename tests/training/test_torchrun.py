"""The job under torchrun as a user launches it (2 gloo processes on the CPU): one rank's failure
ends every process with one clear line, and each rank picks its own GPU (CUDA stubbed); and the
study that torchrun trained (the `torchrun_study` fixture), rerun on two ranks, reuses every run.
"""

import contextlib
import gc
import io
import json
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from headlab import GPT, preset
from headlab.cli.main import main
from headlab.data.corpus import load_corpus
from headlab.io import FolderLock, Manifest
from headlab.runs.layout import STARTS
from headlab.training import distributed
from headlab.training.config import train_preset
from headlab.training.distributed import join_process_group, training_device
from headlab.training.trainer import prepared_corpus, train
from ranks import on_ranks
from shared_fixtures import TORCHRUN_STUDY, TORCHRUN_VARIANTS, torchrun_headlab

ROOT = Path(__file__).resolve().parents[2]
# What the failure tests allow two ranks to start, fail and end: a hang would last the group's 30-minute
# timeout; cold imports of a fresh torch on a loaded two-core machine took more than 60 s (torch 2.11).
RANKS_START_AND_END = 180


def _saved(runs: Path) -> dict:
    """What a rerun must leave untouched: each run's checkpoint files and metrics, byte for byte."""
    return {(run.name, str(path.relative_to(run))): path.read_bytes() for run in sorted(runs.iterdir())
            for path in sorted([run / "metrics.jsonl", *run.glob("checkpoint-*/*")])}


def _rerun(cwd: Path) -> tuple[int, str]:
    """`headlab TORCHRUN_STUDY --out study` in `cwd` on this rank: its exit status and what it printed."""
    os.chdir(cwd)  # a forked rank's own working directory
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main([*TORCHRUN_STUDY, "--out", "study"])
    return status, printed.getvalue()


@pytest.mark.slow
def test_a_finished_study_rerun_on_two_ranks_reuses_every_run(torchrun_study):
    """The rerun's two ranks are forked with torchrun's environment (`on_ranks`): a third torchrun
    launch would import torch and headlab in three processes again (~8 CPU-s) to show what the
    fixture's launch and the failure tests below show of torchrun itself."""
    cwd, first = torchrun_study
    assert first.returncode == 0, first.stderr[-3000:]
    runs = cwd / "study" / "runs"
    saved = _saved(runs)
    (status, on_main), (other_status, on_other) = on_ranks(lambda rank: _rerun(cwd), timeout=240)
    assert status == other_status == 0
    assert on_main.count("report written:") == 1 and "report written:" not in on_other
    assert len([line for line in first.stdout.splitlines() if "validation loss" in line]) == len(TORCHRUN_VARIANTS)
    assert f"{len(TORCHRUN_VARIANTS)} finished run(s) in" in on_main
    assert "validation loss" not in on_main + on_other  # one line, not one per run
    assert _saved(runs) == saved  # nothing retrained, no checkpoint rewritten
    for run in runs.iterdir():  # every start is recorded: trained at step 0, reused at step 4
        starts = [json.loads(line) for line in (run / STARTS).read_text().splitlines()]
        assert [(s["step"], s["processes"], s["changed"]) for s in starts] == [(0, 2, {}), (4, 2, {})]


@pytest.mark.slow
def test_one_rank_failing_ends_every_process_with_one_line(tmp_path):
    """Rank 0 cannot lock a run folder (another trainer holds it) while rank 1 would train: both
    processes exit with status 2 within minutes (not the group's 30-minute timeout), and the error is
    printed once."""
    (tmp_path / "study").mkdir()
    Manifest.claim(tmp_path / "study", "study.json", "a study folder")  # a study headlab began
    folder = tmp_path / "study" / "runs" / "standard-mha-seed0"
    folder.mkdir(parents=True)
    with FolderLock(folder, "trainer"):
        failed = torchrun_headlab(tmp_path, [*TORCHRUN_STUDY, "--out", "study"], timeout=RANKS_START_AND_END)
    assert failed.returncode != 0
    errors = [line for line in failed.stderr.splitlines() if line.startswith("headlab: error")]
    assert len(errors) == 1 and errors[0].startswith(f"headlab: error: {folder.relative_to(tmp_path)} is being "
                                                     "written by another trainer"), failed.stderr[-3000:]
    assert failed.stderr.count("exitcode  : 2") == 2  # torchrun's summary: each rank ended by itself, status 2
    assert failed.stderr.count("Traceback") == 1  # torchrun's own ChildFailedError; none from the ranks


def _stub_gpus(monkeypatch, count: int) -> list:
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_each_rank_trains_on_the_gpu_of_its_local_rank(monkeypatch):
    _stub_gpus(monkeypatch, 8)
    assert training_device("cuda", 3) == torch.device("cuda", 3)
    assert training_device("auto", 5) == torch.device("cuda", 5)
    assert training_device("cuda:1", 3) == torch.device("cuda", 1)  # an explicit index is kept
    assert training_device("cpu", 3) == torch.device("cpu")
    with pytest.raises(ValueError, match="has 8 GPU"):
        training_device("cuda", 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_device("auto", 3) == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device"):
        training_device("cuda", 0)


def test_joining_the_group_makes_the_ranks_gpu_current_before_nccl_starts(monkeypatch):
    chosen = _stub_gpus(monkeypatch, 8)
    joined = {}

    def init_process_group(**options):
        joined.update(options, current=list(chosen))

    monkeypatch.setenv("WORLD_SIZE", "16"), monkeypatch.setenv("RANK", "11"), monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "get_rank", lambda: 11)
    monkeypatch.setattr(dist, "get_world_size", lambda: 16)
    monkeypatch.setattr(distributed.atexit, "register", lambda function: None)
    processes = join_process_group(training_device("cuda", 3))
    assert (processes.rank, processes.world_size, processes.local_rank) == (11, 16, 3)
    assert joined["current"] == [torch.device("cuda", 3)]  # set before the group (NCCL) starts
    assert joined["device_id"] == torch.device("cuda", 3) and "nccl" in joined["backend"]


def test_a_run_resumes_under_other_execution_settings_and_records_what_changed(tmp_path, monkeypatch):
    """--compile, --device and the thread count (--jobs) do not change what is trained: the run
    resumes, and starts.jsonl says what changed."""
    config = train_preset("tiny", steps=4, eval_every=2, checkpoint_every=2, compile="auto")
    train(preset("tiny", "mha"), config, "synthetic", out=tmp_path / "run", progress=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    run = train(preset("tiny", "mha"), config.replace(compile="off", device="cpu"), "synthetic", out=tmp_path / "run",
                resume=True, progress=False)
    assert run.final_val_loss is not None
    starts = [json.loads(line) for line in (tmp_path / "run" / STARTS).read_text().splitlines()]
    assert [s["step"] for s in starts] == [0, 4]
    assert starts[1]["changed"] == {"threads": [starts[0]["threads"], 7], "compile": ["auto", "off"]}


# train() called from a script under torchrun, as an API user would: "buckets" trains a tiny DDP
# run and rank 0 prints whether every gradient it ends with is a view into DDP's buckets; "raise"
# makes rank 1 raise inside its second training forward while rank 0 goes on into the all-reduce;
# "fsdp-study" trains a two-variant FSDP study with the cyclic collector off, and each rank prints
# how many models were alive before each run and after the last.
API_SCRIPT = """
import json, os, sys
from headlab import GPT, preset
from headlab.data.corpus import load_corpus
from headlab.training.config import train_preset
from headlab.training.trainer import prepared_corpus, train

mode, rank = sys.argv[1], int(os.environ["RANK"])
open(f"rank{rank}.pid", "w").write(str(os.getpid()))  # torchrun starts each worker in a session of its own
if mode == "raise" and rank == 1:
    forward, calls = GPT.forward, [0]

    def failing_forward(self, *args, **kwargs):
        calls[0] += self.training
        if calls[0] == 2:
            raise RuntimeError("rank 1 fails inside train()")
        return forward(self, *args, **kwargs)

    GPT.forward = failing_forward
corpus = prepared_corpus(lambda: load_corpus("synthetic"), "cpu")
train(preset("tiny", "mha"), train_preset("tiny", steps=3, eval_every=3, device="cpu"), corpus, progress=False)
"""


def _children(pid: int) -> list[int]:
    """The processes `pid` started that are still alive (Linux)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _torchrun_script(tmp_path, args, timeout):
    (tmp_path / "api.py").write_text(API_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HEADLAB_CACHE": str(tmp_path / "cache")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(tmp_path / "api.py"), *args]
    child = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # no rank may outlive the test (nor hold its pipes open)
        ranks = [int(path.read_text()) for path in tmp_path.glob("rank*.pid")] + _children(child.pid)
        for pid in ranks + [child.pid]:  # a rank still importing has written no pid file yet
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.communicate()
        pytest.fail(f"the 2 processes were still running after {timeout} s")
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


def _bucket_views(rank: int) -> list[bool]:
    """On a forked rank (`on_ranks`): DDP-train the tiny MHA for 3 steps; whether each parameter's
    gradient is a view into another tensor (DDP's bucket)."""
    corpus = prepared_corpus(lambda: load_corpus("synthetic"), "cpu")
    run = train(preset("tiny", "mha"), train_preset("tiny", steps=3, eval_every=3, device="cpu"), corpus,
                progress=False)
    return [p.grad is not None and p.grad._base is not None for p in run.model.parameters()] if rank == 0 else []


def test_ddp_gradients_are_views_into_its_buckets(own_cache):
    """gradient_as_bucket_view=True with gradients zeroed in place: DDP keeps one copy of the
    gradients (its buckets), not a second 4 B per parameter."""
    views, _ = on_ranks(_bucket_views, timeout=240)
    assert views and all(views)


def _models_alive_before_each_run(rank: int) -> tuple[int, list[int]]:
    """On a forked rank with Python's cyclic collector off: an FSDP study of two tiny variants; how
    many models this rank built, and how many of them are alive as each run starts and after the last."""
    from headlab.study import study as study_module

    built, alive, init, train_run = [], [], GPT.__init__, study_module.train

    def recorded_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not self.lm_head.weight.is_meta:  # weights, not the study's meta-device probe of its settings
            built.append(weakref.ref(self))  # (on torch 2.11-2.13 the first meta model outlives a gc-off run)

    def counted_train(*args, **kwargs):
        alive.append(sum(model() is not None for model in built))
        return train_run(*args, **kwargs)

    GPT.__init__, study_module.train = recorded_init, counted_train  # in this forked rank only
    gc.disable()
    study_module.Study("tiny", 2, "study", corpus="synthetic", only=("mha", "mqa"),
                       train_overrides={"parallel": "fsdp"}).train(progress=False, log=lambda line: None)
    return len(built), alive + [sum(model() is not None for model in built)]


def test_an_fsdp_study_frees_each_run_on_every_rank_without_waiting_for_the_collector(own_cache, tmp_path,
                                                                                       monkeypatch):
    """An FSDP-sharded model and its FSDP state refer to each other: with Python's cyclic
    collector off, each run's shards (and rank 0's gathered model) must still be gone before the
    next run builds its model, and after the last run, on both ranks."""
    monkeypatch.chdir(tmp_path)
    for built, alive in on_ranks(_models_alive_before_each_run, timeout=240):
        assert built >= 2 and alive == [0, 0, 0], (built, alive)


@pytest.mark.slow
def test_a_rank_raising_inside_train_ends_both_processes_long_before_the_group_timeout(tmp_path):
    """Rank 1 raises inside train() while rank 0 waits in the gradient all-reduce: rank 1 must not
    then wait in the exit barrier (a hang until the group's 30-minute timeout); its exit lets
    torchrun stop rank 0."""
    done = _torchrun_script(tmp_path, ["raise"], timeout=RANKS_START_AND_END)
    assert done.returncode != 0
    assert "rank 1 fails inside train()" in done.stderr


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
def test_after_fsdp_rank_0_gets_the_whole_model_on_its_own_device_not_the_cpu(monkeypatch):
    """The gathered FSDP weights become a plain model on the rank's training device (the meta
    device stands in for cuda:LOCAL_RANK here), so what analyses it next runs there; other ranks get None."""
    from headlab.training import trainer
    from headlab.training.processes import Processes

    config = preset("tiny", "mha")
    trained = GPT(config)
    monkeypatch.setattr(trainer, "gather_training_state", lambda model, optimizers: (trained.state_dict(), []))
    whole = trainer._whole_model_on_main(trained, config, Processes(0, 2, 0), torch.device("meta"))
    assert {p.device.type for p in whole.parameters()} == {"meta"}
    assert trainer._whole_model_on_main(trained, config, Processes(1, 2, 1), torch.device("meta")) is None


def test_a_task_given_its_own_gpu_trains_on_it_whatever_its_local_rank(monkeypatch):
    """Under SLURM with one GPU per task, each task sees one GPU (cuda:0) while LOCAL_RANK counts
    the node's tasks; torchrun's several processes on a one-GPU view are still refused."""
    _stub_gpus(monkeypatch, 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert training_device("cuda", 3) == training_device("auto", 3) == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="has 1 GPU"):
        training_device("cuda", 3)
