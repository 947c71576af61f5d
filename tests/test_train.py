"""The trainer: every family learns, runs resume exactly, bad files and NaNs are caught, DDP."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import headlab
from headlab import ATTENTION_FAMILIES, TrainConfig, TrainingDiverged, load_corpus, load_run, preset, train, train_preset
from headlab.model import GPT
from headlab.runs import read_metrics

TINY_TRAIN = train_preset("tiny")


@pytest.fixture(scope="module")
def synthetic():
    return load_corpus("synthetic")


@pytest.mark.parametrize("attention", ATTENTION_FAMILIES)
def test_every_family_learns_the_synthetic_corpus(attention, synthetic):
    run = train(preset("tiny", attention), TINY_TRAIN, synthetic, progress=False)
    losses = [r["train_loss"] for r in run.metrics if "train_loss" in r]
    assert losses[-1] < losses[0] - 1.5
    assert run.final_val_loss < math.log(256) - 2.0  # far below the uniform-guess loss


def test_run_folder_holds_the_documented_files_and_loads_back(tmp_path, synthetic):
    run = train(preset("tiny", "lrkv"), TINY_TRAIN, synthetic, out=tmp_path / "run", progress=False)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json", "metrics.jsonl", "model.safetensors", "state.pt"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["attention"] == "lrkv" and config["headlab_version"] == headlab.__version__
    assert config["train"]["steps"] == TINY_TRAIN.steps and config["data"]["name"] == "synthetic"
    loaded = load_run(tmp_path / "run")
    assert loaded.model_config == run.model_config and loaded.train_config == TINY_TRAIN
    assert loaded.metrics == run.metrics
    tokens = torch.randint(0, 256, (2, 16))
    assert torch.equal(loaded.model(tokens)[0], run.model(tokens)[0])


class _Interrupt(Exception):
    pass


def _fail_at_step(monkeypatch, step_to_fail: int, make_nan: bool = False):
    """Make GPT.forward misbehave on its `step_to_fail`-th training call (0-based)."""
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, cache=None):
        logits, loss = original(self, idx, targets, cache)
        if self.training:
            if calls["n"] == step_to_fail:
                if not make_nan:
                    raise _Interrupt
                loss = loss * float("nan")
            calls["n"] += 1
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def test_interrupted_run_resumes_to_the_uninterrupted_loss_curve(tmp_path, synthetic, monkeypatch):
    config = preset("tiny", "gqa")
    reference = train(config, TINY_TRAIN, synthetic, out=tmp_path / "a", progress=False)
    with monkeypatch.context() as patch:
        _fail_at_step(patch, 27)
        with pytest.raises(_Interrupt):
            train(config, TINY_TRAIN, synthetic, out=tmp_path / "b", progress=False)
    assert max(r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")) == 25  # logged past the checkpoint
    resumed = train(config, TINY_TRAIN, synthetic, out=tmp_path / "b", resume=True, progress=False)
    strip = lambda records: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in records]
    assert strip(resumed.metrics) == strip(reference.metrics)  # exactly equal, every step
    assert strip(load_run(tmp_path / "b").metrics) == strip(reference.metrics)
    for name, p in reference.model.state_dict().items():
        assert torch.equal(p, resumed.model.state_dict()[name])


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, synthetic, monkeypatch):
    _fail_at_step(monkeypatch, 25, make_nan=True)
    with pytest.raises(TrainingDiverged, match="loss is nan at step 25"):
        train(preset("tiny", "mha"), TINY_TRAIN, synthetic, out=tmp_path / "run", progress=False)
    kept = load_run(tmp_path / "run")
    assert kept.step == 20  # the checkpoint before the NaN (checkpoint_every = 20)
    assert all(torch.isfinite(p).all() for p in kept.model.parameters())


def test_existing_run_is_not_overwritten(tmp_path, synthetic):
    train(preset("tiny", "mqa"), TINY_TRAIN.replace(steps=5), synthetic, out=tmp_path / "run", progress=False)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(preset("tiny", "mqa"), TINY_TRAIN.replace(steps=5), synthetic, out=tmp_path / "run", progress=False)


@pytest.fixture
def finished_run(tmp_path, synthetic):
    train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5), synthetic, out=tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_truncated_weights_are_refused_naming_the_file(finished_run):
    path = finished_run / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        load_run(finished_run)


def test_truncated_state_is_refused_on_resume_naming_the_file(finished_run, synthetic):
    path = finished_run / "state.pt"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"state\.pt is not a readable headlab training state"):
        train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5), synthetic, out=finished_run, resume=True, progress=False)


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_foreign_pickles_are_never_unpickled(finished_run, synthetic):
    torch.save({"step": 5, "optimizers": [], "generator": Payload()}, finished_run / "state.pt")
    with pytest.raises(ValueError, match=r"state\.pt is not a readable headlab training state.*Unpickl"):
        train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5), synthetic, out=finished_run, resume=True, progress=False)


def test_foreign_safetensors_and_configs_are_refused(finished_run, tmp_path):
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, str(finished_run / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.safetensors was not written by headlab"):
        load_run(finished_run)
    (finished_run / "config.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match=r"config\.json is not a headlab run config"):
        load_run(finished_run)


def test_resuming_with_a_different_config_is_refused(finished_run, synthetic):
    with pytest.raises(ValueError, match="changed TrainConfig \\(lr\\)"):
        train(preset("tiny", "mla"), TINY_TRAIN.replace(steps=5, lr=1e-2), synthetic, out=finished_run, resume=True, progress=False)


@pytest.mark.parametrize("field,value,allowed", [
    ("optimizer", "sgd", "adamw, muon"), ("dtype", "float16", "float32, bfloat16"), ("steps", 0, "positive"),
    ("lr", -1.0, "positive"), ("min_lr_ratio", 2.0, "[0, 1]")])
def test_bad_train_config_values_name_the_field(field, value, allowed):
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field} = .* is invalid: .*{allowed.replace('[', '.').replace(']', '.')}"):
        TrainConfig(**{field: value})


def test_muon_split_trains_and_routes_lrkv_3d_factors_to_adamw(synthetic):
    run = train(preset("tiny", "lrkv"), TINY_TRAIN.replace(optimizer="muon"), synthetic, progress=False)
    losses = [r["train_loss"] for r in run.metrics if "train_loss" in r]
    assert losses[-1] < losses[0] - 1.0


def test_two_process_gloo_run_follows_the_single_process_curve(tmp_path, synthetic):
    args = ["-m", "headlab", "train", "--preset", "tiny", "--attention", "gqa", "--corpus", "synthetic",
            "--steps", "12", "--log-every", "1", "--eval-every", "6", "--device", "cpu", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "one")], env=env, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr
    double = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517",
                             *args, "--out", str(tmp_path / "two")], env=env, capture_output=True, text=True)
    assert double.returncode == 0, double.stderr[-3000:]
    one, two = load_run(tmp_path / "one").metrics, load_run(tmp_path / "two").metrics
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        key = "train_loss" if "train_loss" in a else "val_loss"
        assert abs(a[key] - b[key]) <= 1e-4 * abs(a[key]), (a, b)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is Linux-only")
def test_keeping_freed_cpu_memory_stops_training_steps_page_faulting():
    # A fresh interpreter, as the default allocator settings are process-wide.
    script = """
import resource, torch
from headlab import preset
from headlab.model import GPT
from headlab.train import keep_freed_cpu_memory
torch.set_num_threads(1)
model = GPT(preset("cpu-small"))
idx = torch.randint(0, 256, (16, 128))
def faults_per_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        model(idx, idx)[1].backward()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
faults_per_step()
default = sum(faults_per_step() for _ in range(3)) / 3  # some steps fault little, most thousands of times
assert keep_freed_cpu_memory()
# The heap takes a few steps to grow to the step's high-water mark; after that, no faults.
print(default, min(faults_per_step() for _ in range(5)))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    default, kept = map(float, out.split())
    assert default > 1000, default
    assert kept < default / 20 and kept <= 5, (default, kept)
